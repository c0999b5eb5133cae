"""The set-up of a TMA ring's mbarriers, as IR: what the pipelining pass puts before a ring's
prologue (:func:`.copy_schedule.schedule_async_copies`), so that code generation only prints
it.

A ring of ``S`` stages is ``S`` mbarriers in shared memory, each expecting one arrival per
phase (the thread that announces the tile's bytes). Before its prologue:

1. ``barrier`` with ``proxy_fence``: every thread's earlier generic writes of shared memory
   are fenced for the async proxy (the ring's TMA loads may land on bytes they wrote), and
   every thread is past its waits on an earlier run of the same ring (a ring inside another
   loop is initialised again on each outer iteration; re-initialising an mbarrier some
   thread still waits on is undefined);
2. ``mbarrier_init`` (``stages``, ``count`` = 1): one thread initialises the barriers, then
   ``fence.mbarrier_init.release.cluster`` (PTX ISA, "membar/fence": the fence that makes an
   ``mbarrier.init`` visible to the async proxy and to later ``mbarrier`` operations of other
   threads);
3. ``barrier``: no thread arrives on or waits for a barrier before its initialisation (the
   emulator reports that as ``mbarrier-init-race``).

:func:`verify_ring_setup` checks the three stand there, in that order, right before each
ring's prologue (the GPU rules, :func:`.verify.verify_gpu`).
"""

from __future__ import annotations

from .. import ir

INIT = "mbarrier_init"
"""The op kind of a ring's initialisation (attrs ``stages``, ``count``)."""
REUSE = "every thread is past its waits on an earlier run of the ring"
READY = "the ring is initialised before any thread uses it"


def ring_setup(stages: int, line: str | None) -> list[ir.Op]:
    """The ops before the prologue of a TMA ring of ``stages`` stages (module docstring)."""
    return [ir.Op("barrier", (), None, {}, line, {"reason": REUSE, "proxy_fence": True}),
            ir.Op(INIT, (), None, {"stages": stages, "count": 1}, line),
            ir.Op("barrier", (), None, {}, line, {"reason": READY})]


def verify_ring_setup(before: list[ir.Stmt], stages: int) -> str | None:
    """What is wrong with the statements ``before`` a ring's prologue as its set-up (they
    end right before the prologue), or None."""
    tail = before[-3:]
    kinds = [s.kind if isinstance(s, ir.Op) else type(s).__name__ for s in tail]
    if kinds != ["barrier", INIT, "barrier"]:
        return (f"the TMA ring's prologue must follow its set-up (barrier with proxy_fence, "
                f"{INIT}, barrier), not {kinds}")
    first, init, _ = tail
    assert isinstance(first, ir.Op) and isinstance(init, ir.Op)
    if not first.notes.get("proxy_fence"):
        return "the barrier before a TMA ring's initialisation must carry proxy_fence"
    if init.attrs["stages"] != stages or init.attrs["count"] != 1:
        return (f"{INIT} of {init.attrs['stages']} barriers expecting {init.attrs['count']} "
                f"arrivals, for a ring of {stages} stages whose phases take one")
    return None

