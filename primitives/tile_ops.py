"""The tile-language primitives that appear inside kernel bodies.

Each primitive has an abstract eval (with the ref effects JAX's state system needs) and a
discharge rule: the rule *is* the reference semantics of the op, used by ``interpret=True``
and as the test oracle. The compiler recognises these primitives by name in the traced jaxpr.

- ``jt_copy``: copy a region between two refs, casting to the destination dtype. Reads past
  the end of the source yield ``pad``; writes past the end of the destination are dropped.
  A start may be a vector of positions (``jt.gather``/``jt.scatter``).
- ``jt_gemm``: ``c += op(a) @ op(b)`` on regions of tiles, accumulated in ``c.dtype``
  (in float32 for a 16-bit float ``c``, rounded once).
- ``jt_atomic``: ``dst[region] = fn(dst[region], value)`` (add, max, min); the reference
  applies the updates of every block in turn, as the atomic updates of concurrent blocks
  amount to. Writes past the end of a global destination are dropped.
- ``jt_load_acquire``, ``jt_store_release``, ``jt_fence``: memory ordering between blocks.
  The reference runs blocks one after another, where every access is ordered: they are a
  plain read, a plain write and nothing.
- ``jt_print``: one line per block where its condition holds; the reference writes it from a
  ``jax.debug.callback`` (as ``jax.debug.print`` does), in the text every backend prints.
- ``jt_loop_info``: an identity on a loop index that tells the compiler the loop's kind.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import ad, batching, mlir

from jaxtile.compiler import jax_internals as ji
from jaxtile.compiler import print_format, semantics
from jaxtile.compiler import tile_primitives as tp

copy_p = ji.Primitive(tp.COPY)
copy_p.multiple_results = True
gemm_p = ji.Primitive(tp.GEMM)
gemm_p.multiple_results = True
loop_info_p = ji.Primitive(tp.LOOP_INFO)
atomic_p = ji.Primitive(tp.ATOMIC)
atomic_p.multiple_results = True


def _tile_shape(sizes: tuple[int | None, ...]) -> tuple[int, ...]:
    return tuple(s for s in sizes if s is not None)


def _copy_abstract_eval(src, dst, *starts, src_sizes, dst_sizes, pad):
    del src, dst, starts, src_sizes, dst_sizes, pad
    return [], {ji.ReadEffect(0), ji.WriteEffect(1)}


def _region_indices(starts, sizes, shape):
    """Open-mesh index arrays of a region, and a mask of the in-bounds positions. A start is
    a scalar (positions ``start + i``) or a vector of ``size`` positions (a gather or
    scatter dimension)."""
    idx, valid = [], []
    for d, (start, size) in enumerate(zip(starts, sizes)):
        n = 1 if size is None else size
        mesh_shape = [1] * len(sizes)
        mesh_shape[d] = n
        start = jnp.asarray(start, jnp.int32)
        i = (start if start.ndim else start + lax.iota(jnp.int32, n)).reshape(mesh_shape)
        idx.append(i)
        valid.append((i >= 0) & (i < shape[d]))
    mask = valid[0]
    for v in valid[1:]:
        mask = mask & v
    return idx, mask


def copy_reference(src_val, dst_val, src_starts, dst_starts, src_sizes, dst_sizes, pad):
    """Reference semantics of ``jt_copy`` on array values; returns the new destination."""
    if dst_val.size == 0:  # every write is past the end (and scatter needs an element)
        return dst_val
    sidx, smask = _region_indices(src_starts, src_sizes, src_val.shape)
    pad_value = jnp.asarray(0 if pad is None else pad, src_val.dtype)
    if src_val.size == 0:  # nothing is in bounds (and nothing could be gathered)
        tile = jnp.broadcast_to(pad_value, smask.shape)
    else:
        safe = [jnp.clip(i, 0, n - 1) for i, n in zip(sidx, src_val.shape)]
        tile = jnp.where(smask, src_val[tuple(safe)], pad_value)
    tile = tile.reshape(_tile_shape(src_sizes)).astype(dst_val.dtype)
    didx, dmask = _region_indices(dst_starts, dst_sizes, dst_val.shape)
    # Out-of-bounds positions go to index `dim`, which scatter's mode="drop" discards
    # (negative indices would wrap instead).
    dropped = [jnp.where(dmask, i, n) for i, n in zip(didx, dst_val.shape)]
    mesh_shape = tuple(1 if s is None else s for s in dst_sizes)
    return dst_val.at[tuple(dropped)].set(tile.reshape(mesh_shape), mode="drop")


@ji.register_discharge_rule(copy_p)
def _copy_discharge(in_avals, out_avals, src, dst, *starts, src_sizes, dst_sizes, pad):
    del in_avals, out_avals
    n = len(src_sizes)
    new_dst = copy_reference(src, dst, starts[:n], starts[n:], src_sizes, dst_sizes, pad)
    return [None, new_dst] + [None] * len(starts), []


def _gemm_abstract_eval(a, b, c, *starts, a_sizes, b_sizes, c_sizes, transpose_a,
                        transpose_b):
    del a, b, c, starts, a_sizes, b_sizes, c_sizes, transpose_a, transpose_b
    return [], {ji.ReadEffect(0), ji.ReadEffect(1), ji.ReadEffect(2), ji.WriteEffect(2)}


def gemm_reference(a, b, c, transpose_a: bool, transpose_b: bool):
    """Reference semantics of ``jt_gemm`` on tiles: ``c + op(a) @ op(b)`` accumulated in
    c's dtype, or in float32 for a float16/bfloat16 ``c``, rounded once into c's dtype."""
    a = a.T if transpose_a else a
    b = b.T if transpose_b else b
    wide = semantics.compute_dtype(c.dtype)
    prod = jnp.matmul(a, b, preferred_element_type=wide, precision=lax.Precision.HIGHEST)
    return (c.astype(wide) + prod).astype(c.dtype)


def _tile(x, starts, sizes):
    """The tile of ``x`` a region selects (starts clamped into range, as ``get`` does)."""
    full = lax.dynamic_slice(x, starts, [1 if s is None else s for s in sizes])
    return full.reshape(_tile_shape(sizes))


@ji.register_discharge_rule(gemm_p)
def _gemm_discharge(in_avals, out_avals, a, b, c, *starts, a_sizes, b_sizes, c_sizes,
                    transpose_a, transpose_b):
    del in_avals, out_avals
    starts = [jnp.asarray(s, jnp.int32) for s in starts]
    sa, sb = starts[:len(a_sizes)], starts[len(a_sizes):len(a_sizes) + len(b_sizes)]
    sc = starts[len(a_sizes) + len(b_sizes):]
    new = gemm_reference(_tile(a, sa, a_sizes), _tile(b, sb, b_sizes), _tile(c, sc, c_sizes),
                         transpose_a, transpose_b)
    shape = [1 if s is None else s for s in c_sizes]
    new_c = lax.dynamic_update_slice(c, new.reshape(shape).astype(c.dtype), sc)
    return [None, None, new_c] + [None] * len(starts), []


def _atomic_abstract_eval(dst, value, *starts, fn, sizes):
    del dst, value, starts, fn, sizes
    return [], {ji.ReadEffect(0), ji.WriteEffect(0)}


_ATOMIC_UPDATE = {"add": "add", "max": "max", "min": "min"}


@ji.register_discharge_rule(atomic_p)
def _atomic_discharge(in_avals, out_avals, dst, value, *starts, fn, sizes):
    del in_avals, out_avals
    if dst.size == 0:  # every update is past the end (and scatter needs an element)
        return [dst, None] + [None] * len(starts), []
    idx, mask = _region_indices(starts, sizes, dst.shape)
    dropped = [jnp.where(mask, i, n) for i, n in zip(idx, dst.shape)]
    mesh_shape = tuple(1 if s is None else s for s in sizes)
    update = value.astype(dst.dtype).reshape(mesh_shape)
    at = dst.at[tuple(dropped)]
    new_dst = getattr(at, _ATOMIC_UPDATE[fn])(update, mode="drop")
    return [new_dst, None] + [None] * len(starts), []


load_acquire_p = ji.Primitive(tp.LOAD_ACQUIRE)
store_release_p = ji.Primitive(tp.STORE_RELEASE)
store_release_p.multiple_results = True
fence_p = ji.Primitive(tp.FENCE)
fence_p.multiple_results = True


def _load_acquire_abstract_eval(src, *starts):
    del starts
    return ji.ShapedArray((), src.dtype), {ji.ReadEffect(0)}


def _store_release_abstract_eval(dst, value, *starts):
    del dst, value, starts
    return [], {ji.WriteEffect(0)}


def _fence_abstract_eval(*outputs):
    # It reads and writes every output: nothing moves across it, and it is never dropped.
    return [], {e for i in range(len(outputs)) for e in (ji.ReadEffect(i), ji.WriteEffect(i))}


def _element(x, starts):
    """The element of ``x`` at ``starts``, clamped into range as ``get`` clamps."""
    return _tile(x, [jnp.asarray(s, jnp.int32) for s in starts], [None] * len(starts))


@ji.register_discharge_rule(load_acquire_p)
def _load_acquire_discharge(in_avals, out_avals, src, *starts):
    del in_avals, out_avals
    return [None] * (1 + len(starts)), _element(src, starts)


@ji.register_discharge_rule(store_release_p)
def _store_release_discharge(in_avals, out_avals, dst, value, *starts):
    del in_avals, out_avals
    starts = [jnp.asarray(s, jnp.int32) for s in starts]
    new_dst = lax.dynamic_update_slice(dst, value.astype(dst.dtype).reshape((1,) * dst.ndim),
                                       starts)
    return [new_dst, None] + [None] * len(starts), []


@ji.register_discharge_rule(fence_p)
def _fence_discharge(in_avals, out_avals, *outputs):
    del in_avals, out_avals
    return [None] * len(outputs), []


ji.effectful_abstract_eval(load_acquire_p, _load_acquire_abstract_eval)
ji.effectful_abstract_eval(store_release_p, _store_release_abstract_eval)
ji.effectful_abstract_eval(fence_p, _fence_abstract_eval)
ji.effectful_abstract_eval(atomic_p, _atomic_abstract_eval)
ji.effectful_abstract_eval(copy_p, _copy_abstract_eval)
ji.effectful_abstract_eval(gemm_p, _gemm_abstract_eval)

print_p = ji.Primitive(tp.PRINT)
print_p.multiple_results = True


def _print_abstract_eval(when, *operands, text, tag):
    del when, operands, text, tag
    return [], {ji.debug_effect}


def _emit(text, tag, when, *operands):
    """Write the lines of the blocks whose condition holds (called from the callback; under
    ``vmap`` the operands carry the batch in front, one line per batch element)."""
    arrays = np.broadcast_arrays(np.asarray(when), *(np.asarray(x) for x in operands))
    for i in np.ndindex(arrays[0].shape):
        if arrays[0][i]:
            values = [a[i] for a in arrays[1:]]
            print(print_format.render(text, [int(v) for v in values[:tag]], values[tag:]),
                  flush=True)


def _print_lowered(when, *operands, text, tag):
    jax.debug.callback(functools.partial(_emit, text, tag), when, *operands)
    return []


def _print_batched(args, dims, *, text, tag):
    # The batch index joins the tag as a last grid axis, as in a compiled batched kernel
    # (an inner vmap's batching runs first: innermost level first). JAX marks an unbatched
    # operand with dimension None; those are broadcast.
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    args = [batching.bdim_at_front(x, d, size) for x, d in zip(args, dims)]
    # Every operand now has the batch in front of the same shape (an outer vmap's batch
    # comes in front of an inner one's), and so does the new index.
    args.insert(1 + tag, lax.broadcasted_iota(jnp.int32, args[0].shape, 0))
    return print_p.bind(*args, text=text, tag=tag + 1), []


def _print_jvp(primals, tangents, *, text, tag):
    del tangents
    return print_p.bind(*primals, text=text, tag=tag), []


ji.effectful_abstract_eval(print_p, _print_abstract_eval)
print_p.def_impl(lambda *args, text, tag: _emit(text, tag, *args) or [])
mlir.register_lowering(print_p, mlir.lower_fun(_print_lowered, multiple_results=True))
batching.primitive_batchers[print_p] = _print_batched
ad.primitive_jvps[print_p] = _print_jvp

loop_info_p.def_impl(lambda index, **_: index)
loop_info_p.def_abstract_eval(lambda index, **_: index)
mlir.register_lowering(loop_info_p, lambda ctx, index, **_: [index])
