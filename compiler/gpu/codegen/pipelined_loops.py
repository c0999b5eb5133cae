"""``jt.pipelined(n, stages=s)`` loops as multi-buffered pipelines, printed from the schedule
the pipelining pass wrote into the IR (:func:`..copy_schedule.schedule_async_copies`).

Each staged buffer has ``stages`` copies (its ``stages`` attribute). An ``async_issue`` op
prints the loop's :data:`..copy_schedule.ISSUED` ops (its staged copies, as ``cp.async``
where the copy moves aligned 8- or 16-byte vectors, and the scalar arithmetic of their
origins, recomputed) for iteration ``k + tile`` into stage ``(k + tile) % stages``, inside
``if (k + tile < n)`` when guarded; ``async_commit`` and ``async_wait`` print the device
header's ``cp_async_commit`` and ``cp_async_wait<count>``. The prologue ops stand right before
the loop; the loop's body is its schedule then the compute, which is printed as written with
its staged copies left out and the barriers the barrier pass put there.

A TMA ring (:func:`..copy_schedule.is_ring`) prints the same way over the ``stages``
mbarriers its ``mbarrier_init`` op declared (a view of the dynamic shared memory at the
offset the smem_plan pass gave the ring) and initialised before its prologue (the
pipelining pass placed it between two barriers, :mod:`..ring_setup`): a ``tma_issue`` is
thread 0 announcing ``bytes`` on the stage's barrier and issuing the TMA loads of the staged
copies (:mod:`..tma`: one per column block of the tile, through the copy's tensor-map
parameter), a ``tma_wait`` every thread
waiting for the phase of tile ``k`` (stage ``k % stages``, parity ``(k / stages) & 1``).

A warp-specialised ring (:mod:`..warp_specialise`) prints its ``warp_specialise`` op first in
the kernel: the ring's ``full`` and ``empty`` barriers declared and initialised by thread 0
before a block barrier (every thread is still there), then the producer warpgroup's branch
(``setmaxnreg_dec``; thread ``consumers`` recomputes the scalars noted ``role =
"producer"`` and runs the ring's issues: the prologue's, then per iteration a wait on the
empty barrier of the stage it refills before its issue; then the producer returns), then
``setmaxnreg_inc`` for the consumers, whose code follows: the ring loop prints its waits and
compute only, and ``tma_release`` as each warp's arrival on the stage's empty barrier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ... import ir
from ...errors import KernelError
from .. import tma
from ..copy_schedule import ISSUE_KINDS, ISSUED, is_ring, split_schedule
from ..smem_plan import MBARRIER_BYTES, RING_OFFSET
from ..warp_specialise import ROLE, check_budget, ring_loop
from .context import Context


def lower_pipelined(low, stmt: ir.For, prologue: Sequence[ir.Op]) -> None:
    """Print the scheduled loop ``stmt`` after its ``prologue`` ops. ``low`` is the kernel's
    lowering (for its statement emitter and tensor maps)."""
    cx: Context = low.cx
    stages = stmt.stages
    start, extent = cx.operand(stmt.start), cx.operand(stmt.extent)
    schedule, compute = split_schedule(stmt)
    head = [s for s in stmt.body if isinstance(s, ir.Op) and s.notes.get(ISSUED)]
    staged = sorted({op.attrs["dst"].buffer for op in head if op.kind == "copy"})
    split = low.split_ring if is_ring(stmt) else None
    ring = split[0] if split else low.take_ring() if is_ring(stmt) else None
    if split:
        cx.w(f"// pipelined loop: {stages} stages of {', '.join(staged)}, TMA into an "
             "mbarrier ring the producer warpgroup fills; the consumers wait on full, "
             "compute, release empty")
    elif ring is None:
        cx.w(f"// pipelined loop: {stages} stages of {', '.join(staged)}, cp.async")
    else:
        cx.w(f"// pipelined loop: {stages} stages of {', '.join(staged)}, TMA into an "
             f"mbarrier ring ({ring})")

    def issue(tile: str, nbytes: int | None) -> None:
        """The staged copies of iteration ``tile`` (their scalars recomputed for it)."""
        saved = dict(cx.names)
        with cx.w.block("if (tid == 0)" if ring else ""):
            if ring:
                cx.w(f"mbarrier_arrive_expect_tx({ring} + ({tile}) % {stages}, {nbytes});")
            var = cx.define(stmt.var)
            cx.w(f"const int {var} = {start} + ({tile});")
            cx.stage_index = f"({tile}) % {stages}"
            cx.async_copies = True
            for op in head:
                if ring and op.kind == "copy":
                    _tma_load(low, op, ring, f"({tile}) % {stages}", stages)
                else:
                    low.op(op)
            cx.async_copies = False
        cx.names = saved

    def step(op: ir.Op, k: str | None) -> None:
        """One schedule op, for iteration ``k`` (None in the prologue: ``k`` = 0)."""
        if op.kind == "tma_wait":
            cx.w(f"mbarrier_wait_parity({ring} + {k} % {stages}, ({k} / {stages}) & 1);  "
                 f"// tile {k} has landed")
            return
        if op.kind not in ("async_issue", "tma_issue"):
            low.op(op)
            return
        if split:
            return      # the producer's (printed in its branch)
        tile = str(op.attrs["tile"]) if k is None else f"{k} + {op.attrs['tile']}"
        nbytes = op.attrs.get("bytes")
        if op.attrs["guard"]:
            with cx.w.block(f"if ({tile} < {extent})"):
                issue(tile, nbytes)
        else:
            issue(tile, nbytes)

    for op in prologue:
        step(op, None)
    it = cx.tmp("it")
    low.split_stage = f"{it} % {stages}"
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


def _tma_load(low, op: ir.Op, ring: str, stage: str, stages: int) -> None:
    """The TMA loads of staged copy ``op`` into stage ``stage`` of its buffer, completing on
    that stage's barrier of ``ring``: one per column block of the tile, coordinates innermost
    first."""
    cx: Context = low.cx
    src, dst = op.attrs["src"], op.attrs["dst"]
    db = cx.bufs[dst.buffer]
    box = op.notes[tma.BOX]
    tmap = tma.map_of(low.tensor_maps, op, [b.name for b in low.kernel.params])
    coords = [cx.operand(i.start) for i in reversed(src.index)]
    elems = math.prod(db.shape)
    block = box[0] * db.shape[0]        # elements of one column block (rows x span bytes)
    cx.w(f"// {cx.bufs[src.buffer].name} -> {db.name}: TMA, box {list(box)}, swizzle "
         f"{op.notes[tma.SWIZZLE]}")
    for j in range(tma.loads(op)):
        inner = coords[0] if j == 0 else f"{coords[0]} + {j * box[0]}"
        at = f"{db.name} + ({stage}) * {elems}" + (f" + {j * block}" if j else "")
        cx.w(f"tma_load_{len(coords)}d({at}, tensor_map_ref({tmap.name}), {ring} + {stage}, "
             f"{', '.join([inner, *coords[1:]])});")


def _ring_array(cx: Context, loop: ir.For, hint: str, skip: int = 0) -> str:
    """A shared array of ``loop.stages`` mbarriers at the ring's planned offset (the note
    :data:`..smem_plan.RING_OFFSET` of its ``tma_wait``), ``skip`` barriers in."""
    wait = loop.body[0]
    name = cx.tmp(hint)
    at = wait.notes[RING_OFFSET] + skip * MBARRIER_BYTES
    cx.shared.append(("uint64_t", name, loop.stages, wait, at))
    return name


def lower_split(low, op: ir.Op) -> None:
    """A ``warp_specialise`` op (first in the kernel): the ring's barriers, then the producer
    warpgroup's branch, then the consumers' register increase (module docstring). ``low``
    gets ``split_ring`` (the full and empty barriers' names) for the ring loop and its
    ``tma_release``."""
    cx: Context = low.cx
    a = op.attrs
    bad = check_budget(a["consumers"], a["producers"], a["producer_regs"], a["consumer_regs"])
    if bad is not None:
        raise KernelError(f"internal error: warp specialisation's register budget: {bad}")
    loop = ring_loop(low.kernel)
    stages, consumers = loop.stages, a["consumers"]
    full, empty = _ring_array(cx, loop, "full"), _ring_array(cx, loop, "empty", stages)
    low.split_ring = (full, empty)
    cx.w(f"// warp specialisation: threads 0..{consumers - 1} consume ({a['consumer_regs']} "
         f"registers each), {consumers}..{consumers + a['producers'] - 1} produce "
         f"({a['producer_regs']} registers each; thread {consumers} issues the TMA loads)")
    cx.w(f"// {full}: a tile landed (1 arrival + its bytes); {empty}: its stage is free (1 "
         "arrival per consumer warp)")
    with cx.w.block("if (tid == 0)"):
        with cx.w.block(f"for (int s = 0; s < {stages}; ++s)"):
            cx.w(f"mbarrier_init({full} + s, 1);")
            cx.w(f"mbarrier_init({empty} + s, {consumers // cx.warp_size});")
        cx.w("fence_mbarrier_init();")
    cx.w("sync_threads();  // the ring is initialised before either role uses it")
    with cx.w.block(f"if (tid >= {consumers})"):
        cx.w(f"setmaxnreg_dec<{a['producer_regs']}>();")
        with cx.w.block(f"if (tid == {consumers})"):
            _producer(low, loop, full, empty)
        cx.w("return;")
    cx.w(f"setmaxnreg_inc<{a['consumer_regs']}>();")


def _producer(low, loop: ir.For, full: str, empty: str) -> None:
    """The elected producer thread: the noted scalars, the prologue's issues, then one
    issue per iteration after the wait for its stage's release."""
    cx: Context = low.cx
    saved = dict(cx.names)
    stages = loop.stages
    at = next(i for i, s in enumerate(low.kernel.body) if s is loop)
    prologue = [s for s in low.kernel.body[:at] if isinstance(s, ir.Op)
                and s.kind in ISSUE_KINDS]
    for s in low.kernel.body[:at]:
        if isinstance(s, ir.Op) and s.notes.get(ROLE) == "producer" and s.kind not in ISSUE_KINDS:
            low.op(s)
    start, extent = cx.operand(loop.start), cx.operand(loop.extent)
    head = [s for s in loop.body if isinstance(s, ir.Op) and s.notes.get(ISSUED)]

    def issue(tile: str, nbytes: int) -> None:
        names = dict(cx.names)
        cx.w(f"mbarrier_arrive_expect_tx({full} + ({tile}) % {stages}, {nbytes});")
        var = cx.define(loop.var)
        cx.w(f"const int {var} = {start} + ({tile});")
        cx.stage_index = f"({tile}) % {stages}"
        cx.async_copies = True
        for op in head:
            if op.kind == "copy":
                _tma_load(low, op, full, f"({tile}) % {stages}", stages)
            else:
                low.op(op)
        cx.async_copies = False
        cx.names = names

    for op in prologue:
        tile = str(op.attrs["tile"])
        with cx.w.block(f"if ({tile} < {extent})" if op.attrs["guard"] else ""):
            issue(tile, op.attrs["bytes"])
    it = cx.tmp("it")
    for op in (s for s in loop.body if isinstance(s, ir.Op) and s.kind in ISSUE_KINDS):
        tile = f"{it} + {op.attrs['tile']}"
        with cx.w.block(f"for (int {it} = 0; {it} < {extent}; ++{it})"):
            with cx.w.block(f"if ({tile} < {extent})" if op.attrs["guard"] else ""):
                cx.w(f"mbarrier_wait_parity({empty} + ({tile}) % {stages}, "
                     f"((({tile}) / {stages}) & 1) ^ 1);  // its last tile was released")
                issue(tile, op.attrs["bytes"])
    cx.names = saved


def lower_release(low, op: ir.Op) -> None:
    """``tma_release``: each consumer warp's lane 0 arrives on the iteration's stage's empty
    barrier once the warp is past its reads of the stage."""
    cx: Context = low.cx
    _, empty = low.split_ring
    cx.w("sync_warp();  // the warp's reads of the stage are done")
    cx.w(f"if (lane_id() == 0) mbarrier_arrive({empty} + {low.split_stage});  "
         "// the producer may refill it")
