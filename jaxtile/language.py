"""The tile language: the ``jt.*`` functions used inside a ``@jt.kernel`` body.

Inside a body, kernel arguments and allocations are JAX refs: read them with ``x[...]`` or
``x[jt.ds(start, size), :]``, write with ``x[...] = value``, and take views with
``x.at[...]``. Values read from refs are JAX tracers, so ``jnp``/``lax`` work on them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, overload

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.typing import ArrayLike, DTypeLike

from jaxtile.compiler import ir, op_defs, print_format
from jaxtile.compiler import jax_internals as ji
from jaxtile.primitives import tile_ops

from . import _trace
from ._typing import Body, Index, LoopBody, Ref


def empty(shape: Sequence[int], dtype: DTypeLike) -> Ref:
    """Declare a kernel output of ``shape`` and ``dtype`` in global memory; return it.

    Every element should be written by some block; elements left unwritten are undefined.
    """
    return _trace.current("jt.empty").allocate("global", shape, dtype)


def shared(shape: Sequence[int], dtype: DTypeLike) -> Ref:
    """A tile in on-chip shared memory (LDS on AMD), visible to all threads of a block."""
    return _trace.current("jt.shared").allocate("shared", shape, dtype)


def fragment(shape: Sequence[int], dtype: DTypeLike) -> Ref:
    """A block-wide register tile; the compiler splits it over the block's threads."""
    return _trace.current("jt.fragment").allocate("fragment", shape, dtype)


def local(shape: Sequence[int], dtype: DTypeLike) -> Ref:
    """A small tile replicated in every thread of the block (expert use).

    Every thread holds the whole tile, so reading it costs no communication; a write must
    store the same values in every thread (values computed from block indices, loop
    counters, other local tiles or reductions), which is what the language can express.
    The reference semantics and the CPU keep one copy per block. Use it for per-block
    scalars and small tables (e.g. running maxima); use :func:`fragment` for tiles the
    compiler should split over threads."""
    return _trace.current("jt.local").allocate("local", shape, dtype)


def annotate_layout(ref: Ref, layout: str) -> None:
    """Pin a fragment's thread layout for the GPU lowering (expert use), in the form the
    IR prints: ``"blocked(vec 4)"`` (coalesced, ``vec`` contiguous elements per thread),
    ``"replicated"`` (every thread holds the whole tile), ``"mma(m16n8k16, warps 2x2)"``
    (the tensor-core accumulator) or a ``"factors(...)"`` map. Layout inference starts from
    it, as from a GEMM's accumulator, and converts where other ops disagree. No effect on
    the CPU or the reference semantics."""
    _trace.current("jt.annotate_layout").annotate(ref, layout)


@overload
def grid(nx: int, /) -> jax.Array: ...
@overload
def grid(nx: int, ny: int, /) -> tuple[jax.Array, jax.Array]: ...
@overload
def grid(nx: int, ny: int, nz: int, /) -> tuple[jax.Array, jax.Array, jax.Array]: ...
def grid(*extents: int) -> jax.Array | tuple[jax.Array, ...]:
    """Declare the launch grid (1 to 3 static extents) and return the block indices.

    ``bx, by = jt.grid(nx, ny)``; with a single extent the index itself is returned.
    """
    state = _trace.current("jt.grid")
    if state.grid is not None:
        raise state.error("jt.grid may be called only once per kernel")
    if not 1 <= len(extents) <= _trace.MAX_GRID_RANK:
        raise state.error(f"jt.grid takes 1 to {_trace.MAX_GRID_RANK} extents, got "
                          f"{len(extents)}")
    if not all((isinstance(e, int | np.integer) and e >= 0)
               or (state.symbolic and ji.is_symbolic_dim(e)) for e in extents):
        raise state.error(f"jt.grid extents must be non-negative Python ints (or expressions "
                          f"of dynamic sizes), got {extents}")
    state.grid = _trace.checked_grid(
        state, tuple(e if ji.is_symbolic_dim(e) else int(e) for e in extents))
    idx = state.block_indices[:len(extents)]
    return idx[0] if len(extents) == 1 else tuple(idx)


@overload
def cdiv(a: int, b: int) -> int: ...
@overload
def cdiv(a: Index, b: Index) -> Index: ...
def cdiv(a: Index, b: Index) -> Index:
    """Ceiling division ``ceil(a / b)`` for ints or traced integer scalars."""
    return (a + b - 1) // b


def ds(start: Index, size: int) -> ji.Slice:
    """A dynamic slice ``[start, start + size)`` of one ref dimension; ``size`` is static."""
    return ji.Slice(start, size)


def _entry(state: Any, entry: Any, role: str, op: str) -> tuple[Any, int | None]:
    if isinstance(entry, ji.Slice):
        if entry.stride != 1 or not isinstance(entry.size, int):
            raise state.error(f"{op}: {role} slices must have stride 1 and static size")
        return entry.start, entry.size
    if jnp.shape(entry) != ():
        raise state.error(f"{op}: {role} indices must be scalars or slices")
    return entry, None


def _region(state: Any, x: Any, role: str,
            op: str = "jt.copy") -> tuple[Any, list[Any], list[Any], bool]:
    """``(base_ref, starts, sizes, is_origin)`` of a copy or gemm operand (see
    :func:`copy`).

    Views of views fold into one region of the base ref; the tile origin convention applies
    to the last view: it is an origin when all of *its* indices are scalars.
    """
    base, transforms = ji.flatten_ref(x)
    if not ji.is_ref(base):
        raise state.error(f"{op}: the {role} must be a ref (a kernel argument, a jt.empty/"
                          f"shared/fragment/local buffer or a .at[...] view), got "
                          f"{type(x).__name__}")
    if not all(isinstance(t, ji.NDIndexer) for t in transforms):
        raise state.error(f"{op}: unsupported view of the {role} (use .at[...] indexing)")
    levels = [[_entry(state, e, role, op) for e in t.indices] for t in transforms]
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


def _resolve_origin(state: Any, sizes: list[Any], tile: tuple[int, ...],
                    role: str) -> list[Any]:
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


_INT32 = np.iinfo(np.int32)


def _saturate(i: int) -> int:
    return min(max(i, int(_INT32.min)), int(_INT32.max))


def _to_int32(x: Any) -> Any:
    """A traced integer index, index tile or loop bound as int32, the type jaxtile indexes
    and counts with. A value of a wider type is saturated into int32's range first: no buffer
    dimension exceeds 2**31 - 1, so an index out of int32's range stays out of range and
    follows the edge rules (pad, dropped write), where a plain cast would wrap it onto a
    valid one (2**32 + 1 would read row 1)."""
    dtype = jnp.result_type(x)
    if np.iinfo(dtype).max > _INT32.max:
        x = jnp.minimum(x, jnp.asarray(_INT32.max, dtype))
    if np.iinfo(dtype).min < _INT32.min:
        x = jnp.maximum(x, jnp.asarray(_INT32.min, dtype))
    return jnp.asarray(x, jnp.int32)


def _start(state: Any, s: Any, op: str = "jt.copy") -> Any:
    if isinstance(s, int | np.integer):
        return jnp.int32(_saturate(int(s)))
    if not jnp.issubdtype(jnp.result_type(s), jnp.integer):
        raise state.error(f"{op}: indices must be integers, got {jnp.result_type(s)}")
    static = ji.concrete_int(s)        # a constant index needs no clamp on the device
    return jnp.int32(_saturate(static)) if static is not None else _to_int32(s)


def _check_fits(state: Any, ref: Any, starts: list[Any], sizes: list[Any], role: str,
                op: str = "jt.copy") -> None:
    """On-chip buffers have no edge semantics: a static region must fit inside them."""
    if state.scope_of(ref) == "global":
        return
    for d, (start, size, dim) in enumerate(zip(starts, sizes, ref.shape)):
        n = 1 if size is None else size
        start = ji.concrete_int(start)
        if start is not None and not 0 <= start <= dim - n:
            raise state.error(f"{op}: the {role} region [{start}, {start + n}) in dimension "
                              f"{d} does not fit the {state.scope_of(ref)} buffer of shape "
                              f"{tuple(ref.shape)}")


def copy(src: Ref, dst: Ref, *, pad: float | int | None = None) -> None:
    """Copy a tile from ``src`` to ``dst``, casting to ``dst``'s dtype.

    Either operand may be a whole ref, a view with slices (``x.at[jt.ds(i, 64), :]``) or a
    *tile origin*: a view whose indices are all scalars (``a.at[by * bm, k * bk]``), whose
    extent then comes from the other operand (its last r indices are the origin, leading
    ones select a single index). Reads past the end of a global tensor give ``pad``
    (default 0), a value of the source's dtype (a pad it cannot hold is an error); writes
    past the end are dropped.

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
    _check_pad(state, pad, sref.dtype, "jt.copy")
    _check_fits(state, sref, sstarts, ssizes, "source")
    _check_fits(state, dref, dstarts, dsizes, "destination")
    starts = [_start(state, s) for s in sstarts + dstarts]
    tile_ops.copy_p.bind(sref, dref, *starts, src_sizes=tuple(ssizes),
                         dst_sizes=tuple(dsizes), pad=pad)


def _check_pad(state: Any, pad: Any, dtype: Any, op: str) -> None:
    """``pad`` (None: 0) is a value of ``dtype``, the dtype of the source it extends: for an
    integer or bool dtype an integer in its range, for a float one a number that does not
    overflow it (it is rounded as any float is). A pad outside the dtype would wrap in one
    backend, saturate in another and stop the CPU compiler."""
    if pad is None:
        return
    if not isinstance(pad, int | float):
        raise state.error(f"{op}: pad must be a Python number, got {pad!r}")
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        try:
            value = float(pad)
        except OverflowError:
            value = None
        if value is not None and not np.isfinite(value):
            return                  # inf and NaN pads are values of every float dtype
        with np.errstate(over="ignore"):
            if value is None or not np.isfinite(np.float64(value).astype(dtype)):
                largest = ml_dtypes.finfo(dtype).max  # type: ignore[no-untyped-call]
                raise state.error(f"{op}: pad {pad} overflows {dtype}, the dtype of the "
                                  f"source (largest: {largest})")
        return
    low, high = (0, 1) if dtype == np.bool_ else (int(np.iinfo(dtype).min),
                                                 int(np.iinfo(dtype).max))
    if not float(pad).is_integer() or not low <= int(pad) <= high:
        raise state.error(f"{op}: pad {pad} is not a value of {dtype}, the dtype of the "
                          f"source (integers from {low} to {high})")


def _index_tile(state: Any, rows: Any, op: str) -> Any:
    if jnp.ndim(rows) != 1:
        raise state.error(f"{op}: the index tile must be 1-D, got shape {jnp.shape(rows)}")
    if not jnp.issubdtype(jnp.result_type(rows), jnp.integer):
        raise state.error(f"{op}: the index tile must hold integers, got "
                          f"{jnp.result_type(rows)}")
    return _to_int32(rows)


def _indexed_region(state: Any, x: Any, rows: Sequence[Any], axes: Sequence[int], role: str,
                    op: str) -> tuple[Any, list[Any], list[Any]]:
    """``(ref, starts, sizes)`` of a view whose dimensions ``axes`` (counted among the
    view's open dimensions) are indexed by the 1-D tiles ``rows``, one per axis."""
    base, starts, sizes, origin = _region(state, x, role, op)
    if origin:
        raise state.error(f"{op}: give the {role} as a ref or a view with slices "
                          "(x.at[:, jt.ds(c, n)]), not a tile origin")
    open_dims = [d for d, z in enumerate(sizes) if z is not None]
    starts, sizes = list(starts), list(sizes)
    if len(set(axes)) != len(axes):
        raise state.error(f"{op}: axis {tuple(axes)} names an axis twice")
    for axis, r in zip(axes, rows):
        if not 0 <= axis < len(open_dims):
            raise state.error(f"{op}: axis {axis} out of range for a {len(open_dims)}-d "
                              f"{role}")
        d = open_dims[axis]
        starts[d], sizes[d] = r, int(jnp.shape(r)[0])
    return base, starts, sizes


def _indexed_copy(src: Any, dst: Any, rows: Any, axis: int | Sequence[int], pad: Any,
                  gather_src: bool, op: str) -> None:
    state = _trace.current(op)
    many = isinstance(rows, tuple | list)
    axes = tuple(axis) if isinstance(axis, tuple | list) else (axis,)
    row_tiles = tuple(rows) if many else (rows,)
    if len(axes) != len(row_tiles):
        raise state.error(f"{op}: {len(row_tiles)} index tile(s) but {len(axes)} axis "
                          f"value(s); give one axis per index tile")
    row_tiles = tuple(_index_tile(state, r, op) for r in row_tiles)
    if gather_src:
        sref, sstarts, ssizes = _indexed_region(state, src, row_tiles, axes, "source", op)
        dref, dstarts, dsizes, origin = _region(state, dst, "destination", op)
    else:
        sref, sstarts, ssizes, origin = _region(state, src, "source", op)
        dref, dstarts, dsizes = _indexed_region(state, dst, row_tiles, axes, "destination",
                                                op)
    if origin:
        raise state.error(f"{op}: the tile must be a ref or a view with slices")
    _check_pad(state, pad, sref.dtype, op)
    stile = tuple(z for z in ssizes if z is not None)
    dtile = tuple(z for z in dsizes if z is not None)
    if stile != dtile:
        raise state.error(f"{op}: shape mismatch: the source tile is {stile} but the "
                          f"destination tile is {dtile}")
    if state.scope_of(sref if gather_src else dref) != "global":
        raise state.error(f"{op}: the indexed operand must be a global tensor")
    starts = [s if any(s is r for r in row_tiles) else _start(state, s, op)
              for s in sstarts + dstarts]
    tile_ops.copy_p.bind(sref, dref, *starts, src_sizes=tuple(ssizes),
                         dst_sizes=tuple(dsizes), pad=pad)


def gather(src: Ref, rows: jax.Array | Sequence[jax.Array], dst: Ref, *,
           axis: int | Sequence[int] = 0, pad: float | int | None = None) -> None:
    """Copy the slices of ``src`` that ``rows`` selects along ``axis`` into the tile ``dst``:
    ``dst[i, ...] = src[rows[i], ...]`` for ``axis=0``, casting to ``dst``'s dtype.

    ``src`` is a global tensor or a view with slices (``x.at[:, jt.ds(c, 64)]``); ``rows`` a
    1-D integer tile value (e.g. read from an index input). Rows out of range read ``pad``
    (default 0; a value of ``src``'s dtype), as copies past an edge do. Embedding lookups,
    MoE token dispatch, paged attention.

    A tuple of index tiles with a tuple of axes indexes several dimensions at once, as an
    outer product: ``jt.gather(x, (r, c), dst, axis=(0, 1))`` is ``dst[i, j] = x[r[i],
    c[j]]``.

    >>> jt.gather(table.at[:, jt.ds(0, d)], ids_s[...], rows_f)    # doctest: +SKIP
    """
    _indexed_copy(src, dst, rows, axis, pad, True, "jt.gather")


def scatter(src: Ref, rows: jax.Array | Sequence[jax.Array], dst: Ref, *,
            axis: int | Sequence[int] = 0) -> None:
    """Write the tile ``src`` to the slices of the global ``dst`` that ``rows`` selects along
    ``axis``: ``dst[rows[i], ...] = src[i, ...]``. Writes to rows out of range are dropped;
    if two indices are equal, one of the writes wins. Several index tiles with several axes
    index an outer product, as in :func:`gather`."""
    _indexed_copy(src, dst, rows, axis, None, False, "jt.scatter")


def _atomic(dst: Any, value: Any, fn: str) -> None:
    op = f"jt.atomic_{fn}"
    state = _trace.current(op)
    ref, starts, sizes, origin = _region(state, dst, "destination", op)
    value = jnp.asarray(value)
    if origin:
        sizes = _resolve_origin(state, sizes, tuple(value.shape), "destination")
    tile = tuple(z for z in sizes if z is not None)
    if np.dtype(ref.dtype) not in op_defs.ATOMIC_DTYPES:
        raise state.error(f"{op}: atomic updates of {ref.dtype} are not supported; the "
                          f"destination must be one of "
                          f"{', '.join(sorted(str(d) for d in op_defs.ATOMIC_DTYPES))}")
    if value.shape != tile:
        if value.shape != ():
            raise state.error(f"{op}: the value has shape {value.shape} but the destination "
                              f"tile is {tile}")
        value = jnp.broadcast_to(value, tile)
    _check_fits(state, ref, starts, sizes, "destination", op)
    tile_ops.atomic_p.bind(ref, value, *[_start(state, s, op) for s in starts], fn=fn,
                           sizes=tuple(sizes))


def atomic_add(dst: Ref, value: ArrayLike) -> None:
    """Add ``value`` (a tile value, or a scalar) into ``dst`` atomically: blocks that run at
    the same time never lose an update.

    ``dst`` is a global output or an on-chip tile, as a ref, a view with slices, or a tile
    origin (``out.at[i, j]``, the extent coming from ``value``). Additions past the end of a
    global output are dropped. An output that a kernel updates atomically starts as zeros,
    in the compiled kernel as in the reference semantics. Supported element types: float32,
    float64, int32, int64.

    >>> jt.atomic_add(c.at[by * bm, bx * bn], acc[...])    # split-K    # doctest: +SKIP
    """
    _atomic(dst, value, "add")


def atomic_max(dst: Ref, value: ArrayLike) -> None:
    """Like :func:`atomic_add`, keeping the maximum (NaN wins, as in ``jnp.maximum``)."""
    _atomic(dst, value, "max")


def atomic_min(dst: Ref, value: ArrayLike) -> None:
    """Like :func:`atomic_add`, keeping the minimum (NaN wins, as in ``jnp.minimum``)."""
    _atomic(dst, value, "min")


def _element_of(ref_view: Any, op: str, role: str) -> tuple[Any, Any, list[Any]]:
    """``(state, base_ref, starts)`` of a view naming one element of a global buffer."""
    state = _trace.current(op)
    ref, starts, sizes, origin = _region(state, ref_view, role, op)
    if not origin or any(z not in (None, "origin") for z in sizes):
        raise state.error(f"{op}: the {role} must name one element, e.g. flags.at[i] (all "
                          "indices scalars)")
    if state.scope_of(ref) != "global":
        raise state.error(f"{op}: the {role} is a {state.scope_of(ref)} buffer; acquire and "
                          "release order global memory between blocks (a block's own threads "
                          "are ordered by its barriers)")
    if np.dtype(ref.dtype) not in op_defs.ATOMIC_DTYPES:
        raise state.error(f"{op}: the {role} has dtype {ref.dtype}; flags must be one of "
                          f"{', '.join(sorted(str(d) for d in op_defs.ATOMIC_DTYPES))}")
    return state, ref, [_start(state, s, op) for s in starts]


def load_acquire(src: Ref) -> jax.Array:
    """Read one element of a global buffer with *acquire* ordering: the block's later reads
    see everything the writer of the value wrote before its :func:`store_release` (or
    before its :func:`fence` and plain store). A plain read of a flag another block sets --
    even inside a ``jt.while_`` that waits for it -- orders nothing on a GPU: data read after
    it may be older than the flag.

    >>> @jt.while_(lambda: jt.load_acquire(flags.at[i - 1]) == 0)   # doctest: +SKIP
    ... def _(): pass
    >>> prev = out[i - 1]                      # written by block i - 1 before its flag
    """
    state, ref, starts = _element_of(src, "jt.load_acquire", "source")
    del state
    return tile_ops.load_acquire_p.bind(ref, *starts)


def store_release(dst: Ref, value: ArrayLike) -> None:
    """Write one element of a global output with *release* ordering: every write the block
    made before it (all its threads') is visible to a block that reads this value with
    :func:`load_acquire`. On CUDA the block's threads first wait for each other, so it must
    be reached by all of them (not inside a ``jt.while_`` whose condition reads a flag).

    >>> out[i] = total                                              # doctest: +SKIP
    >>> jt.store_release(flags.at[i], 1)       # then out[i] is published
    """
    state, ref, starts = _element_of(dst, "jt.store_release", "destination")
    value = jnp.asarray(value)
    if value.shape != ():
        raise state.error(f"jt.store_release: the value must be a scalar, got shape "
                          f"{value.shape}")
    tile_ops.store_release_p.bind(ref, value.astype(ref.dtype), *starts)


def fence() -> None:
    """A memory fence between blocks (``fence.acq_rel.gpu``; a sequentially consistent fence
    on the CPU): the block's global memory accesses before it are ordered before those after
    it. Writes, ``jt.fence()``, then a plain flag store publish like :func:`store_release`;
    a plain flag read, ``jt.fence()``, then data reads acquire like :func:`load_acquire`. On
    CUDA the block's threads first wait for each other (like ``store_release``)."""
    state = _trace.current("jt.fence")
    outputs = {id(b): b for b in (ji.flatten_ref(r)[0] for r, a in
                                  zip(state.refs, state.allocations) if a.scope == "global")}
    if not outputs:
        raise state.error("jt.fence: the kernel has declared no output yet (jt.empty); a fence "
                          "orders the accesses to its outputs, so call it after them")
    tile_ops.fence_p.bind(*outputs.values())


def print(fmt: str, /, *values: ArrayLike, when: ArrayLike | None = None) -> None:  # noqa: A001
    """Print one line per block from inside a kernel: ``fmt`` with each ``{}`` replaced by
    the next value, after the block's tag (``[block 3] row 3 max 2.5``; ``[block (i, j)]`` on
    a grid of several axes: those of the ``jt.grid`` called before it, then the batch
    indices under ``vmap``). ``when`` (a scalar bool) prints only where it holds.

    Values are scalars (a tile prints nothing sensible once per block: reduce it or index
    one element first), written as C's ``printf`` would: integers in decimal, floats with
    ``%g``, bools as ``True``/``False``. Every backend prints the same text, to C's stdout
    (device ``printf`` on a GPU, which flushes when the kernel completes); the order across
    blocks is unspecified, as with CUDA's ``printf`` and ``jax.debug.print``. On a GPU the
    line comes from the block's thread 0.

    >>> jt.print("row {} max {}", i, jnp.max(x), when=i < 2)         # doctest: +SKIP
    """
    state = _trace.current("jt.print")
    text = print_format.pieces(fmt, len(values))
    if isinstance(text, str):
        raise state.error(f"jt.print: {text}")
    args = []
    for k, v in enumerate(values):
        try:
            a = jnp.asarray(v)
        except TypeError as e:
            raise state.error(f"jt.print: value {k} ({type(v).__name__}) is not a number: "
                              f"{e}") from None
        if a.shape != ():
            raise state.error(f"jt.print: value {k} is a tile of shape {a.shape}; jt.print "
                              "prints scalars (reduce the tile, e.g. jnp.max(x), or index "
                              "one element)")
        if a.dtype not in op_defs.COMPUTED:
            raise state.error(f"jt.print: value {k} has dtype {a.dtype}, which kernels do "
                              "not compute in (convert it, e.g. x.astype(jnp.float32))")
        args.append(a)
    cond = jnp.asarray(True if when is None else when)
    if cond.shape != () or cond.dtype != np.bool_:
        raise state.error(f"jt.print: when= must be a scalar bool, got {cond.dtype}"
                          f"{list(cond.shape)}")
    rank = len(state.grid) if state.grid is not None else 1
    tag = list(state.block_indices[:rank]) + list(reversed(state.batch_indices))
    tile_ops.print_p.bind(cond, *tag, *args, text=text, tag=len(tag))


def gemm(a: Ref, b: Ref, c: Ref, *, transpose_a: bool = False,
         transpose_b: bool = False) -> None:
    """Accumulate a matrix product into ``c``: ``c += op(a) @ op(b)``.

    ``a``, ``b`` and ``c`` are 2-D tiles of on-chip buffers (``jt.shared``/``jt.fragment``/
    ``jt.local``): whole 2-D buffers or views that select a 2-D tile, such as one stage of
    a multi-buffered tile (``a_s.at[k % stages]``) or a slice (``q_s.at[:, jt.ds(0, 64)]``).
    ``op`` transposes when asked. The product is accumulated in ``c.dtype``, except into a
    float16 or bfloat16 ``c``: then ``c`` and the products are summed in float32 and the sum
    is rounded once into ``c`` (on every backend, as in ``jnp.dot``).
    """
    state = _trace.current("jt.gemm")
    tiles, starts, sizes = {}, [], {}
    for role, x in (("a", a), ("b", b), ("c", c)):
        if not ji.is_ref(ji.flatten_ref(x)[0]):
            raise state.error(f"jt.gemm: operand {role} must be an on-chip tile ref or a view "
                              f"of one, got {type(x).__name__}")
        base, r_starts, r_sizes, origin = _region(state, x, f"operand {role}", "jt.gemm")
        if origin:
            raise state.error(f"jt.gemm: operand {role} is a view of single elements; select "
                              "a 2-D tile with slices (jt.ds or :)")
        if state.scope_of(base) == "global":
            raise state.error(f"jt.gemm: operand {role} is in global memory; copy it into a "
                              "jt.shared or jt.fragment tile first")
        tile = tuple(z for z in r_sizes if z is not None)
        if len(tile) != 2:
            raise state.error(f"jt.gemm: operand {role} must be a 2-D tile, got shape {tile}")
        _check_fits(state, base, r_starts, r_sizes, f"operand {role}", "jt.gemm")
        tiles[role], sizes[role] = (base, tile), tuple(r_sizes)
        starts += [_start(state, s, "jt.gemm") for s in r_starts]
    (a_ref, a_tile), (b_ref, b_tile), (c_ref, c_tile) = tiles["a"], tiles["b"], tiles["c"]
    m, k = a_tile[::-1] if transpose_a else a_tile
    k2, n = b_tile[::-1] if transpose_b else b_tile
    if k != k2 or c_tile != (m, n):
        raise state.error(f"jt.gemm: shape mismatch: a {a_tile}"
                          f"{'.T' if transpose_a else ''} @ b {b_tile}"
                          f"{'.T' if transpose_b else ''} cannot accumulate into c {c_tile}")
    if a_ref.dtype != b_ref.dtype:
        raise state.error(f"jt.gemm: dtype mismatch: a is {a_ref.dtype} but b is "
                          f"{b_ref.dtype}")
    if jnp.issubdtype(a_ref.dtype, jnp.floating) != jnp.issubdtype(c_ref.dtype, jnp.floating):
        raise state.error(f"jt.gemm: cannot accumulate {a_ref.dtype} products into "
                          f"{c_ref.dtype}")
    tile_ops.gemm_p.bind(a_ref, b_ref, c_ref, *starts, a_sizes=sizes["a"], b_sizes=sizes["b"],
                         c_sizes=sizes["c"], transpose_a=bool(transpose_a),
                         transpose_b=bool(transpose_b))


def _bound(state: Any, b: Any) -> Any:
    """A loop bound: a Python int, or a traced integer scalar (computed on the device).
    Loops count in int32: a static bound outside its range is an error, a traced one of a
    wider type saturates into it (so a loop from 2**32 to 2**32 + 3 runs no iteration,
    rather than three from 0)."""
    if isinstance(b, int | np.integer):
        if _saturate(int(b)) != int(b):
            raise state.error(f"the loop bound {int(b)} is outside the int32 range that "
                              "device loops count in")
        return int(b)
    if ji.is_symbolic_dim(b):
        return jnp.asarray(b, jnp.int32)
    if jnp.shape(b) != () or not jnp.issubdtype(jnp.result_type(b), jnp.integer):
        raise state.error(f"loop bounds must be ints or integer scalars, got "
                          f"{jnp.result_type(b)}{list(jnp.shape(b))}")
    return _to_int32(b)


def _run_loop(start: Any, stop: Any, body: Callable[[Any], Any], kind: str,
              stages: int, warp_specialize: bool | None = None,
              pingpong: bool | None = None) -> None:
    state = _trace.current(f"jt.{'pipelined' if kind == 'pipelined' else 'loop'}")
    start, stop = _bound(state, start), _bound(state, stop)
    if kind == "unrolled" and not (isinstance(start, int) and isinstance(stop, int)):
        raise state.error("jt.loop(..., unroll=True) needs static (Python int) bounds")

    def step(i: jax.Array, carry: int) -> int:
        result = body(tile_ops.loop_info_p.bind(i, kind=kind, stages=stages,
                                                warp_specialize=warp_specialize,
                                                pingpong=pingpong))
        if result is not None:
            raise state.error("a loop body must not return a value; write results to refs")
        return carry

    if jax.config.jax_enable_x64:  # type: ignore[attr-defined]
        # Under x64 Python-int bounds would give the loop an int64 counter, which kernels
        # do not count in: int32 bounds make it count in int32. Only then: without x64,
        # Python ints keep a static trip count, which the CPU's gemm passes plan with.
        start, stop = (jnp.int32(b) if isinstance(b, int) else b for b in (start, stop))
    lax.fori_loop(start, stop, step, 0)


def loop(start: Index, stop: Index | None = None, *,
         unroll: bool = False) -> Callable[[LoopBody], None]:
    """Decorator: run the body for ``i`` in ``range(start, stop)`` on the device.

    The bounds are Python ints or traced integer scalars computed in the body (from block
    indices or values read from inputs), e.g. causal attention's
    ``jnp.minimum(jt.cdiv(S, bn), jt.cdiv((bx + 1) * bm, bn))``; a loop whose stop is not
    above its start runs no iteration. Loops count in int32: a traced bound of a wider type
    (int64 under x64) saturates into its range, a Python int outside it is an error.

    >>> @jt.loop(n)                               # doctest: +SKIP
    ... def _(i):
    ...     acc[...] += x[jt.ds(i * 8, 8)]
    """
    if stop is None:
        start, stop = 0, start
    return lambda body: _run_loop(start, stop, body, "unrolled" if unroll else "serial", 1)


def pipelined(n: Index, *, stages: int = 2, warp_specialize: bool | None = None,
              pingpong: bool | None = None) -> Callable[[LoopBody], None]:
    """Decorator: a loop over ``range(n)`` whose copies the compiler may software-pipeline
    ``stages`` deep (on the CPU it is a plain loop). ``n`` may be traced, and smaller than
    ``stages``.

    ``warp_specialize`` (sm_90a): where the loop's copies are all TMA loads, the compiler
    adds a producer warpgroup that issues them while the kernel's ``threads`` compute
    (docs/design.md, "Warp specialisation"). None (the default) splits kernels of two or
    more warpgroups where it can; False keeps
    every thread on both; True asks for the split and is an error where the loop cannot
    have it. Other targets ignore it.

    ``pingpong`` (sm_90a, a warp-specialised loop): the consumer warpgroups take turns at
    the tensor cores, so that one's non-GEMM work between two GEMMs (attention's softmax)
    overlaps another's GEMMs (docs/design.md, "Ping-pong scheduling"). None (the default)
    turns it on where the loop body has GEMMs on both sides of other work and two or more
    consumer warpgroups; False keeps it off; True asks for it and is an error naming why
    where the loop cannot have it. Other targets ignore it."""
    if not isinstance(stages, int) or stages < 1:
        raise _trace.current("jt.pipelined").error(
            f"jt.pipelined: stages must be a positive int, got {stages!r}")
    if warp_specialize not in (None, True, False):
        raise _trace.current("jt.pipelined").error(
            f"jt.pipelined: warp_specialize must be True, False or None, got "
            f"{warp_specialize!r}")
    if pingpong not in (None, True, False):
        raise _trace.current("jt.pipelined").error(
            f"jt.pipelined: pingpong must be True, False or None, got {pingpong!r}")
    return lambda body: _run_loop(0, n, body, "pipelined", stages, warp_specialize,
                                  pingpong)


def while_(cond: Callable[[], ArrayLike]) -> Callable[[Body], None]:
    """Decorator: run the body on the device as long as ``cond()`` is true.

    ``cond`` is a function of no arguments evaluated before every iteration; it reads refs
    (the loop's state lives in refs, e.g. a ``jt.local`` counter the body updates) and
    returns a scalar bool.

    >>> i = jt.local((1,), jnp.int32)                  # doctest: +SKIP
    >>> i[0] = 0
    >>> @jt.while_(lambda: (i[0] < n) & (x[i[0]] > 0))
    ... def _():
    ...     i[0] += 1
    """
    def deco(body: Body) -> None:
        state = _trace.current("jt.while_")
        if not callable(cond):
            raise state.error("jt.while_ takes a function that computes the condition, e.g. "
                              "@jt.while_(lambda: i[0] < n)")

        def test() -> jax.Array:
            c = cond()
            if jnp.shape(c) != ():
                raise state.error(f"jt.while_: the condition must be a scalar, got shape "
                                  f"{jnp.shape(c)}")
            return jnp.asarray(c, jnp.bool_)

        def step(_: jax.Array) -> jax.Array:
            if body() is not None:
                raise state.error("a jt.while_ body must not return a value")
            return test()

        # The flag is carried rather than recomputed by the loop's condition from refs:
        # JAX's state discharge (the reference semantics) mishandles a while condition that
        # reads refs its body writes (the loop never sees the updates).
        lax.while_loop(lambda go: go, step, test())
    return deco


def when(cond: ArrayLike) -> Callable[[Body], None]:
    """Decorator: run the body only where the traced scalar ``cond`` is true."""
    def deco(body: Body) -> None:
        state = _trace.current("jt.when")
        if isinstance(cond, bool | np.bool_):
            if cond:
                body()
            return
        if jnp.shape(cond) != ():
            raise state.error(f"jt.when: the condition must be a scalar, got shape "
                              f"{jnp.shape(cond)}")

        def branch() -> None:
            if body() is not None:
                raise state.error("a jt.when body must not return a value")

        lax.cond(jnp.asarray(cond, jnp.bool_), branch, lambda: None)
    return deco
