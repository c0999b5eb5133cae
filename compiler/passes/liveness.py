"""Liveness of materialised tile values, and buffer sharing between values that never
overlap: what every target needs to keep a kernel's scratch memory (the CPU's stack and heap
arrays, a GPU's shared memory) from growing with the length of its body.

Statements are numbered in program order (a pre-order walk, so a loop's or conditional's
body follows it). A value is *live* from the statement that defines it to the last one that
reads it, where

- a read through a fused (``inline``) op happens wherever that op is expanded, i.e. at the
  reads of its result, transitively;
- a read inside a loop of a value defined outside that loop keeps it live until the loop
  ends, because the next iteration reads it again.

Intervals are closed: a value's storage may be reused only by a value defined *after* its
last read, so no op ever writes the storage of a value it is still reading. This is an
analysis, not a transformation: it never changes the kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable

from .. import ir


@dataclasses.dataclass(frozen=True)
class Interval:
    """Where a materialised value is live: statements ``start`` to ``end`` (inclusive)."""

    value: ir.Value
    start: int
    end: int


def is_materialised(op: ir.Op) -> bool:
    """Whether a lowering stores ``op``'s result: a tile value that is not fused into its
    consumers (scalars live in registers, ``inline`` values are recomputed per use)."""
    return op.result is not None and op.result.shape != () and not op.notes.get("inline")


def live_intervals(kernel: ir.Kernel,
                   materialised: Callable[[ir.Op], bool] = is_materialised,
                   ) -> list[Interval]:
    """The live interval of every value whose defining op satisfies ``materialised``, in
    order of definition (see the module doc).

    Assumes a verified kernel whose fused ops carry the note ``inline`` (the fusion pass
    has run). Iterative, so bodies of any length are fine.
    """
    order: list[tuple[ir.Stmt, tuple[int, ...]]] = []   # (stmt, enclosing loops' positions)
    loop_end: dict[int, int] = {}
    stack: list[tuple[list[ir.Stmt], int, tuple[int, ...]]] = [(kernel.body, 0, ())]
    open_loops: list[int] = []
    while stack:
        body, i, loops = stack.pop()
        # Close the loops whose bodies are finished: they end at the last statement so far.
        while open_loops and open_loops[-1] not in loops:
            loop_end[open_loops.pop()] = len(order) - 1
        if i >= len(body):
            continue
        stmt = body[i]
        pos = len(order)
        order.append((stmt, loops))
        stack.append((body, i + 1, loops))
        if isinstance(stmt, ir.For):
            open_loops.append(pos)
            stack.append((stmt.body, 0, loops + (pos,)))
        elif isinstance(stmt, ir.While):
            # Both blocks repeat: values from outside live through the whole loop.
            open_loops.append(pos)
            stack.append((stmt.body, 0, loops + (pos,)))
            stack.append((stmt.cond, 0, loops + (pos,)))
        elif isinstance(stmt, ir.If):
            stack.append((stmt.otherwise, 0, loops))
            stack.append((stmt.then, 0, loops))
    while open_loops:
        loop_end[open_loops.pop()] = len(order) - 1

    defined: dict[int, int] = {}
    ops: dict[int, ir.Op] = {}
    for pos, (stmt, _) in enumerate(order):
        if isinstance(stmt, ir.Op) and stmt.result is not None:
            defined[stmt.result.id] = pos
            ops[stmt.result.id] = stmt

    # Raw read positions; a fused op forwards the reads of its result to its operands.
    # Consumers follow their producers, so a reverse sweep sees every read of a fused
    # result before it forwards them.
    reads: dict[int, list[int]] = {}
    for pos in range(len(order) - 1, -1, -1):
        stmt = order[pos][0]
        fused = isinstance(stmt, ir.Op) and stmt.notes.get("inline")
        where = reads.get(stmt.result.id, []) if fused else [pos]
        for v in ir.uses(stmt):
            reads.setdefault(v.id, []).extend(where)

    def extended(read: int, start: int) -> int:
        for loop in order[read][1]:   # outermost first
            if not loop <= start <= loop_end[loop]:
                return loop_end[loop]
        return read

    intervals = []
    for vid, start in defined.items():
        op = ops[vid]
        if not materialised(op):
            continue
        end = max((extended(r, start) for r in reads.get(vid, ())), default=start)
        intervals.append(Interval(op.result, start, max(start, end)))
    return intervals


def share_storage(intervals: list[Interval],
                  kind: Callable[[ir.Value], Hashable]) -> dict[int, int]:
    """Assign each value (by id) a storage slot, so that values of one ``kind`` (e.g. shape
    and dtype) share a slot when their intervals do not overlap.

    Greedy by start, which for intervals uses the fewest slots per kind. Slots are numbered
    from 0 in order of first use; every value of a slot has the same kind.
    """
    free_at: dict[Hashable, list[tuple[int, int]]] = {}   # kind -> [(end, slot)]
    slots: dict[int, int] = {}
    count = 0
    for iv in sorted(intervals, key=lambda iv: iv.start):
        pool = free_at.setdefault(kind(iv.value), [])
        reusable = [k for k, (end, _) in enumerate(pool) if end < iv.start]
        if reusable:
            _, slot = pool.pop(reusable[0])
        else:
            slot, count = count, count + 1
        pool.append((iv.end, slot))
        slots[iv.value.id] = slot
    return slots
