"""``jt.pipelined(n, stages=s)`` loops as multi-buffered ``cp.async`` pipelines, printed from
the schedule the pipelining pass wrote into the IR (:func:`..copy_schedule.schedule_async_copies`).

Each staged buffer has ``stages`` copies (its ``stages`` attribute). An ``async_issue`` op
prints the loop's :data:`..copy_schedule.ISSUED` ops (its staged copies, as ``cp.async``
where the copy moves aligned 8- or 16-byte vectors, and the scalar arithmetic of their
origins, recomputed) for iteration ``k + tile`` into stage ``(k + tile) % stages``, inside
``if (k + tile < n)`` when guarded; ``async_commit`` and ``async_wait`` print the device
header's ``cp_async_commit`` and ``cp_async_wait<count>``. The prologue ops stand right before
the loop; the loop's body is its schedule then the compute, which is printed as written with
its staged copies left out and the barriers the barrier pass put there.
"""

from __future__ import annotations

from collections.abc import Sequence

from ... import ir
from ..copy_schedule import ISSUED, split_schedule
from .context import Context


def lower_pipelined(low, stmt: ir.For, prologue: Sequence[ir.Op]) -> None:
    """Print the scheduled loop ``stmt`` after its ``prologue`` ops. ``low`` is the kernel's
    lowering (for its statement emitter)."""
    cx: Context = low.cx
    stages = stmt.stages
    start, extent = cx.operand(stmt.start), cx.operand(stmt.extent)
    schedule, compute = split_schedule(stmt)
    head = [s for s in stmt.body if isinstance(s, ir.Op) and s.notes.get(ISSUED)]
    staged = sorted({op.attrs["dst"].buffer for op in head if op.kind == "copy"})
    cx.w(f"// pipelined loop: {stages} stages of {', '.join(staged)}, cp.async")

    def issue(tile: str) -> None:
        """The staged copies of iteration ``tile`` (their scalars recomputed for it)."""
        saved = dict(cx.names)
        with cx.w.block():
            var = cx.define(stmt.var)
            cx.w(f"const int {var} = {start} + ({tile});")
            cx.stage_index = f"({tile}) % {stages}"
            cx.async_copies = True
            for op in head:
                low.op(op)
            cx.async_copies = False
        cx.names = saved

    def step(op: ir.Op, k: str | None) -> None:
        """One schedule op, for iteration ``k`` (None in the prologue: ``k`` = 0)."""
        if op.kind != "async_issue":
            low.op(op)
            return
        tile = str(op.attrs["tile"]) if k is None else f"{k} + {op.attrs['tile']}"
        if op.attrs["guard"]:
            with cx.w.block(f"if ({tile} < {extent})"):
                issue(tile)
        else:
            issue(tile)

    for op in prologue:
        step(op, None)
    it = cx.tmp("it")
    with cx.w.block(f"for (int {it} = 0; {it} < {extent}; ++{it})"):
        cx.loop_depth += 1
        for op in schedule:
            step(op, it)
        var = cx.define(stmt.var)
        cx.w(f"const int {var} = {start} + {it};")
        cx.stage_index = f"{it} % {stages}"
        low.body(tuple(s for s in compute
                       if not (isinstance(s, ir.Op) and s.kind == "copy" and s.notes.get(ISSUED))))
        cx.loop_depth -= 1
