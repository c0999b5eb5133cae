"""Warp specialisation (sm_90a): a TMA ring's loads move to a producer warpgroup of their own.

The pipelining pass (:func:`.copy_schedule.schedule_async_copies`) gives a ``jt.pipelined``
loop whose staged copies are all TMA loads a ring of ``S`` "full" mbarriers, in which every
thread both issues (thread 0) and computes, so a block barrier at the top of each iteration
frees the stage refilled next. This pass splits the block instead, as Hopper GEMMs and
FlashAttention-3 do: the kernel's ``threads`` (``C``, whole warpgroups) become the
*consumers*, and the block grows by one *producer* warpgroup (threads ``C .. C + 127``) whose
elected thread ``C`` runs the ring's schedule alone::

    before the split (all C + 128 threads)
        thread 0: full[s] expects 1 arrival, empty[s] expects C / 32 (s < S); block barrier
    producer warpgroup: setmaxnreg.dec P; thread C only:
        prologue   for t in 0 .. S-2:  if t < n: arrive_expect_tx(full[t], bytes); TMA tile t
        for k:     t = k + S - 1; if t < n:
                     wait empty[t % S], parity ((t / S) & 1) ^ 1   its last user released it
                     arrive_expect_tx(full[t % S], bytes); TMA loads of tile t
        then the producer exits
    consumer warpgroups: setmaxnreg.inc Q; the kernel's body as written, where the ring loop is
        for k:     wait full[k % S], parity (k / S) & 1              tile k has landed
                   compute on stage k % S
                   each consumer warp: sync_warp; lane 0 arrives on empty[k % S]

*One arrival per consumer warp* (``empty`` counts ``C / 32``): ``sync_warp`` orders the
warp's reads of the stage (wgmma's are complete: the gemm lowering ends with
``wgmma_wait_group<0>``) before its lane 0's arrival, whose release the producer's wait
acquires before TMA refills the stage. Tile ``t`` uses stage ``t % S`` for the
``(t / S)``-th time; its empty wait is for the release of use ``t / S - 1``, parity
``((t / S) & 1) ^ 1``, which a fresh barrier reports complete for ``t < S`` (the phase
"before" its first), so the first ``S`` tiles do not wait.

The consumers' block barriers become *named* barriers over the consumers only
(``bar.sync 1, C``: the producer has left); the ring loop's top barrier goes, since the empty
barriers now free the stages, unless its compute touches shared memory other than the
stages' (then it stays, named, for whatever else it orders).

**Registers.** ``setmaxnreg`` moves registers between the warpgroups of a block through a
pool of its CTA (PTX ISA: ``dec`` releases into it, ``inc`` waits until it can take from
it), so the block never holds more than it launched with. ``JT_LAUNCH_BOUNDS(C + 128, 1)``
lets ptxas give every thread ``R0 = min(256, 65536 / (C + 128))`` rounded down to 8 (the 64K
32-bit registers of an SM for one block); the pool is ``(C + 128) R0``. The producer keeps
``P = 40`` (a loop issuing TMA needs few) and the consumers get the rest,
``Q = min(256, ((C + 128) R0 - 128 P) / C)`` rounded down to 8. Two consumer warpgroups:
``R0 = 65536 / 384 = 170 -> 168``, a pool of ``384 * 168 = 64512``,
``Q = (64512 - 5120) / 256 = 232``, and ``128 * 40 + 256 * 232 = 64512``; one:
``R0 = 256``, ``Q = min(256, (65536 - 5120) / 128) = 256``. :func:`check_budget` (the pass's
rule, and code generation's) checks ``P <= R0 <= Q``, counts that are multiples of 8 in
``[24, 256]`` (the PTX ISA's range for ``setmaxnreg``) and ``128 P + C Q`` within the pool.

**The IR.** The pass writes its decisions as ops and notes: a ``warp_specialise`` op first in
the body (``consumers``, ``producers``, ``consumer_regs``, ``producer_regs``, ``barrier``: the
consumers' named barrier id), which code generation prints as the ring's initialisation and
the producer's branch; note ``role = "producer"`` on the ring's ``tma_issue`` ops and on the
ops before the loop whose scalars the producer recomputes (what its copies' origins and the
loop's bounds need); a ``tma_release`` op ending the ring loop's body (the consumers'
arrivals on ``empty``); note ``named = (id, C)`` on every remaining ``barrier``. The
ring's set-up that the pipelining pass wrote before its prologue (:mod:`.ring_setup`: two
block barriers around ``mbarrier_init``) goes, since the split initialises both rings itself.

**When.** On a target with ``setmaxnreg`` and TMA, for the one ``jt.pipelined`` loop of a
kernel that the pipelining pass made a TMA ring, standing at the top level of the body; with
``threads`` whole warpgroups and room for 128 more in a block; no op whose lowering
synchronises the block inside it (scratch, ``store_release``, ``fence``); the stages' bytes
shared with no other buffer (the producer fills them while the consumers run the code before
the loop); and every value the producer needs computable from block indices, constants and
scalar arithmetic before the loop, or from scalar loads of a kernel input (which nothing in
the kernel writes: attention's key count ``lengths[b]`` bounds its ring). The loop's
``warp_specialize`` flag (``jt.pipelined(..., warp_specialize=...)``) overrides the
inference: False keeps the plain ring, True asks for the split of a TMA ring and is an error
naming the reason when one of the conditions fails (a loop whose copies TMA cannot make,
known only from the call's shapes, stays on ``cp.async`` under every flag); None (the
default) splits where the conditions hold.
Every other loop is left unchanged, and so is every kernel on a target without
``setmaxnreg`` and TMA (the flag is ignored there, so that one kernel serves every GPU).

Inferred (None) only for two or more consumer warpgroups, the shape Hopper GEMMs and
FlashAttention-3 split (two consumer warpgroups and a producer, 384 threads): with one, the
split doubles the block to 256 threads that ``JT_LAUNCH_BOUNDS(256, 1)`` gives 255 registers
each, one block per SM, where the unsplit 128-thread ring (``jt.ops.matmul``'s 64x64 tiles)
keeps three; whether the producer pays for that is a measurement on an H100/H200 no session
has had yet, so a one-warpgroup kernel splits only when it asks (``warp_specialize=True``).

Assumes: the pipelining, scratch, shared-memory planning and barrier passes ran (the ring's
schedule, the placed bytes and the barriers are final). Guarantees: a kernel with a
``warp_specialise`` op has exactly one ring loop, its issues carry ``role = "producer"``, its
body ends with ``tma_release``, no ``mbarrier_init`` is left, every ``barrier`` op carries
``named``, and the register
budget satisfies :func:`check_budget`.
"""

from __future__ import annotations

import dataclasses

from .. import ir, op_defs
from ..errors import KernelError, kernel_error
from ..target import GpuCaps
from .barriers import PROXY_FENCE
from .copy_schedule import ISSUE_KINDS, ISSUED, PUBLISH, is_ring, issued_copies
from .ring_setup import INIT as RING_INIT
from .ring_setup import READY as RING_READY
from .ring_setup import REUSE as RING_REUSE
from .smem_plan import recorded_bytes

WARPGROUP = 128
PRODUCERS = WARPGROUP
"""Threads the pass adds: one producer warpgroup."""
PRODUCER_REGS = 40
REGISTER_FILE = 65536
"""32-bit registers of an SM (H100, H200)."""
MIN_REGS, MAX_REGS = 24, 256
"""The PTX ISA's range of a ``setmaxnreg`` count (a multiple of 8)."""
INFER_MIN_CONSUMERS = 2 * WARPGROUP
"""Consumer threads from which the split is inferred (``warp_specialize=None``)."""
CONSUMER_BARRIER = 1
"""The consumers' named barrier (0 is the whole block's, ``sync_threads``)."""
ROLE = "role"
NAMED = "named"
KIND = "warp_specialise"
_SCALAR_KINDS = ("const", "elementwise", "convert", "select")
_SYNCING_KINDS = ("store_release", "fence")
"""Ops whose lowering synchronises the whole block inside it (besides scratch ops)."""


def launch_regs(threads: int) -> int:
    """Registers per thread every warpgroup starts with in a block of ``threads`` (one block
    per SM)."""
    return min(MAX_REGS, REGISTER_FILE // threads // 8 * 8)


def plan_registers(consumers: int) -> tuple[int, int]:
    """The ``(producer, consumer)`` registers per thread for ``consumers`` consumer threads
    and one producer warpgroup (module docstring)."""
    pool = (consumers + PRODUCERS) * launch_regs(consumers + PRODUCERS)
    rest = (pool - PRODUCERS * PRODUCER_REGS) // consumers // 8 * 8
    return PRODUCER_REGS, min(MAX_REGS, rest)


def check_budget(consumers: int, producers: int, producer_regs: int,
                 consumer_regs: int) -> str | None:
    """What is wrong with a split's register budget (module docstring), or None."""
    start = launch_regs(consumers + producers)
    for role, regs in (("producer", producer_regs), ("consumer", consumer_regs)):
        if regs % 8 or not MIN_REGS <= regs <= MAX_REGS:
            return (f"the {role} count {regs} is not a multiple of 8 in "
                    f"[{MIN_REGS}, {MAX_REGS}]")
    if producer_regs > start:
        return (f"setmaxnreg.dec to {producer_regs} would raise the producer's {start} "
                "registers per thread")
    if consumer_regs < start:
        return (f"setmaxnreg.inc to {consumer_regs} would lower the consumers' {start} "
                "registers per thread")
    total = producers * producer_regs + consumers * consumer_regs
    pool = (consumers + producers) * start
    if total > pool:
        return (f"{producers} x {producer_regs} + {consumers} x {consumer_regs} = {total} "
                f"registers exceed the block's {consumers + producers} x {start} = {pool}")
    return None


def split_of(kernel: ir.Kernel) -> ir.Op | None:
    """The kernel's ``warp_specialise`` op, or None when the pass did not split it."""
    first = kernel.body[0] if kernel.body else None
    return first if isinstance(first, ir.Op) and first.kind == KIND else None


def ring_loop(kernel: ir.Kernel) -> ir.For:
    """The ring loop of a split kernel (at the top level of its body)."""
    return next(s for s in kernel.body if isinstance(s, ir.For) and is_ring(s))


def _refusal(kernel: ir.Kernel, loop: ir.For, caps: GpuCaps) -> str | None:
    """Why ``loop`` (a top-level ring) cannot be split, or None."""
    c = kernel.threads
    if c % WARPGROUP:
        return f"its {c} threads are not whole warpgroups"
    if c + PRODUCERS > caps.max_threads_per_block:
        return (f"{c} threads and a producer warpgroup exceed "
                f"{caps.max_threads_per_block} threads a block")
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Op) and (s.notes.get("scratch") or s.kind in _SYNCING_KINDS):
            return (f"the {s.kind} at {s.line} synchronises the whole block inside its "
                    "lowering")
    offsets, sizes = recorded_bytes(kernel)
    staged = {c.attrs["dst"].buffer for c in issued_copies(loop)}
    spans = {n: (offsets[n], offsets[n] + sizes[n]) for n in offsets}
    for name in sorted(staged):   # (no scratch: refused above)
        lo, hi = spans[name]
        others = [n for n, (a, b) in spans.items() if n != name and a < hi and lo < b]
        if others:
            return f"the bytes of stage buffer {name} are shared with {others[0]}"
    if _preamble(kernel, loop) is None:
        return ("a value its copies' origins or its bounds need is not computable from "
                "block indices, scalar arithmetic and scalar loads of inputs before the loop")
    return None


def _preamble(kernel: ir.Kernel, loop: ir.For) -> set[int] | None:
    """The ids of the top-level ops before ``loop`` that the producer recomputes (those its
    copies' origins and the loop's bounds need), or None when some needed value is not such
    a scalar."""
    at = next(i for i, s in enumerate(kernel.body) if s is loop)
    before = {s.result.id: s for s in kernel.body[:at]
              if isinstance(s, ir.Op) and s.result is not None}
    inside = {s.result.id for s in ir.walk(loop.body)
              if isinstance(s, ir.Op) and s.result is not None}
    indices = {v.id for v in kernel.block_indices}
    # A scalar read of a kernel input (attention's key count lengths[b], which bounds its
    # ring): nothing in the kernel writes an input, so the producer reads what the
    # consumers read.
    inputs = {b.name for b in kernel.params if getattr(b, "role", None) == "input"}
    issued = [s for s in loop.body if isinstance(s, ir.Op) and s.notes.get(ISSUED)]
    todo = [v for s in issued for v in (*s.operands, *(v for r in ir.regions(s)
                                                        for v in r.values()))]
    todo += [b for b in (loop.start, loop.extent) if isinstance(b, ir.Value)]
    needed: set[int] = set()
    while todo:
        v = todo.pop()
        if v.id in indices or v.id in inside or v.id == loop.var.id or v.id in needed:
            continue
        op = before.get(v.id)
        if op is None or op.result.shape != () or not (
                op.kind in _SCALAR_KINDS or op.kind == "load" and op.attrs["src"].buffer
                in inputs):
            return None
        needed.add(v.id)
        todo += [*op.operands, *(u for r in ir.regions(op) for u in r.values())]
    return {id(before[v]) for v in needed}


def warp_specialise(kernel: ir.Kernel, caps: GpuCaps) -> ir.Kernel:
    """The pass (module docstring): split ``kernel`` into a producer warpgroup and its
    consumers where its TMA ring allows, else return it unchanged."""
    rings = [s for s in ir.walk(kernel.body) if isinstance(s, ir.For) and is_ring(s)]
    asked = [s for s in ir.walk(kernel.body) if isinstance(s, ir.For)
             and s.kind == "pipelined" and s.warp_specialize]
    if (not (caps.setmaxnreg and caps.tma) or any(s.warp_specialize is False for s in rings)
            or not rings and not asked):
        return kernel
    if not rings:
        return kernel   # (a loop asked for whose copies TMA cannot make stays on cp.async)
    if not asked and kernel.threads < INFER_MIN_CONSUMERS:
        return kernel   # (one consumer warpgroup: split only when asked, module docstring)
    if len(rings) != 1 or (asked and asked != rings):
        why = "it is not the kernel's one pipelined loop whose staged copies are TMA loads"
    elif not any(s is rings[0] for s in kernel.body):
        why = "it stands inside another statement, not at the top of the kernel"
    else:
        why = _refusal(kernel, rings[0], caps)
    if why is not None:
        if asked:
            raise kernel_error(kernel.name, f"jt.pipelined(..., warp_specialize=True): cannot "
                               f"warp-specialise this loop: {why}", asked[0].line)
        return kernel
    return _split(kernel, rings[0])


def _split(kernel: ir.Kernel, loop: ir.For) -> ir.Kernel:
    c = kernel.threads
    preamble = _preamble(kernel, loop) or set()
    staged = {op.attrs["dst"].buffer for op in issued_copies(loop)}
    named = {NAMED: (CONSUMER_BARRIER, c)}
    at = next(i for i, s in enumerate(kernel.body) if s is loop)
    shared = {b.name for b in kernel.buffers if b.scope == "shared"}
    written_before = any(r.buffer in shared for s in ir.walk(kernel.body[:at])
                         if isinstance(s, ir.Op) for r in op_defs.writes(s))

    def other_shared(stmts: tuple[ir.Stmt, ...]) -> bool:
        bufs = {b.name: b for b in kernel.buffers}
        return any(bufs[r.buffer].scope == "shared" and r.buffer not in staged
                   for s in ir.walk(stmts) if isinstance(s, ir.Op) and not s.notes.get(ISSUED)
                   for r in ir.regions(s))

    def setup(s: ir.Stmt) -> bool:
        """Whether ``s`` is of the ring's set-up (:mod:`.ring_setup`), which the split's
        own initialisation of its full and empty barriers replaces; not its proxy-fence
        barrier where shared memory is written before the loop (attention's ``Q`` tile,
        which the loop's wgmmas read): that one stays, over the consumers, for the fence."""
        return isinstance(s, ir.Op) and (s.kind == RING_INIT or s.kind == "barrier" and (
            s.notes.get("reason") in (RING_REUSE, RING_READY))
            and not (s.notes.get(PROXY_FENCE) and written_before))

    def op(s: ir.Op) -> ir.Op:
        if s.kind in ISSUE_KINDS or id(s) in preamble:
            return s.with_notes(**{ROLE: "producer"})
        if s.kind == "barrier":
            return s.with_notes(**named)
        return s

    def block(stmts: tuple[ir.Stmt, ...]) -> tuple[ir.Stmt, ...]:
        out: list[ir.Stmt] = []
        for s in stmts:
            if stmts is kernel.body and setup(s):
                continue
            if isinstance(s, ir.Op):
                out.append(op(s))
            elif s is loop:
                keep = other_shared(s.body)
                body = [t for t in block(s.body) if keep or not (
                    isinstance(t, ir.Op) and t.kind == "barrier"
                    and t.notes.get("reason") == PUBLISH)]
                body.append(ir.Op("tma_release", (), None, {}, s.line,
                                  {ROLE: "consumer"}))
                out.append(dataclasses.replace(s, body=tuple(body)))
            else:
                out.append(ir.with_blocks(s, [block(b) for b in ir.blocks(s)]))
        return tuple(out)

    producer_regs, consumer_regs = plan_registers(c)
    head = ir.Op(KIND, (), None, {
        "consumers": c, "producers": PRODUCERS, "consumer_regs": consumer_regs,
        "producer_regs": producer_regs, "barrier": CONSUMER_BARRIER}, loop.line)
    out = dataclasses.replace(kernel, body=(head, *block(kernel.body)))
    return check_split(out)


def check_split(kernel: ir.Kernel) -> ir.Kernel:
    """The pass's rules (its Guarantees) on ``kernel``, returned unchanged; a KernelError
    names the first one broken."""
    head = split_of(kernel)
    if head is None:
        if any(isinstance(s, ir.Op) and s.kind in (KIND, "tma_release")
               for s in ir.walk(kernel.body)):
            raise KernelError(f"kernel {kernel.name}: warp_specialise must be the first op "
                              "of the body, and tma_release needs it")
        return kernel
    a = head.attrs
    bad = check_budget(a["consumers"], a["producers"], a["producer_regs"], a["consumer_regs"])
    if bad is None and (a["consumers"] != kernel.threads or a["producers"] != PRODUCERS):
        bad = (f"the split has {a['consumers']} consumers and {a['producers']} producers "
               f"for a kernel of {kernel.threads} threads")
    rings = [s for s in ir.walk(kernel.body) if isinstance(s, ir.For) and is_ring(s)]
    if bad is None and (len(rings) != 1 or not any(s is rings[0] for s in kernel.body)):
        bad = "a split kernel has exactly one TMA ring, at the top of its body"
    if bad is None:
        loop = rings[0]
        last = loop.body[-1]
        if not (isinstance(last, ir.Op) and last.kind == "tma_release"):
            bad = "the ring loop's body must end with the consumers' tma_release"
        for s in ir.walk(kernel.body):
            if bad is None and isinstance(s, ir.Op):
                if s.kind in ISSUE_KINDS and s.notes.get(ROLE) != "producer":
                    bad = f"the {s.kind} at {s.line} is not the producer's"
                elif s.kind == "barrier" and tuple(s.notes.get(NAMED, ())) != (
                        a["barrier"], a["consumers"]):
                    bad = (f"the barrier at {s.line} is not the consumers' named barrier "
                           f"{a['barrier']} over {a['consumers']} threads")
                elif s.kind == KIND and s is not head:
                    bad = "a kernel splits once"
                elif s.kind == RING_INIT:
                    bad = (f"the {RING_INIT} at {s.line} is left: the split initialises its "
                           "ring itself")
    if bad is not None:
        raise KernelError(f"kernel {kernel.name}: warp specialisation: {bad}")
    return kernel
