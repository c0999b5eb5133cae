"""``jt.copy`` as TIR loop nests for the CPU.

A copy tests once per tile whether the tile lies inside both buffers and then takes a
vectorised unmasked path; otherwise a masked path whose loop bounds skip dropped writes and
whose reads select ``pad`` (see :func:`_masked_copy`). Copies between regions of one buffer
go through a temporary, so they behave as if the whole source were read first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from tvm import tirx
from tvm.ir import Expr

from .. import ir
from . import elementwise as ew
from .context import Lowering, extent


def _is_true(cond: Expr | bool) -> bool:
    if isinstance(cond, bool):
        return cond
    return isinstance(cond, tirx.IntImm) and bool(cond.value)


def _is_false(cond: Expr | bool) -> bool:
    if isinstance(cond, bool):
        return not cond
    return isinstance(cond, tirx.IntImm) and not cond.value


def all_of(conds: Sequence[Expr | bool]) -> Expr | bool:
    """The conjunction of ``conds``, leaving out those known to be true (``True`` if all
    are, ``False`` if one is known to be false: no guard then, so no dead code for TVM
    and LLVM to compile)."""
    out: Expr | bool = True
    for c in conds:
        if _is_false(c):
            return False
        if _is_true(c):
            continue
        out = c if out is True else tirx.And(out, c)
    return out


def _coords(starts: Sequence[Expr], index: Sequence[ir.Index], idx: Sequence[Expr]) -> list[Expr]:
    """Buffer coordinates of tile element ``idx`` of an access starting at ``starts``."""
    it = iter(idx)
    return [s if i.size is None else s + next(it) for s, i in zip(starts, index)]


def strip_index(shape: tuple[int, int], width: int, k: Expr, j: Expr) -> list[Expr]:
    """The ``[row, column]`` of a ``shape`` buffer held strip-major (strips of ``width``
    columns, :func:`.gemm.strip_panels`) where element ``(k, j)`` lies."""
    rows, cols = shape
    per_row = cols // width          # strips' rows of `width` per buffer row
    at = (j // width) * rows + k     # which row of `width` elements, counted over the strips
    return [at // per_row, at % per_row * width + j % width]


def _store(low: Lowering, dst: tirx.Buffer, coords: list[Expr], value: Expr) -> None:
    """``dst[coords] = value``, where ``dst`` may be a GEMM panel held strip-major
    (:func:`.gemm.strip_panels`)."""
    width = low.panel_strips.get(dst.name)
    if width is not None:
        coords = strip_index((int(dst.shape[0]), int(dst.shape[1])), width, *coords)
    low.kb.store(dst, coords, value)


def lower_copy(low: Lowering, op: ir.Op) -> None:
    """Emit ``jt.copy``: the fast path when the tile lies inside both buffers, else the
    masked path (see :func:`_masked_copy`); copies within one buffer go through a
    temporary."""
    a = op.attrs
    if any(isinstance(i.start, ir.Value) and i.start.shape != ()
           for r in (a["src"], a["dst"]) for i in r.index):
        _indexed_copy(low, op)
        return
    if a["src"].buffer == a["dst"].buffer:
        # Regions of one buffer may overlap: read the whole source tile first.
        _through_temporary(low, op)
        return
    src, dst = low.bufs[a["src"].buffer], low.bufs[a["dst"].buffer]
    tile = ir.tile_shape(a["src"].index)
    s_starts = [low.start(i, 0, clamp=False) for i in a["src"].index]
    d_starts = [low.start(i, 0, clamp=False) for i in a["dst"].index]

    def fits(buf, name, index, starts):
        if low.scopes[name] != "global":
            return True
        return all_of([all_of([s >= 0, s + (1 if i.size is None else i.size) <= extent(n)])
                       for s, i, n in zip(starts, index, buf.shape)])

    def emit(masked: bool) -> None:
        if masked:
            _masked_copy(low, op, src, dst, tile, s_starts, d_starts)
            return
        with low.nest(tile) as idx:
            v = src[tuple(_coords(s_starts, a["src"].index, idx))]
            _store(low, dst, _coords(d_starts, a["dst"].index, idx),
                   ew.convert(v, low.dtype(src), low.dtype(dst), low.bind))

    inside = all_of([fits(src, a["src"].buffer, a["src"].index, s_starts),
                   fits(dst, a["dst"].buffer, a["dst"].index, d_starts)])
    if _is_true(inside) or _is_false(inside):
        emit(_is_false(inside))
        return
    with low.kb.if_(inside):
        emit(False)
    with low.kb.else_():
        emit(True)


def _indexed_copy(low: Lowering, op: ir.Op) -> None:
    """A gather or scatter: some region dimension takes its positions from a 1-D index
    tile. Element by element, each position checked against the global buffer's bounds
    (reads there give pad, writes are skipped)."""
    a = op.attrs
    src, dst = low.bufs[a["src"].buffer], low.bufs[a["dst"].buffer]
    pad = a["pad"] if a["pad"] is not None else 0

    def positions(region: ir.Region, idx: list[Expr]) -> list[Expr]:
        coords, it = [], iter(idx)
        for i in region.index:
            if i.size is None:
                coords.append(low.start(i, 0, clamp=False))
            elif isinstance(i.start, ir.Value) and i.start.shape != ():
                coords.append(tirx.Cast("int32", low.at(i.start, [next(it)])))
            else:
                coords.append(low.start(i, 0, clamp=False) + next(it))
        return coords

    def inside(buf, coords) -> Expr:
        return all_of([tirx.And(c >= 0, c < extent(n)) for c, n in zip(coords, buf.shape)])

    with low.nest(a["src"].shape, vectorize=False) as idx:
        s, d = positions(a["src"], idx), positions(a["dst"], idx)
        s_ok = low.bind(inside(src, s))
        clamped = [tirx.max(tirx.min(c, extent(n) - 1), 0) for c, n in zip(s, src.shape)]
        value = tirx.Select(s_ok, src[tuple(clamped)], ew.const(pad, low.dtype(src)))
        value = ew.convert(value, low.dtype(src), low.dtype(dst), low.bind)
        with low.kb.if_(inside(dst, d)):
            low.kb.store(dst, d, value)


def _through_temporary(low: Lowering, op: ir.Op) -> None:
    a = op.attrs
    tile = ir.tile_shape(a["src"].index)
    name = low.name("copy_tile")
    low.bufs[name] = low.alloc_like(name, tile, low.bufs[a["src"].buffer])
    low.scopes[name] = "local"
    whole = ir.Region(name, tuple(ir.Index(0, n) for n in tile))
    lower_copy(low, ir.Op("copy", (), None, {**a, "dst": whole}, op.line))
    lower_copy(low, ir.Op("copy", (), None, {**a, "src": whole}, op.line))


def _masked_copy(low: Lowering, op, src, dst, tile, s_starts, d_starts) -> None:
    """The edge path of a copy: read past the source end gives pad, write past the
    destination end is skipped (by the loop bounds, so nothing is tested per element).

    When the tile's last dimension is the last (contiguous) axis of both buffers, that
    dimension goes in vector-sized chunks: a chunk wholly inside both buffers is copied
    as a vector, only the others element by element. A row tile rounded up past the end
    of its rows then costs one partial chunk per row, not a scalar loop over the tile.
    """
    a = op.attrs
    d_global = low.scopes[a["dst"].buffer] == "global"
    s_global = low.scopes[a["src"].buffer] == "global"
    lows, highs, point_ok = [], [], []
    for s, i, n in zip(d_starts, a["dst"].index, dst.shape):
        if i.size is None:
            if d_global:
                point_ok.append(tirx.And(s >= 0, s < extent(n)))
            continue
        if d_global:
            lows.append(tirx.max(-s, tirx.const(0, "int32")))
            highs.append(tirx.min(tirx.const(i.size, "int32"), extent(n) - s))
        else:
            lows.append(tirx.const(0, "int32"))
            highs.append(tirx.const(i.size, "int32"))
    pad = a["pad"] if a["pad"] is not None else 0
    lanes = low.target.caps.vector_bits // 32
    # A copy of one element (rank-0 tile, e.g. a scalar output of a vmapped kernel) has no
    # last dimension to chunk.
    chunked = (bool(tile) and a["src"].index[-1].size is not None
               and a["dst"].index[-1].size is not None and tile[-1] % lanes == 0)

    def masked_element(idx: list[Expr]) -> None:
        conds, src_at = [], []
        for c, n in zip(_coords(s_starts, a["src"].index, idx), src.shape):
            if s_global:
                conds.append(tirx.And(c >= 0, c < extent(n)))
                c = tirx.max(tirx.min(c, extent(n) - 1), tirx.const(0, "int32"))
            src_at.append(c)
        value = src[tuple(src_at)]
        in_bounds = all_of(conds)
        if not _is_true(in_bounds):
            value = tirx.Select(in_bounds, value, ew.const(pad, low.dtype(src)))
        _store(low, dst, _coords(d_starts, a["dst"].index, idx),
               ew.convert(value, low.dtype(src), low.dtype(dst), low.bind))

    with contextlib.ExitStack() as stack:
        ok = all_of(point_ok)
        if not _is_true(ok):
            stack.enter_context(low.kb.if_(ok))
        n_outer = len(lows) - 1 if chunked else len(lows)
        idx = [stack.enter_context(low.kb.loop(low.name("i"), hi - lo, start=lo))
               for lo, hi in zip(lows[:n_outer], highs[:n_outer])]
        if not chunked:
            masked_element(idx)
            return
        jo = stack.enter_context(low.kb.loop(low.name("c"), tile[-1] // lanes))
        j0 = jo * lanes
        whole = [tirx.And(j0 >= lows[-1], j0 + lanes <= highs[-1])]
        if s_global:
            first = _coords(s_starts, a["src"].index, [*idx, j0])
            for c, n in zip(first, src.shape):
                whole.append(tirx.And(c >= 0, c < extent(n)))
            whole.append(first[-1] + lanes <= extent(src.shape[-1]))
        with low.kb.if_(all_of(whole)):
            with low.kb.loop(low.name("v"), lanes, kind="vectorized") as v:
                at = [*idx, j0 + v]
                value = src[tuple(_coords(s_starts, a["src"].index, at))]
                _store(low, dst, _coords(d_starts, a["dst"].index, at),
                       ew.convert(value, low.dtype(src), low.dtype(dst), low.bind))
        with low.kb.else_(), low.kb.loop(low.name("v"), lanes) as v:
            with low.kb.if_(tirx.And(j0 + v >= lows[-1], j0 + v < highs[-1])):
                masked_element([*idx, j0 + v])
