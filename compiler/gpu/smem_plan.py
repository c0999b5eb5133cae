"""Shared-memory planning: every shared buffer (and per-op scratch) gets a byte offset in the
block's one dynamic shared-memory array, buffers whose lifetimes never overlap sharing bytes.

Statements are numbered in program order (pre-order, so a loop's body follows it). A shared
buffer is live from the first to the last statement that touches it (a region attribute of
an op names it), and a buffer touched inside a loop is live for the whole loop: the next
iteration touches it again, and a pipelined loop's ``cp.async`` copies land in a stage while
other stages are read. Extra requests (reduction workspaces, layout conversions) live for
the one statement that needs them. Buffers are placed largest first at the lowest offset,
aligned to :data:`ALIGN` bytes, that overlaps no buffer live at the same time.

Sharing bytes is a hazard between the threads that last read a buffer (or an op's scratch)
and those that first write the next one: barrier insertion orders every access of
overlapping bytes as it orders the accesses of one buffer (:meth:`SmemPlan.shares` lists the
buffers that share).

The lifetimes are ``passes/liveness.py``'s (:func:`.passes.liveness.buffer_lifetimes`), the
one liveness the CPU's storage sharing uses too. Buffers that no statement touches get no
offset.

The ``smem_plan`` pass (:func:`place_shared_buffers`) writes the plan into the IR as buffer
attributes (``offset``, ``stages``) and, for the per-op scratch the ``scratch`` pass recorded,
as each request's byte offset (placed around the buffers' fixed offsets), and, for each TMA
ring (:func:`.copy_schedule.is_ring`), the offset of its mbarriers as the note
``ring_offset`` on the ring's ``tma_wait`` and on its set-up's ``mbarrier_init``:
``2 * stages`` of 8 bytes ("full", then
"empty", which only a warp-specialised ring uses: :mod:`.warp_specialise` decides later,
and 8 bytes a stage is not worth a second plan), placed after every buffer and scratch
request, since they live from the ring's set-up to its end (the whole kernel once split)
and so share bytes with nothing; barrier insertion,
the GPU verifier and code generation read it from there (:func:`recorded_bytes`,
:func:`scratch_bytes`, :func:`recorded_plan`): the barriers that bytes reused by scratch
need are barrier insertion's, like those of buffers.

Assumes: ``bytes_of`` covers every shared buffer (all stages of a multi-buffered one).
Guarantees: buffers live at the same statement never overlap; every offset is a multiple of
:data:`ALIGN` (``cp.async`` and ``ldmatrix`` need 16, 128 keeps swizzle phases aligned), and of
1024 for a wgmma operand tile (the ``wgmma_swizzle`` attribute: wgmma swizzles the absolute
address, :data:`.gemm_plan.WGMMA_ALIGN`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import KernelError
from ..ir import For, Kernel, Op, Region, Stmt, map_ops, regions, walk
from ..passes.liveness import buffer_lifetimes
from ..target import GpuCaps
from .codegen.types import sizeof
from .copy_schedule import is_ring, issued_stages, staged_buffers
from .gemm_plan import WGMMA_ALIGN
from .ring_setup import INIT as RING_INIT

ALIGN = 128


def _alignments(kernel: Kernel) -> dict[str, int]:
    """Buffers that need more than :data:`ALIGN`: wgmma operand tiles."""
    return {b.name: WGMMA_ALIGN for b in kernel.buffers if "wgmma_swizzle" in b.attrs}


@dataclasses.dataclass(frozen=True)
class Scratch:
    """Shared memory one op needs beyond the IR's buffers (e.g. a cross-warp reduction's
    workspace, a layout conversion's staging tile)."""

    name: str
    bytes: int
    op: Op


@dataclasses.dataclass(frozen=True)
class SmemPlan:
    """Where each shared buffer lives in the dynamic shared-memory array."""

    offsets: Mapping[str, int]
    sizes: Mapping[str, int]
    lifetimes: Mapping[str, tuple[int, int]]
    """First and last statement (pre-order numbers, loops extended) of each buffer."""
    total: int
    """Bytes to launch with (a multiple of :data:`ALIGN`)."""
    static_limit: int
    """Above this the launcher must raise ``cudaFuncAttributeMaxDynamicSharedMemorySize``."""
    limit: int

    @property
    def needs_opt_in(self) -> bool:
        """Whether the kernel uses more than the default 48 KB of dynamic shared memory."""
        return self.total > self.static_limit

    def shares(self) -> list[tuple[str, str]]:
        """Pairs of buffers given overlapping bytes (necessarily at different times)."""
        names = sorted(self.offsets)
        return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
                if self.offsets[a] < self.offsets[b] + self.sizes[b]
                and self.offsets[b] < self.offsets[a] + self.sizes[a]]

    def report(self) -> str:
        """One line for ``kernel.lower``, e.g. ``shared memory 49152 / 232448 bytes
        (opt-in above 49152): As@0 Bs@24576``."""
        where = " ".join(f"{n}@{o}" for n, o in sorted(self.offsets.items(), key=lambda x: x[1]))
        return (f"shared memory {self.total} / {self.limit} bytes "
                f"(opt-in above {self.static_limit}): {where}")


def lifetimes(body: Sequence[Stmt], names: set[str],
              extra: Mapping[int, list[Scratch]] | None = None) -> dict[str, tuple[int, int]]:
    """First and last statement (pre-order numbers, loops extended:
    :func:`.passes.liveness.buffer_lifetimes`) of each of the buffers ``names`` (and the
    ``extra`` scratch of each op) that ``body`` touches."""
    extra = extra or {}

    def touched(op: Op) -> set[str]:
        used = {r.buffer for r in op.attrs.values() if isinstance(r, Region) and r.buffer in names}
        return used | {s.name for s in extra.get(id(op), ())}

    return buffer_lifetimes(body, touched)


def plan_shared_memory(kernel: Kernel, bytes_of: Mapping[str, int], caps: GpuCaps,
                       extra: Sequence[Scratch] = (),
                       fixed: Mapping[str, int] | None = None) -> SmemPlan:
    """Offsets for the shared buffers ``bytes_of`` sizes (and the ``extra`` scratch) with
    reuse across disjoint lifetimes; KernelError naming the biggest buffers if the total is
    above ``caps.max_smem_bytes``.

    Ties (same size, same lifetime) go in declaration order (``kernel.buffers``, then
    ``extra``), so renaming buffers or inserting barriers never changes the plan.
    ``fixed``: offsets decided before (an earlier plan's), kept; the other buffers are
    placed around them (the smem_plan pass places the scratch around the kernel's buffers).
    Fixed ``extra`` requests keep their place in the plan's order among the other extras, so
    a plan rebuilt from recorded offsets reports them in the same order."""
    by_op: dict[int, list[Scratch]] = {}
    by_name = {s.name for s in extra}
    for s in extra:
        by_op.setdefault(id(s.op), []).append(s)
    sizes = {**bytes_of, **{s.name: s.bytes for s in extra}}
    order = {b.name: i for i, b in enumerate(kernel.buffers)}
    order.update({s.name: len(order) + i for i, s in enumerate(extra)})
    spans = lifetimes(kernel.body, set(bytes_of), by_op)
    aligns = _alignments(kernel)
    fixed = fixed or {}
    # The kernel's fixed buffers come first; extra requests, fixed or not, in placement
    # order (which the report's order of equal offsets shows).
    offsets: dict[str, int] = {n: o for n, o in fixed.items()
                               if n in spans and n not in by_name}
    for name in sorted(spans, key=lambda n: (-sizes[n], spans[n], order.get(n, 0))):
        if name in offsets:
            continue
        if name in fixed:
            offsets[name] = fixed[name]
            continue
        lo, hi = spans[name]
        busy = sorted((offsets[o], offsets[o] + sizes[o]) for o in offsets
                      if spans[o][0] <= hi and lo <= spans[o][1])
        at, align = 0, aligns.get(name, ALIGN)
        for start, end in busy:
            if at + sizes[name] <= start:
                break
            at = max(at, -(-end // align) * align)
        offsets[name] = at
    total = max((-(-(offsets[n] + sizes[n]) // ALIGN) * ALIGN for n in offsets), default=0)
    if total > caps.max_smem_bytes:
        lines = {b.name: b.line for b in kernel.buffers if b.line}
        biggest = ", ".join(f"{n} ({sizes[n]} bytes{', ' + lines[n] if n in lines else ''})"
                            for n in sorted(sizes, key=lambda n: -sizes[n])[:3])
        raise KernelError(
            f"kernel {kernel.name!r} needs {total} bytes of shared memory, more than the "
            f"{caps.max_smem_bytes} an {caps.arch} block can have; the biggest buffers: "
            f"{biggest} (smaller tiles or fewer pipeline stages reduce it)")
    return SmemPlan(offsets, {n: sizes[n] for n in offsets}, spans, total,
                    caps.static_smem_bytes, caps.max_smem_bytes)


def buffer_bytes(kernel: Kernel, stages: Mapping[str, int] | None = None) -> dict[str, int]:
    """Bytes of each shared buffer of ``kernel``, all stages of a pipelined one (``stages``:
    the multi-buffered ones, by default those the pipelined loops stage)."""
    stages = staged_buffers(kernel) if stages is None else stages
    return {b.name: max(math.prod(b.shape), 1) * np.dtype(b.dtype).itemsize
            * stages.get(b.name, 1) for b in kernel.buffers if b.scope == "shared"}


def plan_kernel(kernel: Kernel, caps: GpuCaps) -> SmemPlan:
    """The plan of ``kernel``'s own shared buffers (pipelined ones with their stages), which
    :func:`place_shared_buffers` writes into the IR."""
    return plan_shared_memory(kernel, buffer_bytes(kernel), caps)


def place_shared_buffers(kernel: Kernel, caps: GpuCaps) -> Kernel:
    """The shared-memory planning pass: every shared buffer a statement touches gets its
    plan's byte ``offset`` and, when a pipelined loop multi-buffers it, ``stages`` as buffer
    attributes (:attr:`.ir.Buffer.attrs`); every request of an op's ``scratch`` note gets its
    byte offset as a fourth element, placed around the buffers.

    Assumes: the pipelining pass ran (its staged copies say which buffers have stages), and
    the scratch pass (its requests are ``(role, C type, elements)``).
    Guarantees: buffers whose lifetimes overlap get disjoint bytes, offsets are multiples of
    :data:`ALIGN`, the total fits ``caps`` (else KernelError); later passes and code
    generation read the plan from the IR (:func:`recorded_bytes`, :func:`scratch_bytes`,
    :func:`recorded_plan`)."""
    stages = issued_stages(kernel)
    plan = plan_shared_memory(kernel, buffer_bytes(kernel, stages), caps)
    kernel = _place_recorded_scratch(kernel, plan, caps)
    buffers = []
    for b in kernel.buffers:
        if b.name in plan.offsets:
            extra = {"stages": stages[b.name]} if b.name in stages else {}
            b = b.with_attrs(offset=plan.offsets[b.name], **extra)
        buffers.append(b)
    return _place_rings(dataclasses.replace(kernel, buffers=tuple(buffers)), caps)


RING_OFFSET = "ring_offset"
MBARRIER_BYTES = 8


def ring_bytes(stages: int) -> int:
    """Bytes of a TMA ring's mbarriers: a full and an empty one per stage."""
    return 2 * stages * MBARRIER_BYTES


def _place_rings(kernel: Kernel, caps: GpuCaps) -> Kernel:
    """``kernel`` with each TMA ring's mbarriers placed after everything else (module
    docstring), their offset the note ``ring_offset`` of the ring's ``tma_wait``."""
    offsets, sizes = recorded_bytes(kernel)
    end = max([at + sizes[n] for n, at in offsets.items()] +
              [hi for s in walk(kernel.body) if isinstance(s, Op)
               for _, _, hi in scratch_bytes(s)] + [0])
    placed: dict[int, int] = {}
    # Each ring's set-up (its mbarrier_init, which the pipelining pass put before the ring's
    # prologue, so one per ring and in the same order) declares the ring at the same offset.
    inits = iter([s for s in walk(kernel.body) if isinstance(s, Op) and s.kind == RING_INIT])
    for loop in walk(kernel.body):
        if isinstance(loop, For) and is_ring(loop):
            at = -(-end // MBARRIER_BYTES) * MBARRIER_BYTES
            placed[id(loop.body[0])] = at
            init = next(inits, None)
            if init is not None:
                placed[id(init)] = at
            end = at + ring_bytes(loop.stages)
    if not placed:
        return kernel
    if end > caps.max_smem_bytes:
        raise KernelError(f"kernel {kernel.name!r} needs {end} bytes of shared memory with its "
                          f"TMA rings' mbarriers, more than the {caps.max_smem_bytes} an "
                          f"{caps.arch} block can have (fewer pipeline stages reduce it)")
    return dataclasses.replace(kernel, body=map_ops(kernel.body, lambda op: [
        op.with_notes(**{RING_OFFSET: placed[id(op)]}) if id(op) in placed else op]))


def _place_recorded_scratch(kernel: Kernel, plan: SmemPlan, caps: GpuCaps) -> Kernel:
    """``kernel`` with each request of its ops' ``scratch`` notes (the scratch pass's
    ``(role, C type, elements)``) given its byte offset as a fourth element: placed after the
    kernel's own buffers (their offsets kept), in program order, each live for its op's
    statement only."""
    scratch: list[Scratch] = []
    for stmt in walk(kernel.body):
        if isinstance(stmt, Op):
            for role, ctype, count in stmt.notes.get("scratch", ()):
                # A space keeps the name apart from every buffer's (an identifier).
                scratch.append(Scratch(f"scratch {role}{len(scratch)}",
                                       sizeof(ctype) * max(count, 1), stmt))
    if not scratch:
        return kernel
    sizes = {n: plan.sizes[n] for n in plan.offsets}
    full = plan_shared_memory(kernel, sizes, caps, scratch, fixed=plan.offsets)
    at = iter(full.offsets[s.name] for s in scratch)

    def placed(op: Op) -> list[Stmt]:
        notes = op.notes.get("scratch")
        if not notes:
            return [op]
        return [op.with_notes(scratch=tuple((*n, next(at)) for n in notes))]

    return dataclasses.replace(kernel, body=map_ops(kernel.body, placed))


def recorded_bytes(kernel: Kernel) -> tuple[dict[str, int], dict[str, int]]:
    """Offsets and bytes of the shared buffers the IR places."""
    placed = [b for b in kernel.buffers if b.scope == "shared" and "offset" in b.attrs]
    stages = {b.name: b.attrs.get("stages", 1) for b in placed}
    sizes = buffer_bytes(kernel, stages)
    return {b.name: b.attrs["offset"] for b in placed}, {b.name: sizes[b.name] for b in placed}


def scratch_bytes(op: Op) -> list[tuple[str, int, int]]:
    """The role, first byte and end byte of each request of ``op``'s ``scratch`` note that
    the smem_plan pass placed (an unplaced one has no bytes yet)."""
    return [(role, at, at + sizeof(ctype) * max(count, 1))
            for role, ctype, count, *placed in op.notes.get("scratch", ()) for at in placed]


def recorded_plan(kernel: Kernel, caps: GpuCaps,
                  scratch: Sequence[tuple[Scratch, int]] = ()) -> SmemPlan:
    """The plan :func:`place_shared_buffers` wrote into ``kernel`` (lifetimes recomputed
    from the body), with the ``scratch`` arrays at the offsets recorded for them (code
    generation's names, for the report); an internal KernelError names a touched shared
    buffer it did not place."""
    offsets, sizes = recorded_bytes(kernel)
    touched = {r.buffer for s in walk(kernel.body) if isinstance(s, Op) for r in regions(s)}
    missing = [b.name for b in kernel.buffers
               if b.scope == "shared" and b.name in touched and b.name not in offsets]
    if missing:
        raise KernelError(f"internal error: shared buffer(s) {', '.join(missing)} of kernel "
                          f"{kernel.name!r} have no planned offset (the smem_plan pass did "
                          "not run)")
    fixed = {**offsets, **{s.name: at for s, at in scratch}}
    return plan_shared_memory(kernel, sizes, caps, [s for s, _ in scratch], fixed=fixed)
