"""The cp.async schedule of a pipelined loop: multi-buffering, commit and wait counts, barriers.

``@jt.pipelined(n, stages=s)`` over a loop whose iteration ``k`` first copies tile ``k`` of one
or more global operands into shared memory and then computes on it becomes (docs/ptx_facts.md,
"The pipeline schedule"), with ``S = stages`` shared buffers per operand::

    prologue   for s in 0 .. S-2:   if s < n: copy tile s -> buffer s;   commit
    iteration k (0 <= k < n):
               wait_group(S - 2)       tile k's group is complete (this thread's copies)
               barrier                 tile k is visible to every thread, and every thread is
                                       done reading buffer (k - 1) % S, refilled next
               if k + S - 1 < n: copy tile k + S - 1 -> buffer (k + S - 1) % S
               commit                  always, so that the counts above hold for every k
               compute on buffer k % S

Each iteration's copies (of all operands) form one group. Committing even when nothing was
copied (an empty group is legal) keeps "``S - 1 + k`` groups committed before the wait of
iteration k" true for every trip count, including ``n < S - 1`` and counts known only at run
time, so the wait count is the constant ``S - 2``. After the loop no copy is pending that
carries data (tile ``n - 1`` was waited for in the last iteration); only empty groups are.
Shared memory the loop used may be reused after one more barrier (the barrier pass's job).

``stages == 1`` is the unpipelined form: barrier (the previous compute is done with the only
buffer), copy tile k, commit, wait_group(0), barrier, compute.

:func:`plan_pipeline` gives the schedule as a list of steps for code generation; guards that
the trip count decides statically are resolved. :func:`check_schedule` executes a schedule
for one trip count and reports what a GPU would get wrong (a tile read before its copy
retired or before a barrier published it, a buffer refilled while still being read).

:func:`pipeline_shape` decides, on the Tile IR alone, which ``jt.pipelined`` loops get the
schedule and which of their copies it issues (so that shared-memory planning, barrier
insertion and code generation agree): the *staged* copies are the body's top-level copies
from global memory into a whole shared buffer, wherever they stand in the body (flash
attention copies V after the softmax), provided their origin is computable at the top of
the iteration (from the loop counter, values defined before the loop and scalar arithmetic
of the body on those), nothing in the body touches the destination before the copy or
writes it elsewhere, nothing in the loop writes the source, and the destination is not used
outside the loop. All staged copies of an iteration are issued at the top, in one group, so
one wait makes every tile of the iteration visible at once: a copy that stood after some
computation then waits with the others. Since it was issued ``stages - 1`` iterations
earlier, waiting for it at the top costs nothing once the pipeline is full, and the counting
stays the single ``wait<S - 2>`` above.

On a target with TMA (``GpuCaps.tma``) a loop whose staged copies can all be TMA loads
(:func:`.tma.tma_box`) gets the same schedule over a ring of ``S`` "full" mbarriers instead
of cp.async groups (``tma_issue`` for ``copy`` + ``commit``, ``tma_wait`` for ``wait``)::

    prologue   ring init (every stage's barrier expects one arrival)
               for s in 0 .. S-2:   if s < n: one thread: arrive_expect_tx(full[s], bytes);
                                              TMA loads of tile s -> buffer s
    iteration k (0 <= k < n):
               wait full[k % S], parity (k / S) & 1      tile k has landed
               barrier                 every thread is done reading buffer (k - 1) % S
               if k + S - 1 < n: one thread: arrive_expect_tx + TMA loads of tile k + S - 1
               compute on buffer k % S

``bytes`` is the iteration's tiles' bytes, which the loads complete (TMA counts the zeros it
writes past the edges too), so each phase of each stage completes once per tile: tile ``t``
is stage ``t % S``'s phase ``t / S``. Every thread both waits and computes, so the block
barrier that frees the stage to refill stays; the ring's "empty" barriers belong to warp
specialisation, where producer and consumers are different warps. Nothing is in flight after
the loop (every tile was waited for), so no wait follows it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from .. import ir, op_defs
from ..errors import KernelError
from ..target import GpuCaps
from . import tma
from .ring_setup import ring_setup


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the schedule.

    ``kind`` is ``copy`` (copy tile ``k + tile`` into buffer ``(k + tile) % stages``; in the
    prologue ``k`` is 0), ``commit``, ``wait`` (``cp_async_wait<count>``), ``barrier`` or
    ``compute`` (on buffer ``(k + tile) % stages``). ``guard`` is ``"always"``, or
    ``"runtime"``: emit ``if (k + tile < n)`` around the copy."""

    kind: str
    tile: int = 0
    count: int = 0
    guard: str = "always"

    def text(self, prologue: bool = False) -> str:
        """One line; in the prologue (``k`` = 0) tiles print as numbers."""
        tile = str(self.tile) if prologue else "k" if self.tile == 0 else f"k + {self.tile}"
        if self.kind == "copy":
            copy = f"copy tile {tile} -> buffer ({tile}) % S"
            return copy if self.guard == "always" else f"if {tile} < n: {copy}"
        if self.kind == "wait":
            return f"cp_async_wait<{self.count}>"
        if self.kind == "compute":
            return f"compute on buffer ({tile}) % S"
        return self.kind


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """A pipelined loop's schedule: ``prologue`` steps (``k`` = 0), then ``body`` steps per
    iteration ``k``."""

    stages: int
    trip_count: int | None
    """The trip count when known at compile time, else None."""
    prologue: tuple[Step, ...]
    body: tuple[Step, ...]

    @property
    def buffers(self) -> int:
        """Shared buffers per pipelined operand."""
        return self.stages

    def text(self) -> str:
        """The schedule, one step a line (for ``kernel.lower`` and the docs)."""
        pro = [f"  {s.text(prologue=True)}" for s in self.prologue]
        body = [f"  {s.text()}" for s in self.body]
        return "\n".join(["prologue:", *pro, "for k in 0 .. n-1:", *body])


def plan_pipeline(stages: int, trip_count: int | None = None) -> PipelinePlan:
    """The schedule of a loop pipelined over ``stages`` buffers (see the module docstring).

    With a known ``trip_count`` the prologue's guards are resolved (copies past the end are
    dropped, their commits kept); the body's guard stays a run-time test of ``k``."""
    if stages < 1:
        raise KernelError(f"pipelined loop: stages must be >= 1, got {stages}")
    if trip_count is not None and trip_count < 0:
        raise KernelError(f"pipelined loop: negative trip count {trip_count}")
    if stages == 1:
        body = (Step("barrier"), Step("copy"), Step("commit"), Step("wait", count=0),
                Step("barrier"), Step("compute"))
        return PipelinePlan(1, trip_count, (), body)
    prologue: list[Step] = []
    for s in range(stages - 1):
        if trip_count is None:
            prologue.append(Step("copy", tile=s, guard="runtime"))
        elif s < trip_count:
            prologue.append(Step("copy", tile=s))
        prologue.append(Step("commit"))
    ahead = stages - 1
    body = (Step("wait", count=stages - 2), Step("barrier"),
            Step("copy", tile=ahead, guard="runtime"), Step("commit"), Step("compute"))
    return PipelinePlan(stages, trip_count, tuple(prologue), body)


def check_schedule(plan: PipelinePlan, n: int) -> list[str]:
    """Run ``plan`` for trip count ``n`` on an abstract machine of many threads and return the
    hazards (empty when the schedule is right).

    Model: each thread's copies join its open group; ``wait<c>`` retires all but the ``c``
    newest committed groups of the thread; a retired copy is visible to every thread only
    after the next barrier. Every thread runs the same steps, so one thread's group counts
    stand for all; what a barrier orders is tracked per buffer."""
    stages = plan.stages
    problems: list[str] = []
    groups: list[list[int]] = []  # committed groups: the tiles each one copies
    open_group: list[int] = []
    retired: set[int] = set()  # tiles whose copy this thread has waited for
    published: set[int] = set()  # tiles retired before a barrier (visible to all)
    holder: dict[int, int] = {}  # buffer -> tile it holds (or is being filled with)
    read_since_barrier: set[int] = set()  # buffers read since the last barrier
    copied: list[int] = []

    def run(step: Step, k: int, where: str) -> None:
        tile = k + step.tile
        if step.kind == "copy":
            if step.guard == "runtime" and tile >= n:
                return
            if tile >= n:
                problems.append(f"{where}: copies tile {tile} past the trip count {n}")
                return
            buf = tile % stages
            if buf in read_since_barrier:
                problems.append(f"{where}: refills buffer {buf} while other threads may still "
                                f"read it (no barrier since)")
            holder[buf] = tile
            open_group.append(tile)
            copied.append(tile)
        elif step.kind == "commit":
            groups.append(list(open_group))
            open_group.clear()
        elif step.kind == "wait":
            for g in groups[:max(len(groups) - step.count, 0)]:
                retired.update(g)
        elif step.kind == "barrier":
            published.update(retired)
            read_since_barrier.clear()
        elif step.kind == "compute":
            buf = tile % stages
            if holder.get(buf) != tile:
                problems.append(f"{where}: computes on buffer {buf} expecting tile {tile}, "
                                f"which holds {holder.get(buf)}")
            elif tile not in retired:
                problems.append(f"{where}: reads tile {tile} before its cp.async retired")
            elif tile not in published:
                problems.append(f"{where}: reads tile {tile} before a barrier published it")
            read_since_barrier.add(buf)

    for step in plan.prologue:
        run(step, 0, "prologue")
    for k in range(n):
        for step in plan.body:
            run(step, k, f"iteration {k}")
    if sorted(copied) != list(range(n)):
        problems.append(f"copied tiles {sorted(copied)}, expected 0 .. {n - 1} once each")
    pending = [t for g in groups for t in g if t not in retired]
    if pending or open_group:
        problems.append(f"tiles {pending + open_group} still in flight after the loop")
    return problems


@dataclasses.dataclass(frozen=True)
class PipelineShape:
    """What the schedule issues for one pipelined loop: the ``copies`` (the staged ones, in
    body order), the scalar ops computing their origins (``scalars``, in body order) and
    the shared buffers they fill (``staged``, each with ``stages`` buffers)."""

    stages: int
    copies: tuple[ir.Op, ...]
    scalars: tuple[ir.Op, ...]
    staged: tuple[str, ...]

    def is_staged_copy(self, stmt: ir.Stmt) -> bool:
        return any(stmt is c for c in self.copies)


_SCALAR_KINDS = ("const", "elementwise", "convert", "select")


def _loops(body: tuple[ir.Stmt, ...]) -> Iterator[ir.For]:
    for s in ir.walk(body):
        if isinstance(s, ir.For):
            yield s


def pipeline_shape(kernel: ir.Kernel, loop: ir.For) -> PipelineShape | None:
    """The staged copies of ``loop`` (see the module docstring), or None when the loop is
    not pipelined (not ``jt.pipelined``, fewer than 2 stages, or no copy qualifies); it
    then runs as a serial loop."""
    if loop.kind != "pipelined" or loop.stages < 2:
        return None
    bufs = {b.name: b for b in kernel.buffers}
    inner = list(ir.walk(loop.body))
    written = {r.buffer for s in inner if isinstance(s, ir.Op) for r in op_defs.writes(s)}
    defined = {s.result.id for s in inner if isinstance(s, ir.Op) and s.result is not None}
    computable: dict[int, ir.Op] = {}   # body scalars computable at the top of an iteration
    touched: set[str] = set()           # buffers accessed so far in the body
    copies: list[ir.Op] = []
    for stmt in loop.body:
        if isinstance(stmt, ir.Op) and stmt.kind == "copy":
            src, dst = stmt.attrs["src"], stmt.attrs["dst"]
            db = bufs[dst.buffer]
            starts = src.values() + dst.values()
            if (bufs[src.buffer].scope == "global" and db.scope == "shared"
                    and dst.is_whole(db.shape) and src.buffer not in written
                    and dst.buffer not in touched
                    and all(v.id in computable or v.id not in defined for v in starts)
                    and not any(c.attrs["dst"].buffer == dst.buffer for c in copies)):
                copies.append(stmt)
        if isinstance(stmt, ir.Op) and stmt.kind in _SCALAR_KINDS and stmt.result is not None \
                and stmt.result.shape == () and all(
                    v.id in computable or v.id not in defined for v in stmt.operands):
            computable[stmt.result.id] = stmt
        for s in ir.walk((stmt,)):
            if isinstance(s, ir.Op):
                touched |= {r.buffer for r in ir.regions(s)}
    # A staged buffer is written only by its copy, and used only inside the loop.
    writers: dict[str, list[ir.Op]] = {}
    for s in inner:
        if isinstance(s, ir.Op):
            for r in op_defs.writes(s):
                writers.setdefault(r.buffer, []).append(s)
    inside = {id(s) for s in inner}
    outside = {r.buffer for s in ir.walk(kernel.body)
               if isinstance(s, ir.Op) and id(s) not in inside for r in ir.regions(s)}
    copies = [c for c in copies
              if len(writers[c.attrs["dst"].buffer]) == 1 and c.attrs["dst"].buffer not in outside]
    if not copies:
        return None
    staged_names = {c.attrs["dst"].buffer for c in copies}
    needed: set[int] = set()
    todo = [v for c in copies for r in ir.regions(c) for v in r.values()]
    while todo:
        v = todo.pop()
        if v.id in computable and v.id not in needed:
            needed.add(v.id)
            todo += list(computable[v.id].operands)
    scalars = tuple(op for op in computable.values() if op.result.id in needed)
    return PipelineShape(loop.stages, tuple(copies), scalars,
                         tuple(sorted(staged_names)))


def staged_buffers(kernel: ir.Kernel) -> dict[str, int]:
    """Shared buffers that pipelined loops multi-buffer, with their number of stages."""
    out: dict[str, int] = {}
    for loop in _loops(kernel.body):
        shape = pipeline_shape(kernel, loop)
        if shape is not None:
            out.update({name: shape.stages for name in shape.staged})
    return out


ISSUED = "issued"
"""The note the pipelining pass puts on the ops an ``async_issue`` runs: a loop's staged
copies and the scalar ops computing their origins (recomputed for the issued iteration)."""
SCHEDULE_KINDS = ("async_issue", "async_commit", "async_wait", "tma_issue", "tma_wait")
ISSUE_KINDS = ("async_issue", "tma_issue")
PUBLISH = "tile it is visible; the buffer refilled next is free"
"""The reason of the barrier at the top of a pipelined iteration."""


def _schedule_op(step: Step, line: str | None, prologue: bool, tma_bytes: int | None
                 ) -> ir.Op | None:
    """The op of ``step``; with ``tma_bytes`` (a TMA ring's bytes per tile) its TMA form,
    None for a commit (a ring has no groups)."""
    if step.kind == "copy":
        attrs = {"tile": step.tile, "guard": step.guard == "runtime", "prologue": prologue}
        if tma_bytes is not None:
            return ir.Op("tma_issue", (), None, {**attrs, "bytes": tma_bytes}, line)
        return ir.Op("async_issue", (), None, attrs, line)
    if step.kind == "commit":
        return None if tma_bytes is not None else ir.Op("async_commit", (), None, {}, line)
    if step.kind == "wait":
        if tma_bytes is not None:
            return ir.Op("tma_wait", (), None, {}, line)
        return ir.Op("async_wait", (), None, {"count": step.count}, line)
    return ir.Op("barrier", (), None, {}, line, {"reason": PUBLISH})


def _tma_boxes(kernel: ir.Kernel, shape: PipelineShape
               ) -> dict[int, tuple[tuple[int, ...], int]] | None:
    """Each staged copy's TMA box and swizzle, or None unless every one has them."""
    bufs = {b.name: b for b in kernel.buffers}
    boxes = {id(c): tma.tma_box(c, bufs) for c in shape.copies}
    if any(b is None for b in boxes.values()):
        return None
    return boxes  # type: ignore[return-value]


def schedule_async_copies(kernel: ir.Kernel, caps: GpuCaps) -> ir.Kernel:
    """The pipelining pass: each ``jt.pipelined`` loop that :func:`pipeline_shape` stages
    gets its :func:`plan_pipeline` schedule as statements. The prologue's ``async_issue``
    (``prologue=True``) and ``async_commit`` ops go right before the loop; the loop's body
    starts with the iteration's ``async_wait``, ``barrier``, ``async_issue`` and
    ``async_commit``, followed by the body as written (the compute), whose staged copies and
    their origins' scalar ops carry the :data:`ISSUED` note; an ``async_wait {count=0}``
    follows the loop. Where ``caps.tma`` and every staged copy of a loop can be a TMA load,
    the loop's schedule is its mbarrier ring instead (module docstring): ``tma_issue``
    (``bytes``: the iteration's tiles) for each issue, ``tma_wait`` for the wait, no commits
    and no wait after the loop; its staged copies carry the notes ``tma_box`` and
    ``tma_swizzle`` (:mod:`.tma`), and its prologue follows the ring's set-up
    (:func:`.ring_setup.ring_setup`: barriers around ``mbarrier_init``). Other loops are
    unchanged.

    Assumes: the loops' shapes are final (layouts, bounds and buffers do not change them).
    Guarantees: the shape is decided here once; shared-memory planning
    (:func:`issued_stages`), barrier insertion and code generation read the schedule from
    the IR. The prologue is adjacent to its loop; a loop's schedule starts its body with an
    ``async_wait`` and ends at its first top-level ``async_commit``."""
    bufs = {b.name: b for b in kernel.buffers}
    shapes = {id(loop): shape for loop in _loops(kernel.body)
              if (shape := pipeline_shape(kernel, loop)) is not None}
    issued = {id(op) for shape in shapes.values() for op in shape.copies + shape.scalars}
    boxes: dict[int, tuple[tuple[int, ...], int]] = {}
    ring_bytes: dict[int, int] = {}     # loop -> bytes per tile of its TMA ring
    for loop_id, shape in shapes.items():
        found = _tma_boxes(kernel, shape) if caps.tma else None
        if found is not None:
            boxes.update(found)
            ring_bytes[loop_id] = sum(tma.tile_bytes(c, bufs) for c in shape.copies)

    def note(op: ir.Op) -> ir.Op:
        if id(op) not in issued:
            return op
        if id(op) in boxes:
            box, swizzle = boxes[id(op)]
            return op.with_notes(**{ISSUED: True, tma.BOX: box, tma.SWIZZLE: swizzle})
        return op.with_notes(**{ISSUED: True})

    def block(body: tuple[ir.Stmt, ...]) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        for s in body:
            if isinstance(s, ir.Op):
                out.append(note(s))
            elif not isinstance(s, ir.For) or id(s) not in shapes:
                out.append(ir.with_blocks(s, [block(b) for b in ir.blocks(s)]))
            else:
                inner = block(s.body)
                shape = shapes[id(s)]
                tma_bytes = ring_bytes.get(id(s))
                plan = plan_pipeline(shape.stages, s.extent if isinstance(s.extent, int)
                                     else None)
                ops = [_schedule_op(step, s.line, True, tma_bytes) for step in plan.prologue]
                head = [_schedule_op(step, s.line, False, tma_bytes) for step in plan.body
                        if step.kind != "compute"]
                if tma_bytes is not None:   # the ring's mbarriers, set up (ring_setup.py)
                    out += ring_setup(shape.stages, s.line)
                out += [op for op in ops if op is not None]
                out.append(dataclasses.replace(
                    s, body=(*[op for op in head if op is not None], *inner)))
                if tma_bytes is None:
                    out.append(ir.Op("async_wait", (), None, {"count": 0}, s.line))
        return out

    return dataclasses.replace(kernel, body=tuple(block(kernel.body)))


def scheduled(loop: ir.For) -> bool:
    """Whether the pipelining pass gave ``loop`` a schedule (its body starts with the
    iteration's ``async_wait`` or ``tma_wait``; a loop holding another loop's prologue is
    not one)."""
    return (loop.kind == "pipelined" and bool(loop.body) and isinstance(loop.body[0], ir.Op)
            and loop.body[0].kind in ("async_wait", "tma_wait"))


def is_ring(loop: ir.For) -> bool:
    """Whether a scheduled loop's schedule is a TMA mbarrier ring."""
    return scheduled(loop) and loop.body[0].kind == "tma_wait"


def split_schedule(loop: ir.For) -> tuple[tuple[ir.Stmt, ...], tuple[ir.Stmt, ...]]:
    """A scheduled loop's body: its schedule (up to its first top-level ``async_commit``,
    or a ring's ``tma_issue``) and the compute that follows (which may hold the prologue of
    a nested loop)."""
    last = "tma_issue" if is_ring(loop) else "async_commit"
    first = next(i for i, s in enumerate(loop.body)
                 if isinstance(s, ir.Op) and s.kind == last)
    return loop.body[:first + 1], loop.body[first + 1:]


def issued_copies(loop: ir.For) -> list[ir.Op]:
    """The staged copies of a scheduled loop (the copies its ``async_issue`` runs)."""
    return [s for s in loop.body if isinstance(s, ir.Op) and s.kind == "copy"
            and s.notes.get(ISSUED)]


def issued_stages(kernel: ir.Kernel) -> dict[str, int]:
    """Shared buffers the scheduled loops multi-buffer, with their number of stages (as
    :func:`staged_buffers`, read from the pipelining pass's IR)."""
    return {c.attrs["dst"].buffer: loop.stages for loop in _loops(kernel.body)
            if scheduled(loop) for c in issued_copies(loop)}
