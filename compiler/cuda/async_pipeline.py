"""The cp.async schedule of a pipelined loop: multi-buffering, commit and wait counts, barriers.

``@jt.pipelined(n, stages=s)`` over a loop whose iteration ``k`` first copies tile ``k`` of one
or more global operands into shared memory and then computes on it becomes (GPU.md, "software
pipeline"), with ``S = stages`` shared buffers per operand::

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
"""

from __future__ import annotations

import dataclasses

from ..errors import KernelError


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
