"""The tile language: the ``jt.*`` functions used inside a ``@jt.kernel`` body.

Inside a body, kernel arguments and allocations are JAX refs: read them with ``x[...]`` or
``x[jt.ds(start, size), :]``, write with ``x[...] = value``, and take views with
``x.at[...]``. Values read from refs are JAX tracers, so ``jnp``/``lax`` work on them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxtile.compiler import ir
from jaxtile.compiler import jax_internals as ji
from jaxtile.primitives import tile_ops

from . import _trace


def empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """Declare a kernel output of ``shape`` and ``dtype`` in global memory; return it.

    Every element should be written by some block; elements left unwritten are undefined.
    """
    return _trace.current("jt.empty").allocate("global", shape, dtype)


def shared(shape: tuple[int, ...], dtype: Any) -> Any:
    """A tile in on-chip shared memory (LDS on AMD), visible to all threads of a block."""
    return _trace.current("jt.shared").allocate("shared", shape, dtype)


def fragment(shape: tuple[int, ...], dtype: Any) -> Any:
    """A block-wide register tile; the compiler splits it over the block's threads."""
    return _trace.current("jt.fragment").allocate("fragment", shape, dtype)


def local(shape: tuple[int, ...], dtype: Any) -> Any:
    """Per-thread scratch (expert use): each thread has its own copy."""
    return _trace.current("jt.local").allocate("local", shape, dtype)


def grid(*extents: int) -> Any:
    """Declare the launch grid (1 to 3 static extents) and return the block indices.

    ``bx, by = jt.grid(nx, ny)``; with a single extent the index itself is returned.
    """
    state = _trace.current("jt.grid")
    if state.grid is not None:
        raise state.error("jt.grid may be called only once per kernel")
    if not 1 <= len(extents) <= _trace.MAX_GRID_RANK:
        raise state.error(f"jt.grid takes 1 to {_trace.MAX_GRID_RANK} extents, got "
                          f"{len(extents)}")
    if not all(isinstance(e, int | np.integer) and e >= 0 for e in extents):
        raise state.error(f"jt.grid extents must be non-negative Python ints, got {extents}")
    state.grid = _trace.checked_grid(state, tuple(int(e) for e in extents))
    idx = state.block_indices[:len(extents)]
    return idx[0] if len(extents) == 1 else tuple(idx)


def cdiv(a: Any, b: Any) -> Any:
    """Ceiling division ``ceil(a / b)`` for ints or traced integer scalars."""
    return (a + b - 1) // b


def ds(start: Any, size: int) -> Any:
    """A dynamic slice ``[start, start + size)`` of one ref dimension; ``size`` is static."""
    return ji.Slice(start, size)


def _entry(state: Any, entry: Any, role: str) -> tuple[Any, int | None]:
    if isinstance(entry, ji.Slice):
        if entry.stride != 1 or not isinstance(entry.size, int):
            raise state.error(f"jt.copy: {role} slices must have stride 1 and static size")
        return entry.start, entry.size
    if jnp.shape(entry) != ():
        raise state.error(f"jt.copy: {role} indices must be scalars or slices")
    return entry, None


def _region(state: Any, x: Any, role: str) -> tuple[Any, list[Any], list[int | None], bool]:
    """``(base_ref, starts, sizes, is_origin)`` of a copy operand (see :func:`copy`).

    Views of views fold into one region of the base ref; the tile origin convention applies
    to the last view: it is an origin when all of *its* indices are scalars.
    """
    base, transforms = ji.flatten_ref(x)
    if not ji.is_ref(base):
        raise state.error(f"jt.copy: the {role} must be a ref (a kernel argument, a jt.empty/"
                          f"shared/fragment/local buffer or a .at[...] view), got "
                          f"{type(x).__name__}")
    if not all(isinstance(t, ji.NDIndexer) for t in transforms):
        raise state.error(f"jt.copy: unsupported view of the {role} (use .at[...] indexing)")
    levels = [[_entry(state, e, role) for e in t.indices] for t in transforms]
    dims = ir.compose_indices(levels, tuple(base.shape), lambda a, b: a + b)
    is_origin = bool(levels) and all(size is None for _, size in levels[-1])
    if is_origin:
        # The origin's own indices get their extent from the other operand; dims selected by
        # enclosing views (e.g. the batch index of a vmapped kernel) stay selected.
        free = len(levels[-1])
        selected = [d for d, (_, size) in enumerate(dims) if size is None]
        origin_dims = set(selected[len(selected) - free:])
        return (base, [s for s, _ in dims],
                [None if d not in origin_dims else "origin" for d in range(len(dims))], True)
    return base, [s for s, _ in dims], [z for _, z in dims], False


def _resolve_origin(state: Any, sizes: list, tile: tuple[int, ...], role: str) -> list:
    """Give the origin dims (marked ``"origin"``) the tile's extent: the last r of them take
    the tile's r dims, leading ones select a single index."""
    origin = [d for d, s in enumerate(sizes) if s == "origin"]
    if len(tile) > len(origin):
        raise state.error(f"jt.copy: the {role} origin has {len(origin)} indices but the tile "
                          f"{tile} has rank {len(tile)}")
    out = [None if s == "origin" else s for s in sizes]
    for d, extent in zip(origin[len(origin) - len(tile):], tile):
        out[d] = extent
    return out


def _start(state: Any, s: Any) -> Any:
    if isinstance(s, int | np.integer):
        return jnp.int32(int(s))
    if not jnp.issubdtype(jnp.result_type(s), jnp.integer):
        raise state.error(f"jt.copy: indices must be integers, got {jnp.result_type(s)}")
    return jnp.asarray(s, jnp.int32)


def _check_fits(state: Any, ref: Any, starts: list, sizes: list, role: str) -> None:
    """On-chip buffers have no edge semantics: a static region must fit inside them."""
    if state.scope_of(ref) == "global":
        return
    for d, (start, size, dim) in enumerate(zip(starts, sizes, ref.shape)):
        n = 1 if size is None else size
        start = ji.concrete_int(start)
        if start is not None and not 0 <= start <= dim - n:
            raise state.error(f"jt.copy: the {role} region [{start}, {start + n}) in dimension "
                              f"{d} does not fit the {state.scope_of(ref)} buffer of shape "
                              f"{tuple(ref.shape)}")


def copy(src: Any, dst: Any, *, pad: float | int | None = None) -> None:
    """Copy a tile from ``src`` to ``dst``, casting to ``dst``'s dtype.

    Either operand may be a whole ref, a view with slices (``x.at[jt.ds(i, 64), :]``) or a
    *tile origin*: a view whose indices are all scalars (``a.at[by * bm, k * bk]``), whose
    extent then comes from the other operand (its last r indices are the origin, leading
    ones select a single index). Reads past the end of a global tensor give ``pad``
    (default 0); writes past the end are dropped.

    >>> jt.copy(a.at[by * bm, k * bk], a_s)      # doctest: +SKIP
    """
    state = _trace.current("jt.copy")
    sref, sstarts, ssizes, sorigin = _region(state, src, "source")
    dref, dstarts, dsizes, dorigin = _region(state, dst, "destination")
    if sorigin and dorigin:
        raise state.error("jt.copy: both operands are tile origins (all-scalar indices); one "
                          "of them must give the tile extent")
    if sorigin:
        ssizes = _resolve_origin(state, ssizes, tuple(s for s in dsizes if s is not None),
                                 "source")
    elif dorigin:
        dsizes = _resolve_origin(state, dsizes, tuple(s for s in ssizes if s is not None),
                                 "destination")
    stile = tuple(s for s in ssizes if s is not None)
    dtile = tuple(s for s in dsizes if s is not None)
    if stile != dtile:
        raise state.error(f"jt.copy: shape mismatch: the source tile is {stile} but the "
                          f"destination tile is {dtile}")
    if pad is not None:
        if not isinstance(pad, int | float):
            raise state.error(f"jt.copy: pad must be a Python number, got {pad!r}")
        if not jnp.issubdtype(sref.dtype, jnp.floating) and not float(pad).is_integer():
            raise state.error(f"jt.copy: pad {pad} is not representable in {sref.dtype}")
    _check_fits(state, sref, sstarts, ssizes, "source")
    _check_fits(state, dref, dstarts, dsizes, "destination")
    starts = [_start(state, s) for s in sstarts + dstarts]
    tile_ops.copy_p.bind(sref, dref, *starts, src_sizes=tuple(ssizes),
                         dst_sizes=tuple(dsizes), pad=pad)


def gemm(a: Any, b: Any, c: Any, *, transpose_a: bool = False,
         transpose_b: bool = False) -> None:
    """Accumulate a matrix product into ``c``: ``c += op(a) @ op(b)``.

    ``a``, ``b`` and ``c`` are 2-D on-chip tiles (``jt.shared``/``jt.fragment``/``jt.local``);
    ``op`` transposes when asked. The product is accumulated in ``c.dtype``.
    """
    state = _trace.current("jt.gemm")
    for role, x in (("a", a), ("b", b), ("c", c)):
        if not ji.is_ref(x) or ji.flatten_ref(x)[1]:
            raise state.error(f"jt.gemm: operand {role} must be a whole tile ref, got "
                              f"{type(x).__name__}")
        if state.scope_of(x) == "global":
            raise state.error(f"jt.gemm: operand {role} is in global memory; copy it into a "
                              "jt.shared or jt.fragment tile first")
        if len(x.shape) != 2:
            raise state.error(f"jt.gemm: operand {role} must be 2-D, got shape {x.shape}")
    m, k = a.shape[::-1] if transpose_a else a.shape
    k2, n = b.shape[::-1] if transpose_b else b.shape
    if k != k2 or tuple(c.shape) != (m, n):
        raise state.error(f"jt.gemm: shape mismatch: a {tuple(a.shape)}"
                          f"{'.T' if transpose_a else ''} @ b {tuple(b.shape)}"
                          f"{'.T' if transpose_b else ''} cannot accumulate into c "
                          f"{tuple(c.shape)}")
    if a.dtype != b.dtype:
        raise state.error(f"jt.gemm: dtype mismatch: a is {a.dtype} but b is {b.dtype}")
    if jnp.issubdtype(a.dtype, jnp.floating) != jnp.issubdtype(c.dtype, jnp.floating):
        raise state.error(f"jt.gemm: cannot accumulate {a.dtype} products into {c.dtype}")
    tile_ops.gemm_p.bind(a, b, c, transpose_a=bool(transpose_a), transpose_b=bool(transpose_b))


def _run_loop(start: Any, stop: Any, body: Callable[[Any], Any], kind: str,
              stages: int) -> None:
    state = _trace.current(f"jt.{'pipelined' if kind == 'pipelined' else 'loop'}")

    def step(i, carry):
        result = body(tile_ops.loop_info_p.bind(i, kind=kind, stages=stages))
        if result is not None:
            raise state.error("a loop body must not return a value; write results to refs")
        return carry

    lax.fori_loop(start, stop, step, 0)


def loop(start: int, stop: int | None = None, *, unroll: bool = False) -> Callable:
    """Decorator: run the body for ``i`` in ``range(start, stop)`` on the device.

    >>> @jt.loop(n)                               # doctest: +SKIP
    ... def _(i):
    ...     acc[...] += x[jt.ds(i * 8, 8)]
    """
    if stop is None:
        start, stop = 0, start
    return lambda body: _run_loop(start, stop, body, "unrolled" if unroll else "serial", 1)


def pipelined(n: int, *, stages: int = 2) -> Callable:
    """Decorator: a loop over ``range(n)`` whose copies the compiler may software-pipeline
    ``stages`` deep (on the CPU it is a plain loop)."""
    if not isinstance(stages, int) or stages < 1:
        raise _trace.current("jt.pipelined").error(
            f"jt.pipelined: stages must be a positive int, got {stages!r}")
    return lambda body: _run_loop(0, n, body, "pipelined", stages)


def when(cond: Any) -> Callable:
    """Decorator: run the body only where the traced scalar ``cond`` is true."""
    def deco(body: Callable[[], Any]) -> None:
        state = _trace.current("jt.when")
        if isinstance(cond, bool | np.bool_):
            if cond:
                body()
            return
        if jnp.shape(cond) != ():
            raise state.error(f"jt.when: the condition must be a scalar, got shape "
                              f"{jnp.shape(cond)}")

        def branch():
            if body() is not None:
                raise state.error("a jt.when body must not return a value")

        lax.cond(jnp.asarray(cond, jnp.bool_), branch, lambda: None)
    return deco
