"""TMA stores: which copies from shared memory to a global output the tensor memory
accelerator makes, and where the issuing thread waits for them.

On a target with TMA (``GpuCaps.tma``: sm_90 on) a ``copy`` qualifies as a TMA store when

- its source is a whole, plain row-major shared buffer of rank 2 (not mma.sync's XOR layout
  nor wgmma's canonical one, not multi-buffered by a pipeline): a TMA box without swizzle
  reads exactly that, densely, from its 128-byte aligned start (:data:`.smem_plan.ALIGN`);
- its destination is a 2-D or 3-D global buffer of static shape whose rows are a multiple of
  16 bytes (TMA's stride rule, as for loads: an f16 row of 999 elements is not), the tile's
  two dimensions are the buffer's last two (a 3-D buffer's first index is one element), and
  every start is a scalar;
- it converts nothing, and the box fits TMA: each extent at most 256, the innermost a
  multiple of 16 bytes;
- nothing else in the kernel reads or writes the destination buffer: the async proxy's global
  writes would need their own ordering against those accesses, which this pass does not
  write.

A ragged edge needs no mask: TMA clips the parts of a box past the tensor's edges. A copy
from a register fragment to global memory is not a candidate: the pass invents no staging
buffer (the program stages through shared memory where it wants a TMA store: cast the
accumulator into a shared tile, then copy the tile out).

The decision is the op: the copy becomes a ``tma_store`` (same ``src`` and ``dst``) with the
notes ``tma_box`` (innermost first) and ``tma_swizzle`` (0), whose lowering is one elected
thread issuing the store and committing it as a bulk async-group; its tensor map is one of
the kernel's (:func:`.tma.tensor_maps`, one per buffer, box and swizzle, loads and stores
alike). Around it:

- the async proxy reads the source: the barrier pass (:func:`.barriers.async_proxy_reads`)
  puts a barrier with ``proxy_fence`` (``fence.proxy.async`` by the writers, then the block
  barrier) between the generic writes of the tile and the store, which it needs anyway as
  the issuing thread reads what all threads wrote;
- the source may be written again only once the store has read it (PTX ISA,
  ``cp.async.bulk.wait_group``: with ``.read``, the wait ends when the group's source reads
  are done). This pass places a ``tma_store_wait`` (the issuing thread's
  ``bulk_wait_group_read<0>``) before the first later statement that writes bytes the source
  occupies (the buffer, another buffer the shared-memory plan puts on the same bytes, an op's
  scratch there; a pipeline's prologue counts as writing, since its staged copies stand in
  the loop after it, and the wait goes before a TMA ring's set-up); in a loop whose body
  writes them, at the end of the body too (the next iteration's write); and at the kernel's
  end if a store is still pending there, since the block's shared memory must outlive the
  read. The barrier pass then orders the other
  threads' write after the wait (the store's read is "any thread's").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from .. import ir, op_defs
from ..errors import KernelError
from ..sizes import is_static
from ..target import GpuCaps
from . import tma
from .copy_schedule import ISSUE_KINDS
from .ring_setup import INIT
from .smem_plan import recorded_bytes, scratch_bytes

STORE = "tma_store"
"""The op kind of a copy made a TMA store."""
WAIT = "tma_store_wait"
"""The op kind of the issuing thread's wait for its TMA stores (``count``: groups left)."""


def store_box(op: ir.Op, bufs: Mapping[str, ir.Buffer]) -> tuple[int, ...] | None:
    """The box (innermost dimension first) of copy ``op`` as a TMA store, or None when it
    cannot be one (module docstring; the "nothing else touches the output" rule is the
    pass's)."""
    src, dst = op.attrs["src"], op.attrs["dst"]
    sb, db = bufs[src.buffer], bufs[dst.buffer]
    if sb.scope != "shared" or db.scope != "global" or sb.dtype != db.dtype:
        return None
    size = np.dtype(sb.dtype).itemsize
    if (size not in (1, 2, 4, 8) or len(sb.shape) != 2 or not src.is_whole(sb.shape)
            or sb.attrs.get("swizzle") or sb.attrs.get("wgmma_swizzle")
            or sb.attrs.get("stages", 1) != 1
            or len(db.shape) not in (2, 3) or not is_static(db.shape)
            or db.shape[-1] * size % 16
            or any(isinstance(i.start, ir.Value) and i.start.shape != () for i in dst.index)):
        return None
    rows, cols = sb.shape
    *outer, row_index, col_index = dst.index
    if (col_index.size != cols or (row_index.size or 1) != rows
            or any((i.size or 1) != 1 for i in outer)):
        return None
    box = (cols, rows, *([1] * len(outer)))
    if any(b > tma.MAX_BOX for b in box) or cols * size % 16:
        return None
    return box


def _other_users(kernel: ir.Kernel, candidates: set[int]) -> set[str]:
    """Buffers that an op other than a candidate reads or writes."""
    return {r.buffer for s in ir.walk(kernel.body) if isinstance(s, ir.Op)
            and id(s) not in candidates for r in ir.regions(s)}


class _Placer:
    """Places the waits (module docstring) over a body whose candidate copies are known."""

    def __init__(self, kernel: ir.Kernel, boxes: dict[int, tuple[int, ...]]):
        self.boxes = boxes
        self.bufs = {b.name: b for b in kernel.buffers}
        offsets, sizes = recorded_bytes(kernel)
        self.spans = {n: (at, at + sizes[n]) for n, at in offsets.items()}

    def _span(self, buffer: str) -> tuple[str, tuple[int, int] | None]:
        return buffer, self.spans.get(buffer)

    def _writes(self, stmt: ir.Stmt, pending: list[tuple[str, tuple[int, int] | None]]) -> bool:
        """Whether ``stmt`` (anywhere inside) writes bytes of a pending store's source."""
        for s in ir.walk((stmt,)):
            if not isinstance(s, ir.Op):
                continue
            if s.kind in ISSUE_KINDS and s.attrs["prologue"]:
                # A pipeline's prologue fills stages the plan may put on the source's bytes;
                # its copies stand in the loop after it: count it as writing them all.
                return True
            written = [self._span(r.buffer) for r in op_defs.writes(s)
                       if self.bufs[r.buffer].scope == "shared"]
            written += [(f"{s.kind} {role}", (lo, hi)) for role, lo, hi in scratch_bytes(s)]
            for name, span in written:
                for src, at in pending:
                    if name == src or (span is not None and at is not None
                                       and span[0] < at[1] and at[0] < span[1]):
                        return True
        return False

    @staticmethod
    def _wait(line: str | None) -> ir.Op:
        return ir.Op(WAIT, (), None, {"count": 0}, line)

    def body(self, body: tuple[ir.Stmt, ...], pending: list
             ) -> tuple[list[ir.Stmt], list]:
        """The body with its stores and waits, and the sources still pending after it."""
        out: list[ir.Stmt] = []
        pending = list(pending)
        for i, stmt in enumerate(body):
            if pending and (self._writes(stmt, pending) or _ring_setup_at(body, i)):
                out.append(self._wait(getattr(stmt, "line", None)))
                pending = []
            if isinstance(stmt, ir.Op):
                if id(stmt) in self.boxes:
                    stmt = dataclasses.replace(stmt, kind=STORE).with_notes(
                        **{tma.BOX: self.boxes[id(stmt)], tma.SWIZZLE: 0})
                    pending.append(self._span(stmt.attrs["src"].buffer))
                out.append(stmt)
            elif isinstance(stmt, (ir.For, ir.While)):
                new_blocks, after = [], list(pending)
                for block in ir.blocks(stmt):
                    new, end = self.body(block, after)
                    after = end
                    new_blocks.append(new)
                # The next iteration writes the source again: wait at the end of this one.
                if after and any(self._writes(s, after) for b in ir.blocks(stmt) for s in b):
                    new_blocks[-1].append(self._wait(stmt.line))
                    after = []
                out.append(ir.with_blocks(stmt, new_blocks))
                pending = _union(pending, after)
            else:
                new_blocks, ends = [], []
                for block in ir.blocks(stmt):
                    new, end = self.body(block, pending)
                    new_blocks.append(new)
                    ends.append(end)
                out.append(ir.with_blocks(stmt, new_blocks))
                for end in ends:
                    pending = _union(pending, end)
        return out, pending


def _ring_setup_at(body: tuple[ir.Stmt, ...], i: int) -> bool:
    """Whether a TMA ring's set-up (:mod:`.ring_setup`) starts at ``body[i]``: a wait for its
    prologue goes before it, which stays adjacent to the prologue."""
    return (i + 1 < len(body) and isinstance(body[i], ir.Op) and body[i].kind == "barrier"
            and isinstance(body[i + 1], ir.Op) and body[i + 1].kind == INIT)


def _union(a: list, b: list) -> list:
    return a + [x for x in b if x not in a]


def plan_tma_stores(kernel: ir.Kernel, caps: GpuCaps) -> ir.Kernel:
    """The TMA-store pass (module docstring): on a target with ``caps.tma``, each qualifying
    copy from shared to global memory becomes a ``tma_store`` op noted with its box, and
    ``tma_store_wait`` ops go before the next write of its source's bytes and at the kernel's
    end. Other copies, and every kernel on a target without TMA or with dynamic sizes, are
    unchanged.

    Assumes: the shared-memory plan placed the buffers and scratch (so that bytes two of them
    share count as one); the barrier pass runs next. Guarantees: every ``tma_store`` is
    followed, on every path, by a ``tma_store_wait`` before any write of its source's bytes
    and before the kernel ends (:func:`verify_tma_stores`)."""
    if not caps.tma or kernel.dynamic:
        return kernel
    bufs = {b.name: b for b in kernel.buffers}
    copies = {id(s): (s, box) for s in ir.walk(kernel.body) if isinstance(s, ir.Op)
              and s.kind == "copy" and (box := store_box(s, bufs)) is not None}
    taken = _other_users(kernel, set(copies))
    boxes = {k: box for k, (s, box) in copies.items() if s.attrs["dst"].buffer not in taken}
    if not boxes:
        return kernel
    body, pending = _Placer(kernel, boxes).body(kernel.body, [])
    if pending:
        body.append(_Placer._wait(None))
    return dataclasses.replace(kernel, body=tuple(body))


def verify_tma_stores(kernel: ir.Kernel) -> ir.Kernel:
    """The TMA-store rule, checked after the pass and every later one (under
    ``JAXTILE_VERIFY_IR``): on every path, no statement writes bytes of a ``tma_store``'s
    source between the store and a ``tma_store_wait`` (a loop's next iteration included), and
    no store is pending at the kernel's end. Returns ``kernel`` unchanged."""
    if not any(isinstance(s, ir.Op) and s.kind == STORE for s in ir.walk(kernel.body)):
        return kernel
    placer = _Placer(kernel, {})

    def fail(what: str, line: str | None) -> KernelError:
        where = f" (at {line})" if line else ""
        return KernelError(f"kernel '{kernel.name}': {what}{where}: a TMA store may still read "
                           "its shared source there (no tma_store_wait since)")

    def walk(body: tuple[ir.Stmt, ...], pending: list) -> list:
        for stmt in body:
            if isinstance(stmt, ir.Op):
                if stmt.kind == WAIT:
                    pending = []
                elif pending and placer._writes(stmt, pending):
                    raise fail(f"{stmt.kind} writes a TMA store's source", stmt.line)
                elif stmt.kind == STORE:
                    pending = _union(pending, [placer._span(stmt.attrs["src"].buffer)])
            elif isinstance(stmt, (ir.For, ir.While)):
                entry = pending
                for _ in range(2):      # the second walk carries the first one's end
                    end = entry
                    for block in ir.blocks(stmt):
                        end = walk(block, end)
                    entry = _union(pending, end)
                pending = entry
            else:
                ends = [walk(block, pending) for block in ir.blocks(stmt)]
                for end in ends:
                    pending = _union(pending, end)
        return pending

    if walk(kernel.body, []):
        raise fail("the kernel ends with a TMA store pending", None)
    return kernel
