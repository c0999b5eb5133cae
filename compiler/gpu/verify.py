"""The GPU passes' IR rules, checked after each GPU pass under ``JAXTILE_VERIFY_IR`` (as
:mod:`..verify` checks the neutral ones), so that IR text fed to code generation -- a golden
test's, or a pass's output -- cannot hold a schedule, barrier or plan a GPU would get wrong:

- **cp.async schedule**: an ``async_wait``'s count is at most ``stages - 2`` inside a
  pipelined loop (so the iteration's own tile is complete) and 0 after it (nothing carrying
  data stays in flight); an ``async_issue`` fills a tile fewer than ``stages`` iterations
  ahead (so it never refills the stage being read); the prologue's issues stand right before
  their loop, and a loop's issues only in its own schedule.
- **TMA rings**: a ``tma_wait`` stands only at the head of a ring's schedule, and each wait
  is completed by exactly one arrival: the prologue issues tiles ``0 .. stages-2`` once each
  and the iteration tile ``k + stages - 1`` (so the wait for tile ``k`` at stage ``k % S``,
  parity ``(k / S) & 1``, finds the phase its tile's issue completes, and no stage gets a
  second arrival in one phase); a ring's issues announce exactly the bytes its loads complete
  (the sum of its TMA copies' tiles, else the phase never completes or completes early); its
  staged copies are all TMA copies whose box tiles their destination, and a cp.async loop has
  none; its prologue follows its set-up (:func:`.ring_setup.verify_ring_setup`: a
  proxy-fence barrier, ``mbarrier_init`` of its stages, a barrier), except in a
  warp-specialised kernel, whose ``warp_specialise`` op initialises the ring itself.
- **Ping-pong turns** (:func:`.pingpong.check_pingpong`): turn barriers within the PTX ISA's
  ids and counts and apart from the block's and the consumers' barrier, every gemm of the ring
  loop inside one turn (a ``turn_wait`` before, a ``turn_pass`` after, nothing else between),
  warpgroup 0's first wait and the last warpgroup's last hand-over the only ones skipped.
- **Barriers in uniform control flow**: no ``barrier``, ``turn_*`` or ``async_*`` op inside a
  branch or loop whose condition may differ between the threads of a block (it reads global memory
  the kernel writes: :func:`.codegen.control.thread_varying`): some threads would wait at a
  barrier others never reach.
- **Copy thread mappings**: a copy's ``vec`` (:mod:`.copy_mapping`) is a positive integer
  that divides the tile's last dimension, at most 16 bytes of the wider element type (the
  widest access a thread makes), and 1 when a region picks one element of its last
  dimension.
- **Shared-memory offsets**: each is a non-negative multiple of :data:`.smem_plan.ALIGN`, and
  buffers live at the same statement (:func:`.smem_plan.lifetimes`) have disjoint bytes.

After the barrier pass (:func:`verify_scratch_barriers`, its rule):

- **Scratch reuse is ordered**: where an op's scratch (:func:`.smem_plan.scratch_bytes`)
  takes bytes that an earlier access -- another op's scratch, a shared buffer, the same op's
  scratch in the previous iteration of a loop -- touched, a ``barrier`` stands between them
  on every path, and likewise where a buffer access follows scratch on its bytes. Barriers
  are counted per path, conservatively (any access by any thread); a scratch op counts as a
  barrier for what follows it, its lowering's own (:mod:`.codegen.scratch`). Only pairs with
  a scratch side are checked: buffers sharing bytes are the barrier pass's usual hazards.

- **Proxy fences** (:func:`verify_barrier_pass`): a wgmma gemm's shared operand written by
  generic stores or copies (``cp.async`` included) since the last barrier noted
  ``proxy_fence`` (``fence.proxy.async`` then the barrier), on any path, is refused: wgmma
  reads through the async proxy and could see stale bytes.

Each rule raises a KernelError naming the rule, the buffer or op and its line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .. import ir, op_defs
from ..errors import KernelError, kernel_error
from . import tma
from .barriers import PROXY_FENCE, async_proxy_reads
from .codegen.control import thread_varying
from .copy_mapping import NOTE, vector_width
from .copy_schedule import (
    ISSUE_KINDS,
    ISSUED,
    SCHEDULE_KINDS,
    is_ring,
    issued_copies,
    scheduled,
    split_schedule,
)
from .pingpong import PASS, WAIT, check_pingpong
from .ring_setup import verify_ring_setup
from .smem_plan import ALIGN, lifetimes, recorded_bytes, scratch_bytes
from .warp_specialise import split_of

_SYNC = ("barrier", WAIT, PASS, *SCHEDULE_KINDS)


def _fail(kernel: ir.Kernel, where: ir.Stmt | ir.Buffer, message: str) -> KernelError:
    return kernel_error(kernel.name, message, getattr(where, "line", None))


def _schedule(kernel: ir.Kernel, body: Sequence[ir.Stmt], loop: ir.For | None) -> None:
    """The cp.async rules for ``body`` (``loop``: the pipelined loop whose body it is)."""
    for i, s in enumerate(body):
        if isinstance(s, ir.Op) and s.kind == "async_wait":
            most = loop.stages - 2 if loop is not None else 0
            if not 0 <= s.attrs["count"] <= most:
                where = (f"in a loop of {loop.stages} stages" if loop is not None
                         else "outside a pipelined loop")
                raise _fail(kernel, s, f"async_wait {{count={s.attrs['count']}}} {where}: "
                            f"at most {most} groups may stay in flight")
        elif isinstance(s, ir.Op) and s.kind == "tma_wait" and (loop is None or
                                                                 not is_ring(loop)):
            raise _fail(kernel, s, "a tma_wait outside the schedule of a TMA ring")
        elif isinstance(s, ir.Op) and s.kind in ISSUE_KINDS:
            if s.attrs["prologue"]:
                nxt = next((t for t in body[i + 1:] if not (isinstance(t, ir.Op) and t.kind in
                            (*ISSUE_KINDS, "async_commit"))), None)
                target = nxt if isinstance(nxt, ir.For) and scheduled(nxt) else None
                if target is None:
                    raise _fail(kernel, s, f"a prologue {s.kind} must stand right before "
                                "its pipelined loop")
            elif loop is None:
                raise _fail(kernel, s, f"an {s.kind} outside the schedule of a pipelined "
                            "loop")
            else:
                target = loop
            if not 0 <= s.attrs["tile"] < target.stages:
                raise _fail(kernel, s, f"{s.kind} of tile k + {s.attrs['tile']} in a loop of "
                            f"{target.stages} stages would refill a stage still in use")
            if (s.kind == "tma_issue") != is_ring(target):
                raise _fail(kernel, s, f"{s.kind} in the schedule of a "
                            f"{'TMA ring' if is_ring(target) else 'cp.async pipeline'}")
        elif isinstance(s, ir.For) and scheduled(s):
            _ring(kernel, s, body[:i])
            schedule, compute = split_schedule(s)
            _schedule(kernel, schedule, s)
            _schedule(kernel, compute, None)
        else:
            for block in ir.blocks(s):
                _schedule(kernel, block, None)


def _ring(kernel: ir.Kernel, loop: ir.For, before: Sequence[ir.Stmt]) -> None:
    """The TMA-ring rules (module docstring) for scheduled ``loop``, whose prologue ends
    ``before``."""
    bufs = {b.name: b for b in kernel.buffers}
    copies = issued_copies(loop)
    noted = [c for c in copies if tma.BOX in c.notes]
    if not is_ring(loop):
        if noted:
            raise _fail(kernel, noted[0], "a TMA copy (note tma_box) in a cp.async pipeline")
        return
    prologue: list[ir.Op] = []
    for t in reversed(before):
        if not (isinstance(t, ir.Op) and t.kind in ISSUE_KINDS and t.attrs["prologue"]):
            break
        prologue.insert(0, t)
    # A warp-specialised kernel's own op initialises its ring (its pass drops the set-up).
    why = None if split_of(kernel) is not None else verify_ring_setup(
        list(before[:len(before) - len(prologue)]), loop.stages)
    if why is not None:
        raise _fail(kernel, loop, why)
    head, _ = split_schedule(loop)
    issues = [t for t in head if isinstance(t, ir.Op) and t.kind in ISSUE_KINDS]
    waits = [t for t in head if isinstance(t, ir.Op) and t.kind == "tma_wait"]
    tiles = sorted(t.attrs["tile"] for t in prologue)
    known = isinstance(loop.extent, int)
    expected = list(range(min(loop.stages - 1, loop.extent) if known else loop.stages - 1))
    if tiles != expected or any(not t.attrs["guard"] for t in prologue if not known):
        raise _fail(kernel, loop, f"the TMA ring of {loop.stages} stages has prologue issues "
                    f"of tiles {tiles}, not {expected}: a wait would find no arrival for its "
                    "tile, or a phase two")
    if len(waits) != 1 or [t.attrs["tile"] for t in issues] != [loop.stages - 1]:
        raise _fail(kernel, loop, f"the TMA ring of {loop.stages} stages must wait once and "
                    f"issue tile k + {loop.stages - 1} in each iteration (waits {len(waits)}, "
                    f"issues {[t.attrs['tile'] for t in issues]})")
    if len(noted) != len(copies) or not copies:
        raise _fail(kernel, loop, "a TMA ring whose staged copies are not all TMA copies")
    for c in noted:
        box = tuple(c.notes[tma.BOX])
        if tma.tma_box(c, bufs) != (box, c.notes[tma.SWIZZLE]):
            raise _fail(kernel, c, f"TMA copy with box {list(box)} and swizzle "
                        f"{c.notes[tma.SWIZZLE]}: its source and destination need "
                        f"{tma.tma_box(c, bufs)}")
    need = sum(tma.tile_bytes(c, bufs) for c in noted)
    for t in prologue + issues:
        if t.attrs["bytes"] != need:
            raise _fail(kernel, t, f"tma_issue announces {t.attrs['bytes']} bytes but its "
                        f"loads complete {need}: the stage's phase would "
                        f"{'never complete' if t.attrs['bytes'] > need else 'complete early'}")


def _uniform(kernel: ir.Kernel, body: Sequence[ir.Stmt], varying: set[int],
             under: ir.Stmt | None) -> None:
    for s in body:
        if isinstance(s, ir.Op) and s.kind in _SYNC and under is not None:
            # A user's program reaches this (a loop whose exit depends on other blocks'
            # writes around code that needs the block together), so say it in their terms.
            construct = "jt.while_" if isinstance(under, ir.While) else "branch"
            need = s.kind + (f": {s.notes['reason']}" if s.notes.get("reason") else "")
            raise _fail(kernel, s, f"the condition of the {construct} at {under.line or '?'} "
                        "reads global memory the kernel writes, so threads may not all reach "
                        f"the block-wide {need} inside it (for the op at {s.line or '?'}); "
                        "compute the condition from inputs or on-chip data")
        if isinstance(s, ir.If):
            inner = s if s.cond.id in varying else under
        elif isinstance(s, ir.While):
            inner = s if s.test.id in varying else under
        elif isinstance(s, ir.For):
            bounds = [v for v in (s.start, s.extent) if isinstance(v, ir.Value)]
            inner = s if any(v.id in varying for v in bounds) else under
        else:
            continue
        for block in ir.blocks(s):
            _uniform(kernel, block, varying, inner)


def _copy_mappings(kernel: ir.Kernel) -> None:
    bufs = {b.name: b for b in kernel.buffers}
    for s in ir.walk(kernel.body):
        if not (isinstance(s, ir.Op) and s.kind == "copy" and NOTE in s.notes):
            continue
        vec, shape = s.notes[NOTE], s.attrs["src"].shape
        # The pass's choice is the widest legal run, so any run it could take divides it.
        widest = vector_width(s, bufs)
        if not (isinstance(vec, int) and vec >= 1 and widest % vec == 0):
            last = shape[-1] if shape else 1
            raise _fail(kernel, s, f"copy with {NOTE}={vec!r}: a thread's run must be a "
                        f"positive divisor of {widest} (the tile's last dimension is {last}, "
                        "and a run is at most 16 bytes)")


def _offsets(kernel: ir.Kernel) -> None:
    offsets, sizes = recorded_bytes(kernel)
    bufs = {b.name: b for b in kernel.buffers}
    for name, at in offsets.items():
        if not isinstance(at, int) or at < 0 or at % ALIGN:
            raise _fail(kernel, bufs[name], f"shared buffer '{name}' has offset {at!r}: not a "
                        f"non-negative multiple of {ALIGN} bytes")
    spans = lifetimes(kernel.body, set(offsets))
    names = sorted(n for n in offsets if n in spans)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            bytes_meet = offsets[a] < offsets[b] + sizes[b] and offsets[b] < offsets[a] + sizes[a]
            live_together = spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]
            if bytes_meet and live_together:
                raise _fail(kernel, bufs[b], f"shared buffers '{a}' (bytes {offsets[a]}.."
                            f"{offsets[a] + sizes[a]}) and '{b}' (bytes {offsets[b]}.."
                            f"{offsets[b] + sizes[b]}) overlap while both are live")


def verify_gpu(kernel: ir.Kernel) -> ir.Kernel:
    """Check the GPU rules (module docstring) and return ``kernel`` unchanged."""
    _schedule(kernel, kernel.body, None)
    _uniform(kernel, kernel.body, thread_varying(kernel), None)
    _copy_mappings(kernel)
    _offsets(kernel)
    check_pingpong(kernel)
    return kernel


@dataclasses.dataclass(frozen=True, eq=False)
class _Touch:
    """Shared bytes an op touched: ``what`` names them (a buffer, or an op's scratch)."""

    what: str
    lo: int
    hi: int
    scratch: bool
    op: ir.Op


class _ReuseCheck:
    """The scratch-reuse rule: walks the body with the shared bytes touched since the last
    barrier on some path (:func:`verify_scratch_barriers`)."""

    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        offsets, sizes = recorded_bytes(kernel)
        self.spans = {n: (at, at + sizes[n]) for n, at in offsets.items()}
        self._seen: dict[int, list[_Touch]] = {}

    def _touches(self, op: ir.Op, rest: Sequence[ir.Stmt]) -> list[_Touch]:
        scratch = [_Touch(f"the {role} scratch of the {op.kind}", lo, hi, True, op)
                   for role, lo, hi in scratch_bytes(op)]
        ops = [op]
        if op.kind in ISSUE_KINDS and op.attrs["prologue"]:
            # The prologue's copies land in the stages of the loop that follows it.
            loop = next((s for s in rest if isinstance(s, ir.For)), None)
            ops = issued_copies(loop) if loop is not None else []
        buffers = [_Touch(f"buffer '{r.buffer}'", *self.spans[r.buffer], False, op)
                   for o in ops for r in ir.regions(o) if r.buffer in self.spans]
        return scratch + buffers

    def body(self, body: Sequence[ir.Stmt], pending: list[_Touch]) -> list[_Touch]:
        for i, s in enumerate(body):
            if isinstance(s, ir.Op):
                if s.kind == "barrier":
                    pending = []
                    continue
                if id(s) not in self._seen:     # the same objects on every visit
                    self._seen[id(s)] = self._touches(s, body[i + 1:])
                touches = self._seen[id(s)]
                for t in touches:
                    for p in pending:
                        if (t.scratch or p.scratch) and p.lo < t.hi and t.lo < p.hi:
                            raise _fail(self.kernel, s, f"{t.what} (bytes {t.lo}..{t.hi}) "
                                        f"reuses bytes of {p.what} (bytes {p.lo}..{p.hi}, at "
                                        f"{p.op.line or '?'}) with no barrier between them")
                # A scratch op's lowering synchronises the block inside it.
                scratch = any(t.scratch for t in touches)
                pending = list(touches) if scratch else _merge(pending, touches)
            elif isinstance(s, ir.While):
                # The loop leaves after a condition; the second iteration meets what the
                # first left pending.
                entry, exits = pending, []
                for _ in range(2):
                    after = self.body(s.cond, entry)
                    exits = _merge(exits, after)
                    entry = _merge(pending, self.body(s.body, after))
                pending = exits
            elif isinstance(s, ir.For):
                once = isinstance(s.extent, int) and s.extent <= 1
                entry = pending
                for _ in range(1 if once else 2):
                    end = self.body(s.body, entry)
                    entry = _merge(pending, end)
                pending = end if once else entry
            else:
                pending = _merge(self.body(s.then, pending), self.body(s.otherwise, pending))
        return pending


def _merge(a: list[_Touch], b: list[_Touch]) -> list[_Touch]:
    seen = {id(t) for t in a}
    return a + [t for t in b if id(t) not in seen]


def verify_scratch_barriers(kernel: ir.Kernel) -> ir.Kernel:
    """Check the scratch-reuse rule (module docstring) and return ``kernel`` unchanged."""
    _ReuseCheck(kernel).body(kernel.body, [])
    return kernel


class _ProxyCheck:
    """The proxy-fence rule: walks the body with the shared buffers written by generic
    stores and copies since the last ``proxy_fence`` barrier (per path, any thread)."""

    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.bufs = {b.name: b for b in kernel.buffers}
        offsets, sizes = recorded_bytes(kernel)
        self.spans = {n: (at, at + sizes[n]) for n, at in offsets.items()}

    def _overlap(self, a: str, b: str) -> bool:
        if a == b:
            return True
        x, y = self.spans.get(a), self.spans.get(b)
        return x is not None and y is not None and x[0] < y[1] and y[0] < x[1]

    def _writes(self, op: ir.Op, rest: Sequence[ir.Stmt], loop: ir.For | None) -> list[str]:
        """The shared buffers ``op`` writes through the generic proxy where it stands: a
        pipeline's staged copies at the loop's ``async_wait`` (where their data lands) and
        at the prologue's issue, not where the copies stand in the body."""
        ops = [op]
        if op.kind == "async_issue" and op.attrs["prologue"]:
            after = next((s for s in rest if isinstance(s, ir.For)), None)
            ops = issued_copies(after) if after is not None else []
        elif op.kind == "async_wait":
            ops = issued_copies(loop) if loop is not None else []
        elif op.kind in SCHEDULE_KINDS or op.notes.get(ISSUED):
            ops = []
        out = []
        for o in ops:
            d = op_defs.get(o.kind)
            out += [r.buffer for attr, r in o.attrs.items() if isinstance(r, ir.Region)
                    and attr in d.writes and self.bufs[r.buffer].scope == "shared"]
        return out

    def body(self, body: Sequence[ir.Stmt], pending: set[str],
             loop: ir.For | None = None) -> set[str]:
        for i, s in enumerate(body):
            if isinstance(s, ir.Op):
                if s.kind == "barrier":
                    pending = set() if s.notes.get(PROXY_FENCE) else pending
                    continue
                for r in async_proxy_reads(s, self.bufs):
                    hit = next((w for w in sorted(pending) if self._overlap(w, r.buffer)), None)
                    if hit is not None:
                        raise _fail(self.kernel, s, f"proxy fence: the wgmma reads shared "
                                    f"buffer '{r.buffer}' through the async proxy after "
                                    f"generic writes of '{hit}' with no barrier carrying "
                                    f"fence.proxy.async ({PROXY_FENCE}) between them")
                pending = pending | set(self._writes(s, body[i + 1:], loop))
            elif isinstance(s, ir.While):
                entry: set[str] = set(pending)
                for _ in range(2):
                    after = self.body(s.cond, entry)
                    entry = pending | self.body(s.body, after)
                pending = after
            elif isinstance(s, ir.For):
                once = isinstance(s.extent, int) and s.extent <= 1
                entry = set(pending)
                for _ in range(1 if once else 2):
                    end = self.body(s.body, entry, s)
                    entry = pending | end
                pending = end if once else entry
            else:
                pending = self.body(s.then, pending) | self.body(s.otherwise, pending)
        return pending


def verify_barrier_pass(kernel: ir.Kernel) -> ir.Kernel:
    """The barrier pass's rules: scratch reuse is ordered (:func:`verify_scratch_barriers`)
    and every async-proxy read of shared bytes a generic write touched has a ``proxy_fence``
    barrier between them on every path; returns ``kernel`` unchanged."""
    verify_scratch_barriers(kernel)
    _ProxyCheck(kernel).body(kernel.body, set())
    return kernel
