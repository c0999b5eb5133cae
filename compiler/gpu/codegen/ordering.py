"""GPU lowering of memory ordering between blocks: ``load_acquire``, ``store_release`` and
``fence`` (``ld.acquire.gpu``, ``st.release.gpu``, ``fence.acq_rel.gpu`` in the device
header).

An acquire load is made by every thread, like any scalar read: each thread's own later reads
are ordered after it. A release store and a fence must order the writes of *all* the block's
threads (a tile store is spread over them), so they start with a barrier, after which one
release by thread 0 (or every thread's fence) covers them: a barrier makes the other
threads' writes visible to the releasing thread, and release is cumulative. So both must be
reached by the whole block; inside a ``jt.while_`` whose condition reads a flag the lowering
of the loop rejects the barrier.
"""

from __future__ import annotations

from ... import ir
from . import scalar_math as M
from . import types as T
from .context import Context


def _flag(cx: Context, region: ir.Region) -> tuple[ir.Buffer, str]:
    index, _ = cx.address(region, [], clamp=True, checked=())
    return cx.bufs[region.buffer], index


def lower_load_acquire(cx: Context, op: ir.Op) -> None:
    buf, index = _flag(cx, op.attrs["src"])
    value = T.from_memory(f"load_acquire({buf.name} + {index})", buf.dtype)
    cx.w(f"const {T.reg(op.result.dtype)} {cx.define(op.result)} = {value};")


def lower_store_release(cx: Context, op: ir.Op) -> None:
    buf, index = _flag(cx, op.attrs["dst"])
    v = op.operands[0]
    cx.w("sync_threads();  // every thread's earlier writes, before thread 0 releases them")
    value = T.to_memory(M.convert(cx.name(v), v.dtype, buf.dtype), buf.dtype)
    cx.w(f"if (tid == 0) store_release({buf.name} + {index}, {T.mem(buf.dtype)}({value}));")


def lower_fence(cx: Context, op: ir.Op) -> None:
    del op
    cx.w("sync_threads();  // every thread's earlier accesses, before the fences")
    cx.w("fence();")
