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

Buffers (a GPU's shared buffers, written and read through regions) have lifetimes on the same
numbering (:func:`buffer_lifetimes`), so the shared-memory plan and the values' storage
agree on what "live" means.

Intervals are closed: a value's storage may be reused only by a value defined *after* its
last read, so no op ever writes the storage of a value it is still reading. This is an
analysis, not a transformation: it never changes the kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Sequence

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


@dataclasses.dataclass(frozen=True)
class ProgramOrder:
    """A body's statements numbered in pre-order, each with its enclosing loops."""

    stmts: list[tuple[ir.Stmt, tuple[int, ...]]]
    """Statement number -> (statement, numbers of the enclosing loops, outermost first)."""
    loop_end: dict[int, int]
    """Loop number -> number of the last statement of its body (its own if empty)."""

    def whole_loops(self, pos: int) -> tuple[int, int]:
        """Statement ``pos`` stretched over its outermost enclosing loop, from the loop
        statement to the loop's last statement (every iteration runs it again)."""
        loops = self.stmts[pos][1]
        return (loops[0], self.loop_end[loops[0]]) if loops else (pos, pos)


def program_order(stmts: Sequence[ir.Stmt]) -> ProgramOrder:
    """Number ``body``'s statements in pre-order (a loop's or conditional's blocks follow
    it; a ``While``'s condition, then its body). Iterative, so bodies of any length are
    fine."""
    order: list[tuple[ir.Stmt, tuple[int, ...]]] = []   # (stmt, enclosing loops' positions)
    loop_end: dict[int, int] = {}
    stack: list[tuple[Sequence[ir.Stmt], int, tuple[int, ...]]] = [(list(stmts), 0, ())]
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

    return ProgramOrder(order, loop_end)


def live_intervals(kernel: ir.Kernel,
                   materialised: Callable[[ir.Op], bool] = is_materialised,
                   ) -> list[Interval]:
    """The live interval of every value whose defining op satisfies ``materialised``, in
    order of definition (see the module doc).

    Assumes a verified kernel whose fused ops carry the note ``inline`` (the fusion pass
    has run)."""
    numbered = program_order(kernel.body)
    order, loop_end = numbered.stmts, numbered.loop_end
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


def buffer_lifetimes(stmts: Sequence[ir.Stmt], touched: Callable[[ir.Op], Iterable[str]],
                     ) -> dict[str, tuple[int, int]]:
    """First and last statement (numbers of :func:`program_order`) of each buffer some op of
    ``stmts`` touches (``touched``: the names an op touches). A buffer is written and read
    through regions rather than defined once, so it has no defining statement: one touched
    inside a loop is live for the whole outermost loop around it, since the next iteration
    touches it again (and a pipelined loop's copies land in one stage while others are
    read)."""
    numbered = program_order(stmts)
    spans: dict[str, tuple[int, int]] = {}
    for pos, (stmt, _) in enumerate(numbered.stmts):
        if not isinstance(stmt, ir.Op):
            continue
        first, last = numbered.whole_loops(pos)
        for name in touched(stmt):
            lo, hi = spans.get(name, (first, last))
            spans[name] = (min(lo, first), max(hi, last))
    return spans


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
