"""Horizontally adjacent blocks of an elementwise kernel run row by row together, for the CPU.

An elementwise kernel written with narrow tiles (``1024 x 64`` float32) reads and writes
256 bytes of each row of its tile, and the next row is 4 KiB further on: every row is a new
page for the TLB and a new stream for the prefetcher, and such a tile ran 1.4x slower than a
tile of whole rows (one thread, bias add on 8192 x 1024). When the blocks next to each
other along the grid's fastest axis hold tiles next to each other along the last
dimension, ``G`` of them can run row by row together: row ``r`` of the first block, row
``r`` of the second, ..., then row ``r + 1``: the same elements, each computed as before,
in an order that reads and writes ``G`` times longer runs of memory.

:func:`plan` decides whether a kernel qualifies and picks ``G``; the lowering
(``Lowering.run``) emits the grouped loop next to the block loop. Blocks of a grid are
independent, so the order they run in is the runtime's to choose (threads already run them
in any order).
"""

from __future__ import annotations

import dataclasses

from .. import ir
from ..analysis.affine import affine_values
from . import forwarding, rows

RUN_BYTES = 4096
"""The length of memory a group's rows should cover: one page."""


@dataclasses.dataclass(frozen=True)
class Grouping:
    """Run ``size`` consecutive blocks of the grid's axis 0 together, ``rows`` rows each:
    the kernel body's scalar ops (``scalars``), then row by row the ``forwarded`` statements
    of its one forwarded ``segment``."""

    size: int
    rows: int
    segment: forwarding.Segment
    scalars: tuple[ir.Op, ...]
    forwarded: tuple[ir.Op, ...]


def plan(kernel: ir.Kernel) -> Grouping | None:
    """How to group ``kernel``'s blocks (see the module doc), or ``None``.

    A kernel qualifies when its grid is static with an axis 0 of at least two blocks; its
    body is scalar ops around one forwarded segment (:mod:`.forwarding`) that covers every
    other statement and can run row by row (:func:`.rows.separable`); block index 0 is used
    only as ``b0 * C`` for the start of the last dimension of forwarded regions whose size
    there is ``C`` (so block ``b0 + 1``'s tile is the next one to the right); and those
    regions' rows are shorter than :data:`RUN_BYTES`. ``size`` divides axis 0 of the grid,
    so a group's blocks share their other indices. Guarantees: with ``b0`` replaced by
    ``b0 + q`` for ``q`` in ``0..size``, running the segment row by row interleaved over
    ``q`` computes what the blocks compute one after another.
    """
    grid = kernel.grid
    if not grid or not all(isinstance(n, int) for n in grid) or grid[0] < 2:
        return None
    body = kernel.body
    segment = forwarding.plan(kernel, body)
    if segment is None or not all(isinstance(s, ir.Op) for s in body):
        return None
    if any(not _scalar(s) for i, s in enumerate(body)
           if not segment.first <= i <= segment.last):
        return None
    forwarded = [s for i, s in enumerate(body[segment.first:segment.last + 1], segment.first)
                 if i not in segment.skip and not _scalar(s)]
    n_rows = rows.separable(forwarded)
    if n_rows is None:
        return None
    regions = [r for f in segment.forwards for r in (f.src, f.dst) if r is not None]
    row_bytes = _adjacent_row_bytes(kernel, regions)
    if row_bytes is None or row_bytes >= RUN_BYTES:
        return None
    size = max(g for g in range(1, grid[0] + 1)
               if grid[0] % g == 0 and g * row_bytes <= RUN_BYTES)
    if size == 1:
        return None
    return Grouping(size, n_rows, segment, tuple(s for s in body if _scalar(s)),
                    tuple(forwarded))


def _scalar(stmt: ir.Stmt) -> bool:
    return isinstance(stmt, ir.Op) and stmt.result is not None and stmt.result.shape == () \
        and not ir.regions(stmt)


def _adjacent_row_bytes(kernel: ir.Kernel, regions: list[ir.Region]) -> int | None:
    """The longest row (bytes in the last dimension) of ``regions`` when block index 0 moves
    every one of them right by its own width and is used for nothing else, else ``None``."""
    # Values that are ``b0 * width`` (the shared affine evaluator's forms of block axis 0
    # with no offset): value -> the width it moves a region by, per block.
    offsets = {v: scale for v, (axis, scale, offset) in affine_values(kernel).items()
               if axis == 0 and scale > 0 and offset == 0}
    # Those values are used only to compute one another and as starts of a last dimension
    # of the width they move by.
    for stmt in ir.walk(kernel.body):
        for p in {v.id for v in ir.uses(stmt)} & offsets.keys():
            if not isinstance(stmt, ir.Op):
                return None
            if stmt.result is not None and stmt.result.id in offsets:
                continue
            if any(v.id == p for v in stmt.operands) or not all(
                    _moves_last_dim(r, p, offsets[p]) for r in ir.regions(stmt)
                    if p in {v.id for v in r.values()}):
                return None
    widths = []
    for r in regions:
        last = r.index[-1]
        if not isinstance(last.start, ir.Value) or last.start.id not in offsets \
                or last.size != offsets[last.start.id]:
            return None
        itemsize = next(b.dtype.itemsize for b in kernel.buffers if b.name == r.buffer)
        widths.append(last.size * itemsize)
    return max(widths) if widths else None


def _moves_last_dim(region: ir.Region, value_id: int, width: int) -> bool:
    *rest, last = region.index
    return isinstance(last.start, ir.Value) and last.start.id == value_id \
        and last.size == width and all(
            not (isinstance(i.start, ir.Value) and i.start.id == value_id) for i in rest)
