"""The cp.async pipeline schedule: commit / wait counts and barriers for every stage count and
trip count (static, run-time, smaller than the stages), and the checker catching broken ones."""

import dataclasses

import pytest

from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu.copy_schedule import Step, check_schedule, plan_pipeline


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("static", [True, False], ids=["static_n", "runtime_n"])
def test_schedule_is_hazard_free_for_every_trip_count(stages, static):
    for n in range(0, 12):
        plan = plan_pipeline(stages, n if static else None)
        assert check_schedule(plan, n) == [], (stages, n)


def test_schedule_shape():
    plan = plan_pipeline(3)
    assert [s.kind for s in plan.prologue] == ["copy", "commit", "copy", "commit"]
    assert all(s.guard == "runtime" for s in plan.prologue if s.kind == "copy")
    assert [(s.kind, s.count, s.tile) for s in plan.body] == [
        ("wait", 1, 0), ("barrier", 0, 0), ("copy", 0, 2), ("commit", 0, 0), ("compute", 0, 0)]
    assert plan.buffers == 3
    assert plan.text().splitlines()[1] == "  if 0 < n: copy tile 0 -> buffer (0) % S"
    assert "  cp_async_wait<1>" in plan.text().splitlines()


def test_short_static_trip_count_keeps_the_commits():
    # n = 1 < stages - 1: the copy of tile 1 is dropped, its (empty) group is still committed,
    # so the body's wait<2> still means "tile k is done".
    plan = plan_pipeline(4, 1)
    assert [s.kind for s in plan.prologue] == ["copy", "commit", "commit", "commit"]
    assert plan.body[0] == Step("wait", count=2)


def _without(plan, kind, where="body"):
    steps = list(getattr(plan, where))
    i = next(i for i, s in enumerate(steps) if s.kind == kind)
    del steps[i]
    return dataclasses.replace(plan, **{where: tuple(steps)})


@pytest.mark.parametrize("mutate,problem", [
    (lambda p: _without(p, "barrier"), "before a barrier published it"),
    (lambda p: dataclasses.replace(p, body=(Step("wait", count=2),) + p.body[1:]),
     "before its cp.async retired"),
    # No commit in the loop: the copies stay in an open group that no wait retires.
    (lambda p: dataclasses.replace(p, body=tuple(s for s in p.body if s.kind != "commit")),
     "before its cp.async retired"),
    # Refill before the barrier: another thread may still read that buffer.
    (lambda p: dataclasses.replace(p, body=(p.body[0], p.body[2], p.body[1]) + p.body[3:]),
     "while other threads may still read it"),
    (lambda p: _without(p, "copy", "prologue"), "expected 0 .. 5 once each"),
])
def test_checker_catches_broken_schedules(mutate, problem):
    problems = check_schedule(mutate(plan_pipeline(3)), 6)
    assert any(problem in x for x in problems), problems


def test_bad_arguments():
    with pytest.raises(KernelError, match="stages must be >= 1"):
        plan_pipeline(0)
    with pytest.raises(KernelError, match="negative trip count"):
        plan_pipeline(2, -1)
