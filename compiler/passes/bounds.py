"""Bounds (GPU): which dimensions of a global access need a run-time check.

``copy`` and ``atomic`` give ``pad`` for reads past a global edge and drop writes past it.
The check costs a compare per element, so it is kept only where the access cannot be
proved in bounds: each region start is bounded by interval arithmetic over the values it
is computed from (block indices range over the grid, loop variables over their loop,
constants are exact, ``+ - * // min max`` combine intervals; anything read from memory is
unbounded), and a dimension is proved when ``0 <= start`` and ``start + size <= extent`` for
every value in the interval. Gather and scatter dimensions are always checked.

Writes ``notes["masks"]``: a tuple of ``(region attribute, dims)`` pairs on every ``copy``
and ``atomic`` that touches global memory (empty dims: nothing checked).

Assumes: nothing beyond a verified kernel. Guarantees: an access whose dimension is not
listed is in bounds for every block and iteration.
"""

from __future__ import annotations

import dataclasses

from .. import ir

Interval = tuple[int, int] | None


class _Ranges:
    def __init__(self, kernel: ir.Kernel):
        self.ranges: dict[int, Interval] = {}
        for v, n in zip(kernel.block_indices, kernel.grid):
            self.ranges[v.id] = (0, n - 1)

    def of(self, x: int | ir.Value) -> Interval:
        return (x, x) if isinstance(x, int) else self.ranges.get(x.id)

    def define(self, op: ir.Op) -> None:
        res = op.result
        if res is None or res.shape != () or res.dtype.kind not in "iu":
            return
        if op.kind == "const":
            self.ranges[res.id] = (int(op.attrs["value"]),) * 2
        elif op.kind == "convert" and op.operands[0].dtype.kind in "iu":
            self.ranges[res.id] = self.of(op.operands[0])
        elif op.kind == "elementwise" and len(op.operands) == 2:
            self.ranges[res.id] = _combine(op.attrs["fn"], *map(self.of, op.operands))

    def loop(self, stmt: ir.For) -> None:
        start, extent = self.of(stmt.start), self.of(stmt.extent)
        if start is None or extent is None:
            return
        self.ranges[stmt.var.id] = (start[0], start[1] + max(extent[1], 1) - 1)


def _combine(fn: str, a: Interval, b: Interval) -> Interval:
    if a is None or b is None:
        return None
    if fn == "add":
        return a[0] + b[0], a[1] + b[1]
    if fn == "sub":
        return a[0] - b[1], a[1] - b[0]
    if fn == "mul":
        products = [x * y for x in a for y in b]
        return min(products), max(products)
    if fn == "div" and b[0] > 0 and a[0] >= 0:
        return a[0] // b[1], a[1] // b[0]
    if fn == "max":
        return max(a[0], b[0]), max(a[1], b[1])
    if fn == "min":
        return min(a[0], b[0]), min(a[1], b[1])
    return None


def _checked_dims(ranges: _Ranges, region: ir.Region, shape: tuple[int, ...]) -> tuple:
    out = []
    for d, (idx, n) in enumerate(zip(region.index, shape)):
        if isinstance(idx.start, ir.Value) and idx.start.shape != ():
            out.append(d)
            continue
        r = ranges.of(idx.start)
        size = 1 if idx.size is None else idx.size
        if r is None or r[0] < 0 or r[1] + size > n:
            out.append(d)
    return tuple(out)


def _annotate(body: tuple[ir.Stmt, ...], ranges: _Ranges,
              bufs: dict[str, ir.Buffer]) -> list[ir.Stmt]:
    out: list[ir.Stmt] = []
    for stmt in body:
        if isinstance(stmt, ir.For):
            ranges.loop(stmt)
            out.append(dataclasses.replace(stmt, body=_annotate(stmt.body, ranges, bufs)))
        elif isinstance(stmt, ir.If):
            out.append(dataclasses.replace(stmt, then=_annotate(stmt.then, ranges, bufs),
                                           otherwise=_annotate(stmt.otherwise, ranges, bufs)))
        else:
            ranges.define(stmt)
            if stmt.kind in ("copy", "atomic"):
                masks = tuple((attr, _checked_dims(ranges, r, bufs[r.buffer].shape))
                              for attr, r in sorted(stmt.attrs.items())
                              if isinstance(r, ir.Region) and bufs[r.buffer].scope == "global")
                if masks:
                    stmt = stmt.with_notes(masks=masks)
            out.append(stmt)
    return out


def check_bounds(kernel: ir.Kernel) -> ir.Kernel:
    """Note which dimensions of each global copy/atomic keep a bounds check."""
    bufs = {b.name: b for b in kernel.buffers}
    body = _annotate(kernel.body, _Ranges(kernel), bufs)
    return dataclasses.replace(kernel, body=tuple(body))
