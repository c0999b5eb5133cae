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
mbarriers its ``mbarrier_init`` op declared and initialised before its prologue (the
pipelining pass placed it between two barriers, :mod:`..ring_setup`): a ``tma_issue`` is
thread 0 announcing ``bytes`` on the stage's barrier and issuing the TMA loads of the staged
copies (:mod:`..tma`: one per column block of the tile, through the copy's tensor-map
parameter), a ``tma_wait`` every thread
waiting for the phase of tile ``k`` (stage ``k % stages``, parity ``(k / stages) & 1``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ... import ir
from .. import tma
from ..copy_schedule import ISSUED, is_ring, split_schedule
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
    ring = low.take_ring() if is_ring(stmt) else None   # its mbarrier_init declared it
    if ring is None:
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
