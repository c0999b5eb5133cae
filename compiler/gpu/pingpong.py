"""Ping-pong scheduling (sm_90a): a split kernel's consumer warpgroups take turns at the
tensor cores, so that one's non-GEMM work overlaps another's GEMMs (FlashAttention-3).

After :mod:`.warp_specialise` every consumer warpgroup runs the ring loop's body as
written. In attention's body, ``S = Q K^T`` (wgmma), the softmax (CUDA cores), ``O += P V``
(wgmma), the warpgroups all reach their GEMMs at about the same time and then all do their
softmax while the tensor cores idle. This pass orders the GEMMs instead: each maximal run of
consecutive gemm ops in the body is a *turn*, and the warpgroups ``0 .. W-1`` take the turns
round-robin, so that while warpgroup ``w`` does the softmax between its turns, ``w + 1``
has its turn::

    wg 0:  G0 | softmax    | G1 |       | G0 | softmax ...
    wg 1:     | G0 | softmax    | G1 |       | G0 ...

**The protocol**, on named barriers ``B .. B + W - 1`` (``B`` = the ws pass's consumer
barrier + 1; ``X_w = B + w`` is warpgroup ``w``'s turn), each counting ``2 x 128`` threads:
the warpgroup that waits and the one that hands over::

    before a run of gemms (turn_wait):   bar.sync   X_w, 256         warpgroup w's turn
    after it (turn_pass):                bar.arrive X_(w+1)%W, 256   the next warpgroup's

PTX ISA (``bar.sync``/``bar.arrive``): ``bar.arrive`` counts the executing warp's threads
toward the barrier without waiting, ``bar.sync`` counts them and waits until the count
``b`` (a multiple of the warp size, the same on every participant) is reached; the barrier
then resets for its next use. So the 128 threads of ``w - 1``'s hand-over and the 128 of
``w``'s wait complete one instance of ``X_w``.

**First turn, last iteration, any trip count.** With ``n`` iterations and ``t`` turns per
iteration each warpgroup takes ``n t`` turns in the same order (``n`` is the block's: the ws
pass computes the loop's bounds from block indices, the same for every warpgroup). Warpgroup
0's first turn (the body's first run in iteration 0, ``first`` on the wait) does not wait:
nobody handed it over; warpgroup ``W - 1``'s last hand-over (the body's last run in
iteration ``n - 1``, ``last`` on the pass) is not made: nobody would take it. Then for
``n >= 1`` each ``X_w`` sees as many hand-overs as waits (``n t`` each, or ``n t - 1`` for
``X_0``), so no instance stays open at the kernel's end, and ``n = 0`` runs no barrier at
all. No hand-over can meet an earlier one's open instance: between two of ``w - 1``'s
hand-overs on ``X_w`` the turn goes round every warpgroup, so ``w`` has waited on the first. Both
conditions and the warpgroup index are warp-uniform, as a ``bar`` instruction needs.

**The IR.** A ``pingpong`` op second in the body (after ``warp_specialise``:
``warpgroups``, ``barrier`` = ``B``, ``count``); in the ring loop's body a ``turn_wait``
before each run of gemms and a ``turn_pass`` after it, each with the same three attributes,
``first``/``last`` as above, and the loop variable (and its extent, for the last iteration)
as operands. Code generation only prints them (``barrier_sync``/``barrier_arrive``).
The loop's top barrier, which the ws pass keeps over all consumers when the body reads
shared memory besides the stages (attention's ``Q``), moves to just before the loop where
the body only reads that memory: it then orders only writes made before the loop, as it does
from there, and inside the loop it would put the warpgroups back in step.

**When.** On a kernel the ws pass split, with ``W >= 2`` consumer warpgroups and
``B + W - 1 <= 15``, for the ring loop whose body holds, at its top level, two or more runs
of gemm ops separated by other work, every gemm a wgmma (the tensor cores being shared),
none nested deeper, and no ``barrier``: a barrier over every consumer puts the warpgroups in
step, which undoes the alternation (and one inside a turn would deadlock). The loop's
``pingpong`` flag (``jt.pipelined(..., pingpong=...)``) overrides: False leaves the kernel
alone, True is an error naming the failed condition (also where the ws pass did not split
the kernel), None applies it where the conditions hold.

Assumes: the ws pass ran (its split is final). Guarantees: :func:`check_pingpong` holds
(the protocol's rule, also run by :func:`.verify.verify_gpu`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import ir, op_defs
from ..errors import KernelError, kernel_error
from .copy_schedule import ISSUE_KINDS, ISSUED, PUBLISH, issued_copies
from .gemm_plan import GemmInstr, recorded
from .warp_specialise import CONSUMER_BARRIER, WARPGROUP, ring_loop, split_of

KIND = "pingpong"
WAIT, PASS = "turn_wait", "turn_pass"
FIRST_BARRIER = CONSUMER_BARRIER + 1
"""The first turn barrier: ids below it are the block's (0) and the ws pass's consumers'."""
MAX_BARRIER = 15
"""The PTX ISA's named barriers are 0..15."""
COUNT = 2 * WARPGROUP
"""Threads of one turn barrier's instance: the waiting warpgroup and the handing one."""


def pingpong_of(kernel: ir.Kernel) -> ir.Op | None:
    """The kernel's ``pingpong`` op, or None when the pass did not apply it."""
    return next((s for s in kernel.body[:2] if isinstance(s, ir.Op) and s.kind == KIND),
                None)


def _runs(body: tuple[ir.Stmt, ...]) -> list[tuple[int, int]]:
    """``(first, last)`` indices of each maximal run of consecutive gemm ops in ``body``."""
    runs: list[tuple[int, int]] = []
    for i, s in enumerate(body):
        if isinstance(s, ir.Op) and s.kind == "gemm":
            if runs and runs[-1][1] == i - 1:
                runs[-1] = (runs[-1][0], i)
            else:
                runs.append((i, i))
    return runs


def _hoistable(kernel: ir.Kernel, loop: ir.For) -> ir.Op | None:
    """The ring loop's top barrier (the pipelining pass's, which the ws pass keeps, named,
    when the body touches shared memory besides the stages) where every such buffer is only
    read in the body: then it orders only writes made before the loop (attention's ``Q``
    tile) and does the same from just before it, outside the turns."""
    tops = [s for s in loop.body if isinstance(s, ir.Op) and s.kind == "barrier"]
    if len(tops) != 1 or tops[0].notes.get("reason") != PUBLISH:
        return None
    staged = {c.attrs["dst"].buffer for c in issued_copies(loop)}
    shared = {b.name for b in kernel.buffers if b.scope == "shared"} - staged
    for s in ir.walk(loop.body):
        if isinstance(s, ir.Op) and not s.notes.get(ISSUED) and any(
                r.buffer in shared for r in op_defs.writes(s)):
            return None
    return tops[0]


def _refusal(kernel: ir.Kernel) -> str | None:
    """Why the kernel cannot have ping-pong scheduling, or None."""
    if split_of(kernel) is None:
        return "the kernel is not warp-specialised (no producer warpgroup feeds a TMA ring)"
    warpgroups = kernel.threads // WARPGROUP
    if warpgroups < 2:
        return f"its {kernel.threads} consumer threads are one warpgroup: nobody to alternate with"
    if FIRST_BARRIER + warpgroups - 1 > MAX_BARRIER:
        return (f"{warpgroups} warpgroups need named barriers {FIRST_BARRIER}.."
                f"{FIRST_BARRIER + warpgroups - 1}, past {MAX_BARRIER}")
    loop = ring_loop(kernel)
    if not (isinstance(loop.start, int) and loop.start == 0):
        return "the loop does not count from 0 (its first iteration is told by k == 0)"
    top = {id(s) for s in loop.body}
    hoisted = _hoistable(kernel, loop)
    for s in ir.walk(loop.body):
        if isinstance(s, ir.Op) and s.kind == "gemm":
            if id(s) not in top:
                return f"the gemm at {s.line} is nested inside a statement of the loop body"
            plan = recorded(s, kernel)
            if plan is None or plan.instr != GemmInstr.WGMMA:
                return f"the gemm at {s.line} is not a wgmma"
        elif isinstance(s, ir.Op) and s.kind == "barrier" and s is not hoisted:
            return (f"the barrier at {s.line} ({s.notes.get('reason', 'a hazard')}) puts the "
                    "consumer warpgroups in step inside the loop")
    if len(_runs(loop.body)) < 2:
        return "its body has no work between two GEMMs for another warpgroup's GEMMs to overlap"
    return None


def pingpong(kernel: ir.Kernel) -> ir.Kernel:
    """The pass (module docstring): the turn-taking protocol in ``kernel``'s ring loop where
    it applies, else ``kernel`` unchanged."""
    loops = [s for s in ir.walk(kernel.body) if isinstance(s, ir.For) and s.kind == "pipelined"]
    if any(s.pingpong is False for s in loops):
        return kernel
    asked = [s for s in loops if s.pingpong]
    why = _refusal(kernel)
    if why is None and asked and not any(s is ring_loop(kernel) for s in asked):
        why = "it is not the warp-specialised ring loop"
    if why is not None:
        if asked:
            raise kernel_error(kernel.name, f"jt.pipelined(..., pingpong=True): cannot "
                               f"schedule this loop's warpgroups in turns: {why}",
                               asked[0].line)
        return kernel
    return check_pingpong(_apply(kernel))


def _apply(kernel: ir.Kernel) -> ir.Kernel:
    loop = ring_loop(kernel)
    warpgroups = kernel.threads // WARPGROUP
    attrs = {"warpgroups": warpgroups, "barrier": FIRST_BARRIER, "count": COUNT}
    hoisted = _hoistable(kernel, loop)
    runs = _runs(loop.body)
    extent: list[ir.Stmt] = []
    n = loop.extent
    if not isinstance(n, ir.Value):   # (an operand: a constant before the first turn)
        const = ir.Op("const", (), ir.Value((), np.dtype(np.int32)), {"value": n}, loop.line)
        extent, n = [const], const.result
    body: list[ir.Stmt] = []
    for i, s in enumerate(loop.body):
        if s is hoisted:
            continue
        for r, (lo, _) in enumerate(runs):
            if i == lo:
                body += [*(extent if r == 0 else ()),
                         ir.Op(WAIT, (loop.var,), None, {**attrs, "first": r == 0}, s.line)]
        body.append(s)
        for r, (_, hi) in enumerate(runs):
            if i == hi:
                last = r == len(runs) - 1
                body.append(ir.Op(PASS, (loop.var, n), None, {**attrs, "last": last}, s.line))
    new_loop = dataclasses.replace(loop, body=tuple(body))
    head = ir.Op(KIND, (), None, attrs, loop.line)
    split, *rest = kernel.body
    at = next(i for i, s in enumerate(rest) if s is loop)
    rest[at] = new_loop
    while at and isinstance(rest[at - 1], ir.Op) and rest[at - 1].kind in ISSUE_KINDS:
        at -= 1   # (before the prologue's issues, which stand right before their loop)
    rest[at:at] = [hoisted] if hoisted is not None else []
    return dataclasses.replace(kernel, body=(split, head, *rest))


def check_pingpong(kernel: ir.Kernel) -> ir.Kernel:
    """The protocol's rule on ``kernel``, returned unchanged; a KernelError names what is
    broken: ids and counts within the PTX ISA's (ids 0..15 not the block's or the ws
    pass's, a count of both warpgroups' threads), every gemm of the ring loop inside a turn
    (a ``turn_wait`` and a ``turn_pass`` around each run of gemms, with nothing else between
    them), each run's wait and pass agreeing with the ``pingpong`` op, ``first`` on the
    first wait alone and ``last`` on the last pass alone."""
    head = pingpong_of(kernel)
    turns = [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op)
             and s.kind in (KIND, WAIT, PASS)]
    if head is None:
        if turns:
            raise KernelError(f"kernel {kernel.name}: ping-pong: {turns[0].kind} without a "
                              "pingpong op second in the body, after warp_specialise")
        return kernel

    def fail(why: str) -> KernelError:
        return KernelError(f"kernel {kernel.name}: ping-pong: {why}")

    a = head.attrs
    split = split_of(kernel)
    if split is None or kernel.body[1] is not head:
        raise fail("the pingpong op stands second in a warp-specialised kernel's body")
    ids = range(a["barrier"], a["barrier"] + a["warpgroups"])
    if a["warpgroups"] < 2 or a["warpgroups"] * WARPGROUP != split.attrs["consumers"]:
        raise fail(f"{a['warpgroups']} warpgroups for {split.attrs['consumers']} consumers")
    if ids.start <= split.attrs["barrier"] or ids.stop - 1 > MAX_BARRIER:
        raise fail(f"turn barriers {ids.start}..{ids.stop - 1} must lie above the block's "
                   f"(0) and the consumers' ({split.attrs['barrier']}) and below 16")
    if a["count"] != COUNT:
        raise fail(f"a turn barrier counts {a['count']} threads, not the {COUNT} of the "
                   "warpgroup waiting and the one handing over")
    loop = ring_loop(kernel)
    top = list(loop.body)
    outside = [s for s in turns if s is not head and not any(s is t for t in top)]
    if outside:
        raise fail(f"the {outside[0].kind} at {outside[0].line} is not in the ring loop's body")
    ops = [s for s in top if isinstance(s, ir.Op) and s.kind in (WAIT, PASS)]
    for s in ops:
        want = {**a, **({"first": s.attrs.get("first")} if s.kind == WAIT
                        else {"last": s.attrs.get("last")})}
        if dict(s.attrs) != want:
            raise fail(f"the {s.kind} at {s.line} has {dict(s.attrs)}, not the pingpong op's "
                       f"{dict(a)}")
        if len(s.operands) != (1 if s.kind == WAIT else 2) or s.operands[0] is not loop.var:
            raise fail(f"the {s.kind} at {s.line} does not take the ring loop's variable"
                       + ("" if s.kind == WAIT else " and its extent"))
    inside = False
    waits = passes = 0
    for s in top:
        kind = s.kind if isinstance(s, ir.Op) else type(s).__name__
        if kind == WAIT:
            if inside:
                raise fail(f"the turn_wait at {s.line} comes before the last turn's "
                           "turn_pass")
            inside, waits = True, waits + 1
            if s.attrs["first"] != (waits == 1):
                raise fail(f"the turn_wait at {s.line}: only the body's first may have "
                           "first=True (warpgroup 0's first turn needs no hand-over)")
        elif kind == PASS:
            if not inside:
                raise fail(f"the turn_pass at {s.line} hands over a turn not taken")
            inside, passes = False, passes + 1
        elif kind == "gemm" and not inside:
            raise fail(f"the gemm at {s.line} is outside a turn (no turn_wait before it)")
        elif inside and kind != "gemm":
            raise fail(f"the {kind} at {getattr(s, 'line', None)} stands inside a turn: "
                       "a turn holds gemms only")
    if inside:
        raise fail("the loop body's last turn is never handed over (no turn_pass)")
    lasts = [s for s in ops if s.kind == PASS and s.attrs["last"]]
    if waits < 2 or len(lasts) != 1 or lasts[0] is not [s for s in ops if s.kind == PASS][-1]:
        raise fail("the body's last turn_pass alone has last=True (warpgroup "
                   f"{a['warpgroups'] - 1}'s last hand-over would be taken by nobody)")
    for s in ir.walk(loop.body):
        if isinstance(s, ir.Op) and s.kind == "gemm" and not any(s is t for t in top):
            raise fail(f"the gemm at {s.line} is nested inside the loop body, outside a turn")
    return kernel
