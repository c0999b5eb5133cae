"""``jt.pipelined(n, stages=s)`` loops as multi-buffered ``cp.async`` pipelines.

:func:`.async_pipeline.pipeline_shape` picks the loop's staged copies (global -> whole shared
buffer, anywhere at the top level of the body, with origins computable at the top of an
iteration). The loop then runs the schedule of :func:`.async_pipeline.plan_pipeline`: each
staged buffer gets ``stages`` copies; the staged copies of iteration ``k + stages - 1`` (with
the scalar arithmetic of their origins, recomputed for that iteration) are issued, as
``cp.async`` where the copy moves aligned 8- or 16-byte vectors, right after the top barrier
of iteration ``k``, while iteration ``k`` computes on its own buffers; one wait plus one
barrier per iteration publish every tile of the iteration and free the buffers refilled
next. The rest of the body is emitted as written, staged copies left out, with the barriers
the barrier pass put there (which walked the loop the same way). Other loops stay serial
loops.
"""

from __future__ import annotations

from ... import ir
from ..copy_schedule import pipeline_shape, plan_pipeline
from .context import Context


def lower_pipelined(low, stmt: ir.For) -> bool:
    """Emit ``stmt`` as a cp.async pipeline; False (nothing emitted) when it is not one.
    ``low`` is the kernel's lowering (for its statement emitter)."""
    cx: Context = low.cx
    shape = pipeline_shape(low.kernel, stmt)
    if shape is None:
        return False
    stages = shape.stages
    plan = plan_pipeline(stages, stmt.extent if isinstance(stmt.extent, int) else None)
    start, extent = cx.operand(stmt.start), cx.operand(stmt.extent)
    issued = {id(op) for op in shape.copies + shape.scalars}
    head = [s for s in stmt.body if id(s) in issued]
    cx.w(f"// pipelined loop: {stages} stages of {', '.join(shape.staged)}, cp.async")

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

    for step in plan.prologue:
        if step.kind == "copy":
            if step.guard == "always":
                issue(str(step.tile))
            else:
                with cx.w.block(f"if ({step.tile} < {extent})"):
                    issue(str(step.tile))
        else:
            cx.w("cp_async_commit();")
    it = cx.tmp("it")
    with cx.w.block(f"for (int {it} = 0; {it} < {extent}; ++{it})"):
        cx.loop_depth += 1
        for step in plan.body:
            if step.kind == "wait":
                cx.w(f"cp_async_wait<{step.count}>();")
            elif step.kind == "barrier":
                cx.w("sync_threads();  // tile it is visible; the buffer refilled next is free")
            elif step.kind == "copy":
                with cx.w.block(f"if ({it} + {step.tile} < {extent})"):
                    issue(f"{it} + {step.tile}")
            elif step.kind == "commit":
                cx.w("cp_async_commit();")
            else:
                var = cx.define(stmt.var)
                cx.w(f"const int {var} = {start} + {it};")
                cx.stage_index = f"{it} % {stages}"
                low.body(tuple(s for s in stmt.body if not shape.is_staged_copy(s)))
        cx.loop_depth -= 1
    cx.w("cp_async_wait<0>();")
    return True
