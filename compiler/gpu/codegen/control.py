"""GPU lowering of ``While`` (``jt.while_``) and the uniformity of its condition.

A ``While`` becomes ``while (true) { cond; if (!test) break; body }``: the condition block is
written once, and every thread evaluates it. Scalars are computed redundantly by every
thread (``context.py``), so the condition is *block-uniform* -- every thread leaves the loop
at the same iteration, and barriers inside are legal -- unless it depends on global memory
the kernel itself writes: other blocks (or the block's own atomics) may change that memory
while the loop runs, so threads may read different values and diverge. Such a loop may hold
no barrier and no code that needs the whole block or warp (a reduction across threads, a
gemm, a read of another thread's fragment element through shared memory...): its lowering
raises a KernelError naming the loop's and the op's lines when the code it generated does.
"""

from __future__ import annotations

import re
from typing import Any

from ... import ir, op_defs
from ...errors import KernelError
from .context import source_line

_COLLECTIVE = re.compile(r"\b(sync_threads|barrier_sync|sync_warp|shfl_\w+|vote_\w+|ballot|"
                         r"ldmatrix_\w+|mma_\w+|gemm_\w+)\s*[<(]")
"""Device-header calls that all threads of a block (or warp) must reach together."""
_LINE = re.compile(r"^\s*// (\S+:\d+):")


def written_globals(kernel: ir.Kernel) -> set[str]:
    """The global buffers some op of the kernel writes."""
    bufs = {b.name: b for b in kernel.buffers}
    return {r.buffer for s in ir.walk(kernel.body) if isinstance(s, ir.Op)
            for r in op_defs.writes(s) if bufs[r.buffer].scope == "global"}


def _values(op: ir.Op) -> list[ir.Value]:
    out = list(op.operands)
    for r in ir.regions(op):
        out += [i.start for i in r.index if isinstance(i.start, ir.Value)]
    return out


def thread_varying(kernel: ir.Kernel) -> set[int]:
    """Ids of the values that may differ between the threads of a block: what is read from
    global memory the kernel writes, and what is computed from it, also through on-chip
    buffers (flow-insensitive: a buffer written with such a value taints every read of it)."""
    ops = [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op)]
    tainted_bufs = written_globals(kernel)
    varying: set[int] = set()
    changed = True
    while changed:
        changed = False
        for op in ops:
            hot = any(v.id in varying for v in _values(op)) or any(
                r.buffer in tainted_bufs for r in op_defs.reads(op))
            if not hot:
                continue
            if op.result is not None and op.result.id not in varying:
                varying.add(op.result.id)
                changed = True
            for r in op_defs.writes(op):
                if r.buffer not in tainted_bufs:
                    tainted_bufs.add(r.buffer)
                    changed = True
    return varying


def lower_while(lowering: Any, stmt: ir.While) -> None:
    """Emit ``stmt`` (``lowering`` is the kernel's ``lower._Lowering``); a KernelError if
    its condition may differ between threads and the code inside needs the whole block."""
    cx = lowering.cx
    cx.w(f"// {source_line(stmt.line)}: while")
    first = len(cx.w.lines)
    with cx.w.block("while (true)"):
        cx.loop_depth += 1
        lowering.body(stmt.cond)
        cx.w(f"if (!({cx.name(stmt.test)})) break;")
        lowering.body(stmt.body)
        cx.loop_depth -= 1
    if stmt.test.id not in thread_varying(cx.kernel):
        return
    where = source_line(stmt.line)
    for line in cx.w.lines[first:]:
        m = _LINE.match(line)
        where = m.group(1) if m else where
        call = None if line.lstrip().startswith("//") else _COLLECTIVE.search(line)
        if call is not None:
            raise KernelError(
                f"kernel '{cx.kernel.name}': the condition of the jt.while_ at "
                f"{source_line(stmt.line)} reads global memory the kernel writes, so threads "
                f"may leave the loop at different iterations, but the loop needs all threads "
                f"of the block together ({call.group(1)}, for the op at {where}); compute the "
                "condition from inputs or on-chip data")
