"""Elementwise fusion: decide which tile values are computed inside their consumers.

A fused ("inline") value is never stored anywhere; each consumer recomputes it per element.
That is what a fused elementwise map is on any target. A value is fused when

- it is a tile (scalars are always computed once where they are defined),
- it is produced by a pure, per-element op (const, iota, broadcast, reshape, transpose,
  convert, select, elementwise, load),
- every use sits in the same statement list as the definition (not inside a nested loop or
  conditional, where it would be recomputed per iteration),
- it has one use, or it is a leaf-like op (const, iota, broadcast, convert, load, reshape,
  transpose) that is cheap to recompute per use, or one cheap arithmetic op (not in
  ``op_defs.EXPENSIVE``) of fused leaf-like values and scalars, such as ``x + bias``: its
  uses within one expression are merged again by common subexpression elimination, and
  storing it would cost a pass over the tile,
- nothing between the definition and its last use writes a buffer that it (or a fused
  operand) reads, so the recomputed value is the one the program defined,
- and the fused expression it makes nests at most :data:`MAX_DEPTH` levels deep.

The pass returns a new kernel whose fused ops carry the note ``inline=True``; the kernel
it is given is left as it was.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from .. import ir, op_defs

MAX_DEPTH = 48
"""Fused ops nested deeper than this inside one expression are materialised instead:
lowerings expand fused values recursively (as do TVM's expression visitors), and a few
hundred levels would exhaust Python's stack."""

_FUSIBLE = frozenset(d.kind for d in op_defs.OPS.values() if d.pure and d.one_at_a_time)
"""Pure ops whose result elements can be computed one at a time (not reductions and
scans, which need their whole operand)."""


def _writes(stmt: ir.Stmt) -> set[str]:
    return {r.buffer for s in ir.walk([stmt]) if isinstance(s, ir.Op)
            for r in op_defs.writes(s)}


_LEAF_LIKE = frozenset({"const", "iota", "broadcast", "convert", "load", "reshape",
                        "transpose"})


def _expensive(op: ir.Op) -> bool:
    return op.kind == "elementwise" and op.attrs["fn"] in op_defs.EXPENSIVE


def _fuse_list(body: Sequence[ir.Stmt], counts: Counter, reads: dict[int, tuple],
               fused: set[int]) -> None:
    """Add to ``fused`` the result ids of the ops to fuse. ``reads[v]``: (buffers v's inline
    tree reads, the regions of its loads, the buffers whose elements reach v through an op
    that moves elements around, such as a broadcast)."""
    where: dict[int, list[int]] = {}
    for pos, stmt in enumerate(body):
        for sub in ir.walk([stmt]):
            for v in ir.uses(sub):
                where.setdefault(v.id, []).append(pos if sub is stmt else -1 - pos)
    writes = [_writes(stmt) for stmt in body]
    ops = {s.result.id: s for s in body if isinstance(s, ir.Op) and s.result is not None}
    for pos, stmt in enumerate(body):
        if isinstance(stmt, ir.For):
            _fuse_list(stmt.body, counts, reads, fused)
            continue
        if isinstance(stmt, ir.If | ir.While):
            for block in ir.blocks(stmt):
                _fuse_list(block, counts, reads, fused)
            continue
        res = stmt.result
        if res is None:
            continue
        own: set[str] = set()
        aligned: set[ir.Region] = set()
        moved: set[str] = set()
        for v in stmt.operands:
            v_own, v_aligned, v_moved = reads.get(v.id, (set(), set(), set()))
            own, aligned, moved = own | v_own, aligned | v_aligned, moved | v_moved
        if stmt.kind == "load":
            own = {stmt.attrs["src"].buffer}
            aligned = {stmt.attrs["src"]}
        elif not op_defs.get(stmt.kind).per_element:
            moved = own  # moves elements around (broadcast, transpose...) of what it reads
        positions = where.get(res.id, [])
        if (stmt.kind not in _FUSIBLE or res.shape == () or not positions
                or any(p < 0 for p in positions)
                # Recomputing per use multiplies work: only leaf-like ops may be shared, and
                # an expensive op must not be repeated by a broadcast consumer.
                or (counts[res.id] > 1 and stmt.kind not in _LEAF_LIKE
                    and not _cheap_of_leaves(stmt, ops, fused))):
            continue
        last = max(positions)
        consumer = body[last]
        if _expensive(stmt) and isinstance(consumer, ir.Op) and consumer.kind == "broadcast":
            continue
        if any(own & writes[p] for p in range(pos + 1, last)):
            continue
        if own & writes[last] and not _same_place(body[last], aligned, moved):
            continue
        fused.add(res.id)
        reads[res.id] = (own, aligned, moved)


def _cheap_of_leaves(op: ir.Op, ops: dict[int, ir.Op], fused: set[int]) -> bool:
    """An elementwise op outside ``op_defs.EXPENSIVE`` whose tile operands are fused
    leaf-like ops of the same list."""
    return op.kind == "elementwise" and not _expensive(op) and all(
        v.shape == () or (v.id in fused and v.id in ops and ops[v.id].kind in _LEAF_LIKE)
        for v in op.operands)


def _same_place(consumer: ir.Stmt, aligned: set[ir.Region], moved: set[str]) -> bool:
    """Whether a store may recompute a value that reads the buffer it writes: only when each
    element of that buffer is read at exactly the place it is written (other buffers, such
    as a broadcast bias, may be read anywhere)."""
    if not isinstance(consumer, ir.Op) or consumer.kind != "store":
        return False
    target = consumer.attrs["dst"]
    return target.buffer not in moved and all(
        region == target for region in aligned if region.buffer == target.buffer)


def _limit_depth(body: Sequence[ir.Stmt], fused: set[int]) -> None:
    """Drop from ``fused`` the ops whose fused expression would nest deeper than
    :data:`MAX_DEPTH` (which keeps every guarantee of the pass)."""
    depth: dict[int, int] = {}
    for stmt in ir.walk(body):
        if isinstance(stmt, ir.Op) and stmt.result is not None and stmt.result.id in fused:
            d = 1 + max((depth.get(v.id, 0) for v in stmt.operands), default=0)
            if d > MAX_DEPTH:
                fused.discard(stmt.result.id)
            else:
                depth[stmt.result.id] = d


def _annotate(op: ir.Op, fused: set[int]) -> list[ir.Op]:
    return [op.with_notes(inline=True) if op.result is not None and op.result.id in fused
            else op]


def fuse_elementwise(kernel: ir.Kernel) -> ir.Kernel:
    """Note the ops whose values are recomputed in their consumers (see module doc).

    Assumes a verified kernel; guarantees that an ``inline`` op is pure, produces a tile,
    and is only used in its own statement list after its definition with no intervening
    write to what it reads.
    """
    counts = Counter(v.id for stmt in ir.walk(kernel.body) for v in ir.uses(stmt))
    fused: set[int] = set()
    _fuse_list(kernel.body, counts, {}, fused)
    _limit_depth(kernel.body, fused)
    return dataclasses.replace(kernel, body=ir.map_ops(kernel.body,
                                                       lambda op: _annotate(op, fused)))
