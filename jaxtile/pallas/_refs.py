"""The refs a Pallas kernel body sees, over jaxtile's global buffers.

A Pallas kernel reads and writes *blocks*: the part of an operand its BlockSpec selects (the
whole operand without one), as refs indexed like arrays, through ``ref[...]``, ``.at[...]``,
``plgpu.load``/``store`` with masks. :class:`BlockRef` is such a ref: a window of a jaxtile
global buffer (the block's origin and extent per dimension, squeezed dimensions fixed at one
index), narrowed further by each indexing. It stores no data: every read becomes one tile
copy (or gather) from the global buffer into a register tile, every write one copy (or
scatter) out of one, with jaxtile's copy edge rules, which are Pallas' block edge rules:
positions past the end of the operand read 0 and their writes are dropped. So an edge block
needs no special case, and a masked store drops its masked-off lanes.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt
from jaxtile import _trace
from jaxtile.compiler import jax_internals as ji

_DROPPED = int(np.iinfo(np.int32).max)
"""A position past the end of every buffer: a scatter drops the writes sent there."""


def _error(message: str) -> jt.KernelError:
    return _trace.current("jaxtile.pallas").error(message)


@dataclasses.dataclass(frozen=True)
class _Dim:
    """One dimension of the underlying buffer as a ref sees it."""

    start: Any
    """Where the ref's index 0 lies in the buffer (an int or a traced int32 scalar)."""
    size: int | None
    """The extent the ref sees; None for a dimension fixed at ``start`` (squeezed)."""
    positions: Any = None
    """An integer array (relative to ``start``) that indexes this dimension (gather-style
    indexing, ``x_ref.at[i * n + jnp.arange(n)]``); None for a plain window."""


class _At:
    def __init__(self, ref: BlockRef):
        self._ref = ref

    def __getitem__(self, key: Any) -> BlockRef:
        return self._ref._indexed(key)


class BlockRef:
    """A Pallas ref: a window of a jaxtile buffer (see the module doc)."""

    def __init__(self, base: Any, dims: Sequence[_Dim]):
        self.base = base
        self.dims = tuple(dims)

    @classmethod
    def whole(cls, base: Any) -> BlockRef:
        return cls(base, [_Dim(0, int(n)) for n in base.shape])

    # -- the ref protocol ---------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        out: list[int] = []
        arrays = [d.positions for d in self.dims if d.positions is not None]
        placed = False
        for d in self.dims:
            if d.positions is not None:
                if not placed:
                    out.extend(jnp.broadcast_shapes(*(jnp.shape(a) for a in arrays)))
                    placed = True
            elif d.size is not None:
                out.append(d.size)
        return tuple(out)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.base.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def at(self) -> _At:
        return _At(self)

    def __getitem__(self, key: Any) -> jax.Array:
        return self._indexed(key).load()

    def __setitem__(self, key: Any, value: Any) -> None:
        self._indexed(key).store(value)

    def __repr__(self) -> str:
        return f"BlockRef(shape={self.shape}, dtype={self.dtype})"

    # -- indexing -----------------------------------------------------------------------
    def _indexed(self, key: Any) -> BlockRef:
        """The ref narrowed by ``key`` (ints, traced scalars, ``pl.ds`` slices, static Python
        slices, ``...`` and integer arrays), following NumPy's indexing rules."""
        if any(d.positions is not None for d in self.dims):
            raise _error("indexing a ref that is already indexed by an integer array is not "
                         "supported; apply the array index last")
        key = key if isinstance(key, tuple) else (key,)
        open_dims = [k for k, d in enumerate(self.dims) if d.size is not None]
        if sum(e is Ellipsis for e in key) > 1:
            raise _error("a ref index may hold at most one '...'")
        if Ellipsis in [e for e in key if not hasattr(e, "shape")]:
            at = next(k for k, e in enumerate(key) if e is Ellipsis)
            fill = len(open_dims) - (len(key) - 1)
            key = key[:at] + (slice(None),) * fill + key[at + 1:]
        if len(key) > len(open_dims):
            raise _error(f"too many indices ({len(key)}) for a ref of shape {self.shape}")
        dims = list(self.dims)
        for k, entry in zip(open_dims, key):
            dims[k] = _narrow(dims[k], entry)
        arrays = [k for k, d in enumerate(dims) if d.positions is not None]
        if arrays and arrays != list(range(arrays[0], arrays[-1] + 1)):
            raise _error("integer-array indices of a ref must be adjacent")
        return BlockRef(self.base, dims)

    # -- reads and writes ---------------------------------------------------------------
    def _on_chip(self) -> bool:
        return _trace.current("jaxtile.pallas").scope_of(self.base) != "global"

    def _view(self) -> tuple[Any, tuple[Any, ...], tuple[int, ...]]:
        """``(view, positions, axes)``: the buffer view of the ref's windows (array-indexed
        dimensions whole) and, for the array-indexed ones, their absolute 1-D positions and
        their axes among the view's open dimensions (for jt.gather/scatter)."""
        entries: list[Any] = []
        positions: list[Any] = []
        axes: list[int] = []
        arrays = [d.positions for d in self.dims if d.positions is not None]
        bshape = jnp.broadcast_shapes(*(jnp.shape(a) for a in arrays)) if arrays else ()
        n_open = 0
        for d in self.dims:
            if d.positions is not None:
                varying = [k for k, n in enumerate(_padded_shape(d.positions, len(bshape)))
                           if n != 1]
                if len(bshape) != len(arrays) or len(varying) > 1 or \
                        (varying and varying[0] != len(positions)):
                    raise _error("integer-array indices of a ref must form an outer product "
                                 "(x_ref.at[rows[:, None], cols[None, :]], or one 1-D array); "
                                 f"got index shapes {[jnp.shape(a) for a in arrays]}")
                n = bshape[len(positions)]
                flat = jnp.broadcast_to(jnp.reshape(d.positions, (-1,)), (n,)) if varying \
                    else jnp.broadcast_to(jnp.reshape(d.positions, ()), (n,))
                positions.append(d.start + flat.astype(jnp.int32))
                axes.append(n_open)
                entries.append(slice(None))
                n_open += 1
            elif d.size is None:
                entries.append(d.start)
            else:
                entries.append(jt.ds(d.start, d.size))
                n_open += 1
        view = self.base.at[tuple(entries)] if entries else self.base
        return view, tuple(positions), tuple(axes)

    def load(self, mask: Any = None, other: Any = None) -> jax.Array:
        """The ref's contents; where ``mask`` is False, ``other`` (0 when None)."""
        if self._on_chip():
            value = self.base[self._chip_index()]
        else:
            view, positions, axes = self._view()
            tile = jt.fragment(self.shape, self.dtype)
            if positions:
                jt.gather(view, positions, tile, axis=axes)
            else:
                jt.copy(view, tile)
            value = tile[...]
        if mask is not None:
            fill = jnp.zeros((), value.dtype) if other is None else \
                jnp.asarray(other).astype(value.dtype)
            value = jnp.where(mask, value, fill)
        return value

    def store(self, value: Any, mask: Any = None) -> None:
        """Write ``value`` (broadcast to the ref's shape) where ``mask`` is True."""
        shape = self.shape
        value = jnp.broadcast_to(jnp.asarray(value).astype(self.dtype), shape)
        if self._on_chip():
            index = self._chip_index()
            if mask is not None:
                value = jnp.where(mask, value, self.base[index])
            self.base[index] = value
            return
        if mask is None:
            self._write(value)
            return
        mshape = _padded_shape(mask, len(shape))
        varying = [k for k, n in enumerate(mshape) if n != 1]
        if not varying:
            # One flag for the whole ref: write it or not.
            jt.when(jnp.reshape(mask, ()))(lambda: self._write(value))
        elif len(varying) == 1 and self._masked_store_along(
                varying[0], jnp.reshape(mask, (-1,)), value):
            pass     # a mask along one axis (a row tail, padded head dimensions)
        else:
            # A mask along several axes: read, merge, write back. The masked-off elements
            # inside the operand are rewritten with the values read (not atomic: another
            # program writing them at the same time may be overwritten).
            self._write(jnp.where(mask, value, self.load()))

    def _write(self, value: Any) -> None:
        view, positions, axes = self._view()
        tile = jt.fragment(self.shape, self.dtype)
        tile[...] = value
        if positions:
            jt.scatter(tile, positions, view, axis=axes)
        else:
            jt.copy(tile, view)

    def _axis_positions(self, axis: int) -> tuple[int, Any] | None:
        """``(k, positions)``: the buffer dimension ``k`` behind the ref's visible axis
        ``axis`` and the positions the axis reaches there, relative to that dimension's
        start; None where the ref's indexing has no such dimension (a plain axis of an
        array-indexed ref, or an axis of a 2-D index array)."""
        arrays = [k for k, d in enumerate(self.dims) if d.positions is not None]
        if arrays:
            d = self.dims[arrays[0]]
            if len(arrays) != 1 or jnp.ndim(d.positions) != 1 or axis != self._group_start():
                return None
            return arrays[0], d.positions.astype(jnp.int32)
        k = [k for k, d in enumerate(self.dims) if d.size is not None][axis]
        return k, jnp.arange(self.dims[k].size, dtype=jnp.int32)

    def _masked_store_along(self, axis: int, mask: Any, value: Any) -> bool:
        """Store ``value`` where the 1-D ``mask`` along visible axis ``axis`` holds; False
        (nothing done) where the ref's indexing does not allow it.

        Exact: the masked-off positions are sent past the end of the buffer, where a scatter
        drops them. Masks are most often the in-bounds test itself (a row tail), which the
        copy edge rules already apply: where the mask equals it, at run time, the store is
        an unmasked copy (a block copy for a window or ``s + iota`` positions) instead of
        the element-wise scatter."""
        found = self._axis_positions(axis)
        if found is None:
            return False
        k, own = found
        d = self.dims[k]
        mask = jnp.broadcast_to(mask, own.shape)
        dims = list(self.dims)
        dims[k] = _Dim(d.start, d.size, jnp.where(mask, own, _DROPPED - d.start))
        scattered = BlockRef(self.base, dims)
        at = d.start + own
        inside = (at >= 0) & (at < self.base.shape[k])
        # Counted in int32, not as jnp.all(mask == inside): TVM folds a comparison of two
        # bool vectors it can prove equal into a vector constant it cannot build.
        differ = jnp.sum(jnp.abs(mask.astype(jnp.int32) - inside.astype(jnp.int32)))
        jt.when(differ == 0)(lambda: self._write(value))
        jt.when(differ != 0)(lambda: scattered._write(value))
        return True

    def _group_start(self) -> int:
        """The visible axis where the array-indexed dimensions start."""
        axis = 0
        for d in self.dims:
            if d.positions is not None:
                return axis
            if d.size is not None:
                axis += 1
        return axis

    def _chip_index(self) -> tuple[Any, ...]:
        if any(d.positions is not None for d in self.dims):
            raise _error("integer-array indexing of a scratch buffer is not supported")
        return tuple(d.start if d.size is None else jt.ds(d.start, d.size) for d in self.dims)


def _padded_shape(x: Any, rank: int) -> tuple[int, ...]:
    shape = tuple(jnp.shape(x))
    return (1,) * (rank - len(shape)) + shape


def _narrow(d: _Dim, entry: Any) -> _Dim:
    """``d`` narrowed by one index entry."""
    assert d.size is not None
    if isinstance(entry, ji.Slice):
        if not isinstance(entry.stride, int) or entry.stride != 1:
            raise _error("strided pl.ds slices of a ref are not supported")
        if not isinstance(entry.size, int | np.integer):
            raise _error("pl.ds slices of a ref must have a static size")
        return _Dim(_add(d.start, entry.start), int(entry.size))
    if isinstance(entry, slice):
        bounds = (entry.start, entry.stop, entry.step)
        if not all(b is None or isinstance(b, int | np.integer) for b in bounds):
            raise _error("Python slices of a ref must have static bounds; use pl.ds(start, "
                         "size) for a traced start")
        r = range(d.size)[entry]
        if r.step != 1:
            raise _error("strided slices of a ref are not supported")
        return _Dim(_add(d.start, r.start), len(r))
    if isinstance(entry, int | np.integer):
        i = int(entry)
        return _Dim(_add(d.start, i + d.size if i < 0 else i), None)
    shape = jnp.shape(entry)
    if not jnp.issubdtype(jnp.result_type(entry), jnp.integer):
        raise _error(f"ref indices must be integers, ds slices or slices, got "
                     f"{jnp.result_type(entry)}")
    if shape == ():
        return _Dim(_add(d.start, entry), None)
    return _Dim(d.start, d.size, positions=entry)


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, int) and a == 0:
        return b
    if isinstance(b, int | np.integer) and b == 0:
        return a
    return operator.add(a, b)
