"""``jt.pipelined(n, stages=s)`` loops as multi-buffered ``cp.async`` pipelines.

A pipelined loop whose body starts with copies from global memory into whole shared buffers
(and the scalar arithmetic their origins need), followed by the computation, runs the
schedule of :func:`.async_pipeline.plan_pipeline`: each such shared buffer gets ``stages``
copies, the copies of iteration ``k + stages - 1`` are issued (as ``cp.async`` where the
copy moves aligned 8- or 16-byte vectors) while iteration ``k`` computes on its own buffer,
and one wait plus one barrier per iteration publish a tile and free the buffer refilled
next. The barriers the barrier pass put in the loop for the staged buffers are subsumed by
the schedule's and left out. Loops of another shape stay serial loops, which are correct
(the barrier pass has covered them).
"""

from __future__ import annotations

import math
import re

from .. import ir, op_defs
from .async_pipeline import plan_pipeline
from .context import Context

_REASON = re.compile(r" of (\w+)$")


def _prefix(stmt: ir.For, cx: Context) -> tuple[list[ir.Op], list[ir.Stmt], set[str]] | None:
    """(the leading scalar ops and copies, the rest, the staged buffers), or None when the
    body has no leading global -> shared copies."""
    head: list[ir.Op] = []
    staged: set[str] = set()
    body = list(stmt.body)
    i = 0
    while i < len(body):
        s = body[i]
        if not isinstance(s, ir.Op):
            break
        if s.kind == "copy":
            src, dst = s.attrs["src"], s.attrs["dst"]
            sb, db = cx.bufs[src.buffer], cx.bufs[dst.buffer]
            if sb.scope != "global" or db.scope != "shared" or not dst.is_whole(db.shape):
                break
            staged.add(db.name)
        elif s.kind != "barrier" and not (s.result is not None and s.result.shape == ()
                                          and s.kind in ("const", "elementwise", "convert")):
            break
        head.append(s)
        i += 1
    rest = body[i:]
    if not staged or any(_writes(s, staged) for s in ir.walk(rest)):
        return None
    return head, rest, staged


def _writes(stmt: ir.Stmt, bufs: set[str]) -> bool:
    if not isinstance(stmt, ir.Op):
        return False
    return any(r.buffer in bufs for r in op_defs.writes(stmt))


def _used_elsewhere(kernel: ir.Kernel, loop: ir.For, staged: set[str]) -> bool:
    inside = {id(s) for s in ir.walk(loop.body)}
    return any(isinstance(s, ir.Op) and id(s) not in inside
               and any(r.buffer in staged for r in ir.regions(s))
               for s in ir.walk(kernel.body))


def _staged_barrier(s: ir.Stmt, staged: set[str]) -> bool:
    if not (isinstance(s, ir.Op) and s.kind == "barrier"):
        return False
    m = _REASON.search(s.notes.get("reason", ""))
    return m is not None and m.group(1) in staged


def lower_pipelined(low, stmt: ir.For) -> bool:
    """Emit ``stmt`` as a cp.async pipeline; False (nothing emitted) when it does not have
    the shape above. ``low`` is the kernel's lowering (for its statement emitter)."""
    cx: Context = low.cx
    found = _prefix(stmt, cx)
    if stmt.stages < 2 or found is None or _used_elsewhere(low.kernel, stmt, found[2]):
        return False
    head, rest, staged = found
    stages = stmt.stages
    plan = plan_pipeline(stages, stmt.extent if isinstance(stmt.extent, int) else None)
    start, extent = cx.operand(stmt.start), cx.operand(stmt.extent)
    for name in staged:
        cx.stages[name] = (stages, math.prod(cx.bufs[name].shape))
    cx.w(f"// pipelined loop: {stages} stages of {', '.join(sorted(staged))}, cp.async")

    def issue(tile: str) -> None:
        """The head's copies of iteration ``tile`` (its scalars recomputed for it)."""
        saved = dict(cx.names)
        with cx.w.block():
            var = cx.define(stmt.var)
            cx.w(f"const int {var} = {start} + ({tile});")
            cx.stage_index = f"({tile}) % {stages}"
            cx.async_copies = True
            for op in head:
                if op.kind != "barrier":
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
                for op in head:
                    if op.kind != "copy" and op.kind != "barrier":
                        low.op(op)
                low.body(tuple(s for s in rest if not _staged_barrier(s, staged)))
        cx.loop_depth -= 1
    cx.w("cp_async_wait<0>();")
    return True
