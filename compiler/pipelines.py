"""Pass pipelines: the named Tile IR passes each target runs, in order.

A kernel goes through two pipelines. The *neutral* one (verify, canonicalize,
contiguous_gathers, coverage, dce, clamp_check, scratch_init, output_init,
wide_accumulation) runs once per specialisation, whatever the target; its result is the
IR that the content key hashes and that ``kernel.lower(...)`` shows. Each target kind then
has one function listing its own passes, run by the build on the neutral IR before the
target's lowering: the CPU fuses elementwise chains into their consumers. The GPUs run gemm
planning, layout inference, copy mapping, bounds, pipelining, shared-memory planning and
barrier insertion (docs/design.md), each writing its decisions into the IR, then the
lowering prints the CUDA or HIP source.

``JAXTILE_DUMP_IR=<pass>[,<pass>...]`` (or ``all``) prints the IR after the named passes to
standard error; ``JAXTILE_VERIFY_IR=1`` verifies the IR after every pass (the test suite
sets it).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence

from . import ir, printer, verify
from .passes.canonicalize import canonicalize
from .passes.clamp_check import warn_clamped_accesses
from .passes.contiguous_gathers import contiguous_gathers
from .passes.coverage import check_output_coverage
from .passes.dce import eliminate_dead_code
from .passes.fusion import fuse_elementwise
from .passes.gemm_edges import trim_edge_gemms
from .passes.gemm_panels import coarsen_gemm_loops
from .passes.output_init import add_output_inits
from .passes.scratch_init import zero_uninitialised_scratch
from .passes.wide_accumulation import widen_half_accumulation
from .target import Target


@dataclasses.dataclass(frozen=True)
class Pass:
    """A named function from Tile IR to Tile IR."""

    name: str
    run: Callable[[ir.Kernel], ir.Kernel]
    rules: Callable[[ir.Kernel], ir.Kernel] | None = None
    """The rules of the IR this pass introduces, checked (under ``JAXTILE_VERIFY_IR``) after
    it and every later pass, besides :func:`.verify.verify`."""


NEUTRAL = (
    Pass("verify", verify.verify),
    Pass("canonicalize", canonicalize),
    Pass("contiguous_gathers", contiguous_gathers),
    Pass("coverage", check_output_coverage),
    Pass("dce", eliminate_dead_code),
    Pass("clamp_check", warn_clamped_accesses),
    Pass("scratch_init", zero_uninitialised_scratch),
    Pass("output_init", add_output_inits),
    Pass("wide_accumulation", widen_half_accumulation),
)
"""Target-neutral passes, run on every specialisation before its key is computed."""

NEUTRAL_DYNAMIC = tuple(p for p in NEUTRAL if p.name not in ("coverage", "clamp_check"))
"""The neutral passes for the IR of a kernel with dynamic sizes. Coverage and the clamp
check need the sizes: they ran on the same call's trace with its concrete shapes."""


def cpu(target: Target) -> tuple[Pass, ...]:
    """The CPU's passes: GEMM loops take K steps of a few hundred, gemms at ragged edges
    skip the accumulator rows and columns no output receives, elementwise chains are
    computed inside their consumers."""
    widen = not target.caps.bf16_dot        # bfloat16 panels where the gemm dots them
    return (Pass("gemm_panels", lambda k: coarsen_gemm_loops(k, widen=widen)),
            Pass("gemm_edges", trim_edge_gemms), Pass("fusion", fuse_elementwise))


def gpu(target: Target) -> tuple[Pass, ...]:
    """The GPU passes (CUDA and HIP alike: their differences are capabilities), in order,
    each writing its decisions into the IR:

    - ``gemm_plan`` (:func:`.gpu.gemm_plan.plan_gemms`): each gemm's instruction, warp grid and
      policy (op notes), its shared operands' swizzles (buffer attributes);
    - ``layout_inference``: every register tile's thread layout, the recorded gemm plans'
      accumulators first, ``relayout`` ops where ops disagree;
    - ``copy_mapping`` (:func:`.gpu.copy_mapping.map_copies`): each copy between memory
      buffers gets its thread mapping (note ``vec``), read by barriers and code generation;
    - ``bounds``: which global accesses keep a mask;
    - ``pipelining`` (:func:`.gpu.copy_schedule.schedule_async_copies`): each
      ``jt.pipelined`` loop's cp.async schedule as statements (``async_issue`` per stage in
      the prologue and each iteration, ``async_commit``, ``async_wait`` with its count, the
      iteration's ``barrier``), its staged copies noted ``issued``; on a target with TMA,
      where the staged copies allow, the same over an mbarrier ring (``tma_issue`` with the
      tile's bytes, ``tma_wait``; the copies' TMA boxes as notes, :mod:`.gpu.tma`);
    - ``buffer_loads`` (:func:`.gpu.copy_mapping.note_buffer_loads`): on a target whose
      buffer loads read zero past the end, global reads masked only at a buffer's end are
      noted ``buffer_load`` (printed as buffer loads without the mask);
    - ``scratch`` (:func:`.gpu.codegen.scratch.record_scratch`): the shared scratch arrays
      an op's lowering needs (a reduction's partials across warps, staging arrays, sort
      buffers, staged fragments; op note ``scratch``);
    - ``smem_plan`` (:func:`.gpu.smem_plan.place_shared_buffers`): each shared buffer's
      byte offset and pipeline stages (buffer attributes), each scratch request's offset;
    - ``tma_store`` (:func:`.gpu.tma_store.plan_tma_stores`): on a target with TMA, copies
      of a shared tile to a global output become ``tma_store`` ops (their boxes as notes),
      with the issuing thread's ``tma_store_wait`` before their source is written again and
      at the kernel's end;
    - ``barriers``: ``barrier`` ops wherever threads of a block would race (after layouts,
      which say which thread touches which shared element, treating buffers and scratch the
      plan puts on the same bytes as one);
    - ``warp_specialise`` (:func:`.gpu.warp_specialise.warp_specialise`): on sm_90a, a TMA
      ring's issues move to a producer warpgroup added to the block (op
      ``warp_specialise`` with each role's registers, ``tma_release``, named barriers);
    - ``pingpong`` (:func:`.gpu.pingpong.pingpong`): in a split kernel of two or more
      consumer warpgroups whose ring loop has GEMMs on both sides of other work, the
      warpgroups take turns at the GEMMs (ops ``pingpong``, ``turn_wait``, ``turn_pass``).

    After ``pipelining`` the GPU rules (:func:`.gpu.verify.verify_gpu`: wait counts,
    barriers in uniform control flow, offsets), and after ``barriers`` that every reuse of
    scratch bytes has its barrier and every async-proxy read its proxy fence
    (:func:`.gpu.verify.verify_barrier_pass`), with the
    others under ``JAXTILE_VERIFY_IR``; after ``tma_store``, that no TMA store's source is
    written before its wait (:func:`.gpu.tma_store.verify_tma_stores`). Code generation
    then prints the IR (:mod:`.gpu.codegen.lower`). The GPU tier is imported here, not with
    this module: a process that compiles for the CPU alone never loads it."""
    from .gpu.barriers import insert_barriers
    from .gpu.bounds import check_bounds
    from .gpu.codegen.scratch import record_scratch
    from .gpu.copy_mapping import map_copies, note_buffer_loads
    from .gpu.copy_schedule import schedule_async_copies
    from .gpu.gemm_plan import anchors, plan_gemms
    from .gpu.layout_inference import infer_layouts
    from .gpu.pingpong import check_pingpong, pingpong
    from .gpu.smem_plan import place_shared_buffers
    from .gpu.tma_store import plan_tma_stores, verify_tma_stores
    from .gpu.verify import verify_barrier_pass, verify_gpu
    from .gpu.warp_specialise import check_split, warp_specialise

    return (Pass("gemm_plan", lambda k: plan_gemms(k, target)),
            Pass("layout_inference", lambda k: infer_layouts(k, anchors)),
            Pass("copy_mapping", map_copies, verify_gpu),
            Pass("bounds", check_bounds),
            Pass("pipelining", lambda k: schedule_async_copies(k, target.caps), verify_gpu),
            Pass("buffer_loads", lambda k: note_buffer_loads(k, target.caps)),
            Pass("scratch", lambda k: record_scratch(k, target.caps)),
            Pass("smem_plan", lambda k: place_shared_buffers(k, target.caps), verify_gpu),
            Pass("tma_store", lambda k: plan_tma_stores(k, target.caps), verify_tma_stores),
            Pass("barriers", insert_barriers, verify_barrier_pass),
            Pass("warp_specialise", lambda k: warp_specialise(k, target.caps), check_split),
            Pass("pingpong", pingpong, check_pingpong))


TARGET_PIPELINES: dict[str, Callable[[Target], tuple[Pass, ...]]] = {
    "cpu": cpu, "cuda": gpu, "hip": gpu}
"""Target kind -> the function listing its passes."""


def for_target(target: Target) -> tuple[Pass, ...]:
    """The passes ``target`` runs after the neutral ones (none for a kind that has no
    backend yet: its build fails with its own error)."""
    pipeline = TARGET_PIPELINES.get(target.kind)
    return pipeline(target) if pipeline is not None else ()


def _dumped() -> set[str]:
    return {n.strip() for n in os.environ.get("JAXTILE_DUMP_IR", "").split(",") if n.strip()}


def run(kernel: ir.Kernel, passes: Sequence[Pass]) -> ir.Kernel:
    """Run ``passes`` in order; verify after each when ``JAXTILE_VERIFY_IR`` is set, and
    print the IR after those named in ``JAXTILE_DUMP_IR``."""
    dump = _dumped()
    check = verify.requested()
    rules: list[Callable[[ir.Kernel], ir.Kernel]] = [verify.verify]
    for p in passes:
        kernel = p.run(kernel)
        if p.rules is not None and p.rules not in rules:
            rules.append(p.rules)
        if check:
            for rule in rules:
                rule(kernel)
        if p.name in dump or "all" in dump:
            print(f"// Tile IR after {p.name}\n{printer.format_kernel(kernel)}",
                  file=sys.stderr)
    return kernel
