"""Barrier insertion (GPU): a ``barrier`` wherever memory written by some threads of a block is
read or overwritten by others, and nowhere else.

Shared buffers are the usual case; global buffers count too (a block that reads back what it
wrote to an output, e.g. ``out[...] += x`` in a loop, where the element's reader may be
another thread than its writer). Each op's accesses to those buffers are described by the
threads that touch each element, from the layouts the lowering uses (a fragment's layout for
fragment <-> memory copies and for loads and stores of tile values; the coalesced copy
layout otherwise; any thread for a GEMM's operands).

Walking the body in program order, the pass keeps the accesses made since the last barrier;
an access that overlaps one of them, with one of the two a write, needs a barrier first
unless both are provably made by the same single thread for every element (same region, same
owner per element, no replicas). Loops are walked until the accesses carried from the end of
one iteration into the next no longer add a barrier (read-after-write and write-after-read
across iterations); after a loop or a conditional, the accesses of every path are pending.
A ``While`` is walked like a loop whose iteration is its condition then its body. Conditions
and loop bounds in the Tile IR are uniform across the block, so a barrier inside them is
reached by all threads -- except a ``While`` condition that reads global memory the kernel
writes, whose lowering refuses a barrier inside (``gpu/codegen/control.py``).

Shared memory is one array of bytes: buffers that the shared-memory plan gives the same
bytes (the ``offset`` attributes the ``smem_plan`` pass wrote) conflict wherever both are
accessed, as one buffer does: the last reads of one and the first writes of the next are a
write-after-read hazard (and the other way round) although they name different buffers.

So does an op's scratch (the ``scratch`` note, with the byte offset ``smem_plan`` gave each
request: :func:`.smem_plan.scratch_bytes`): its lowering writes the scratch bytes (by any
thread), synchronises the block, and reads them (by any thread). Before the op, its scratch
writes meet what is pending like any write: a barrier where they reuse bytes an earlier
buffer or scratch used since the last barrier; that includes the same op's reads in the
previous iteration of a loop. After the op, its internal barrier has ordered everything
before it: what is pending is the op's own accesses and its scratch reads, which the next
user of those bytes must wait for. That is the contract of :mod:`.codegen.scratch`: an op
carrying scratch synchronises the block between its scratch writes and reads, and code
generation adds no other barrier for scratch.

A loop that runs as a ``cp.async`` pipeline is walked as the schedule the pipelining pass
wrote into the IR runs it: the prologue's ``async_issue`` ops issue the staged copies before
the loop (their writes meet what is pending before the loop: a barrier goes before the
prologue when they conflict, checked once for the whole prologue, whose issues fill distinct
stages), and each iteration's ``async_issue``, after the schedule's own ``barrier``, fills a
stage no thread reads in that iteration, so it and the staged copies it runs (``issued``)
make no access inside the loop. Barriers the compute still needs (e.g. between a fragment staged
through shared memory and its readers) are ordinary barrier ops of the body.

The async proxy (sm_90a's wgmma gemms, the ``wgmma.`` plans of :mod:`.gemm_plan`; TMA stores,
:mod:`.tma_store`, whose source it reads) reads its shared operands through another proxy
than the ordinary stores and ``cp.async`` copies that wrote them: those writes become visible
to it only through ``fence.proxy.async`` by the writing threads, then a barrier before the
(other) threads' wgmma or store. So the pass also keeps the
generic writes to shared memory made since the last fence -- a barrier only clears them when
it carries the ``proxy_fence`` note; a pipeline's staged copies write at its ``async_wait``,
where their data lands -- and before an async read of bytes one of them wrote
(by any thread, the same one included) it places a barrier with ``proxy_fence``: the barrier
the hazard needs anyway, else the last barrier before the op when no shared access stands
between them (a pipeline's barrier after its wait), else a new one.

Assumes: layout inference, the pipelining pass, and (for reuse of bytes) the scratch and
shared-memory planning passes ran. Guarantees: every cross-thread hazard on a shared buffer
or on bytes a buffer and scratch or two scratch arrays share has a ``barrier`` op (or, for
bytes of an op's scratch, the op's own internal barrier) between its two accesses; every
async-proxy read of shared bytes a generic write touched has a ``barrier`` with
``proxy_fence`` between the two on every path (:func:`.verify.verify_proxy_fences`).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .. import ir, op_defs
from . import tma
from .copy_mapping import copy_layout
from .copy_schedule import ISSUE_KINDS, ISSUED, SCHEDULE_KINDS, issued_copies
from .layout import Layout, blocked
from .layout_inference import uniform_values
from .smem_plan import recorded_bytes, scratch_bytes

_SCOPES = ("shared", "global")

PROXY_FENCE = "proxy_fence"
"""The note of a barrier preceded by ``fence.proxy.async`` (see the module docstring)."""


def async_proxy_reads(op: ir.Op, bufs: dict[str, ir.Buffer]) -> list[ir.Region]:
    """The shared regions ``op`` reads through the async proxy: a wgmma gemm's shared
    operands (a register A is not one), a TMA store's source (:mod:`.tma_store`)."""
    if op.kind == "tma_store":
        return [op.attrs["src"]]
    if op.kind != "gemm" or not str(op.notes.get("instr", "")).startswith("wgmma."):
        return []
    return [op.attrs[r] for r in ("a", "b") if bufs[op.attrs[r].buffer].scope == "shared"]


@dataclasses.dataclass(frozen=True, eq=False)
class _Access:
    buffer: str
    """The buffer's name; for scratch, the op kind and the request's role."""
    write: bool
    region: ir.Region | None
    """None: the whole of a scratch request."""
    owners: np.ndarray | None
    """Per element of the region's tile, the threads touching it; None: any thread."""
    span: tuple[int, int] | None = None
    """First and end byte in the block's shared memory (buffers the plan placed, scratch)."""
    proxy: str = "generic"
    """``async`` for an async-proxy read; ``unfenced`` for the mark a generic write to shared
    memory leaves until a ``proxy_fence`` barrier (it takes part in no ordinary hazard)."""


@functools.lru_cache(maxsize=256)
def _owners(lay: Layout, primary_only: bool) -> np.ndarray:
    thread, _ = lay.owners()
    return thread[..., :1] if primary_only else thread


class _Walker:
    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        offsets, sizes = recorded_bytes(kernel)
        self.spans = {n: (at, at + sizes[n]) for n, at in offsets.items()}
        self.bufs = {b.name: b for b in kernel.buffers}
        self.uniform = uniform_values(kernel)
        self.layouts = {s.result.id: s.notes["layout"] for s in ir.walk(kernel.body)
                        if isinstance(s, ir.Op) and s.result is not None
                        and "layout" in s.notes}
        self._accesses: dict[int, list[_Access]] = {}
        self._scratch: dict[int, tuple[list[_Access], list[_Access]]] = {}
        self._issues: dict[int, list[_Access]] = {}
        self.waits = {id(w): loop for loop in ir.walk(kernel.body) if isinstance(loop, ir.For)
                      for w in loop.body if isinstance(w, ir.Op) and w.kind == "async_wait"}
        """A scheduled loop's waits, by id, with their loop."""
        self.async_reads = any(async_proxy_reads(s, self.bufs) for s in ir.walk(kernel.body)
                               if isinstance(s, ir.Op))

    def accesses(self, op: ir.Op) -> list[_Access]:
        """The op's shared-memory accesses (the same objects on every visit, so that the
        loop walk can tell when the carried set stops growing)."""
        if id(op) not in self._accesses:
            self._accesses[id(op)] = self._make_accesses(op)
        return self._accesses[id(op)]

    def _make_accesses(self, op: ir.Op) -> list[_Access]:
        """One access per region the op's definition says it reads or writes; a region it
        reads and writes (an atomic's, a GEMM's accumulator) is read by the threads that
        write it."""
        d = op_defs.get(op.kind)
        out = []
        asynchronous = {id(r) for r in async_proxy_reads(op, self.bufs)}
        for attr, region in op.attrs.items():
            if not isinstance(region, ir.Region) or self.bufs[region.buffer].scope not in _SCOPES:
                continue
            write = attr in d.writes
            span = self.spans.get(region.buffer)
            out.append(_Access(region.buffer, write, region, self._owners(op, attr, write),
                               span, "async" if id(region) in asynchronous else "generic"))
            if write and attr in d.reads:
                out.append(_Access(region.buffer, False, region, out[-1].owners, span))
        # A TMA copy writes through the async proxy itself: wgmma may read it with no fence.
        if self.async_reads and tma.BOX not in op.notes:
            out += [dataclasses.replace(a, owners=None, proxy="unfenced") for a in out
                    if a.write and self.bufs[a.buffer].scope == "shared"]
        return out

    def scratch(self, op: ir.Op) -> tuple[list[_Access], list[_Access]]:
        """The writes and the reads of the op's placed scratch, by any thread (the same
        objects on every visit)."""
        if id(op) not in self._scratch:
            spans = scratch_bytes(op)
            writes, reads = ([_Access(f"{op.kind} {role}", write, None, None, (lo, hi))
                              for role, lo, hi in spans] for write in (True, False))
            self._scratch[id(op)] = (writes, reads)
        return self._scratch[id(op)]

    def _owners(self, op: ir.Op, attr: str, write: bool) -> np.ndarray | None:
        threads = self.kernel.threads
        if op.kind == "copy":
            other = op.attrs["dst" if attr == "src" else "src"]
            ob = self.bufs[other.buffer]
            if ob.scope == "fragment":
                return _owners(ob.layout, write)
            if ob.scope == "local":
                return None
            return _owners(copy_layout(op, threads), write)
        if op.kind in ("load", "store", "atomic"):
            v = op.result if op.kind == "load" else op.operands[0]
            if v.shape == ():
                return None
            lay = self.layouts.get(v.id) if v.id not in self.uniform else None
            return _owners(lay or blocked(v.shape, threads), write)
        return None

    def _conflict(self, a: _Access, b: _Access) -> bool:
        if not (a.write or b.write) or "unfenced" in (a.proxy, b.proxy):
            return False
        if a.buffer != b.buffer or a.region is None or b.region is None:
            return (a.span is not None and b.span is not None
                    and a.span[0] < b.span[1] and b.span[0] < a.span[1])
        if _disjoint(a.region, b.region):
            return False
        same_thread = (a.region == b.region and a.owners is not None and b.owners is not None
                       and a.owners.shape == b.owners.shape and a.owners.shape[-1] == 1
                       and np.array_equal(a.owners, b.owners))
        return not same_thread

    def _while(self, stmt: ir.While, pending: list[_Access]) -> tuple[ir.While, list[_Access]]:
        """The loop with its barriers, and the accesses pending after it. An iteration is
        the condition then the body; the loop leaves after a condition, so what is pending
        then is what follows the last condition."""
        entry = pending
        for _ in range(4):
            new_cond, after = self.body(stmt.cond, entry)
            new_body, end = self.body(stmt.body, after)
            carried = _union(pending, end)
            if len(carried) == len(entry):
                break
            entry = carried
        return dataclasses.replace(stmt, cond=tuple(new_cond), body=tuple(new_body)), after

    def _op_accesses(self, op: ir.Op, rest: tuple[ir.Stmt, ...]) -> list[_Access]:
        """The accesses ``op`` makes where it stands (``rest``: the statements after it).
        A prologue's ``async_issue`` (or ``tma_issue``) makes its loop's staged copies; the
        schedule inside a loop and the staged copies themselves make none there: they fill a
        stage no thread reads in that iteration, published by the schedule's own barrier."""
        if op.kind in ISSUE_KINDS and op.attrs["prologue"]:
            loop = next(s for s in rest if isinstance(s, ir.For))
            return self._issued(loop)
        if op.kind == "async_wait" and id(op) in self.waits:
            # the stages' cp.async writes land here: their marks, for the proxy fence
            return [a for c in issued_copies(self.waits[id(op)]) for a in self.accesses(c)
                    if a.proxy == "unfenced"]
        if op.kind in SCHEDULE_KINDS or (op.kind == "copy" and op.notes.get(ISSUED)):
            return []
        return self.accesses(op)

    def _barrier(self, pending: list[_Access], accs: list[_Access], line: str | None
                 ) -> ir.Op | None:
        """The barrier ``accs`` need after ``pending``, or None."""
        hits = [(p, a) for a in accs for p in pending if self._conflict(p, a)]
        if not hits:
            return None
        p, a = next(((p, a) for p, a in hits if p.buffer != a.buffer), hits[0])
        kind = ("write" if a.write else "read") + " after " + ("write" if p.write else "read")
        reason = f"{kind} of {a.buffer}"
        if p.buffer != a.buffer:
            reason += f" (shares bytes with {p.buffer})"
        return ir.Op("barrier", (), None, {}, line, {"reason": reason})

    def _unfenced(self, pending: list[_Access], accs: list[_Access]) -> str | None:
        """The buffer an async read in ``accs`` takes from a generic write not yet fenced
        (any thread's), or None."""
        for a in accs:
            if a.proxy != "async":
                continue
            for p in pending:
                if p.proxy != "unfenced":
                    continue
                if (a.buffer == p.buffer and not _disjoint(a.region, p.region)) or (
                        a.span is not None and p.span is not None
                        and a.span[0] < p.span[1] and p.span[0] < a.span[1]):
                    return a.buffer
        return None

    @staticmethod
    def _fence(out: list[ir.Stmt], barrier: ir.Op | None, pending: list[_Access], buffer: str,
               line: str | None) -> ir.Op | None:
        """The barrier that fences the async read of ``buffer``: ``barrier`` (the hazard's)
        with the note; else, with no shared access since the last barrier of ``out`` and only
        ops after it, that one gets the note in place (None returned); else a new one."""
        reason = f"generic writes of {buffer} before its async-proxy read"
        if barrier is not None:
            return barrier.with_notes(**{PROXY_FENCE: True,
                                         "reason": barrier.notes["reason"] + "; " + reason})
        if all(p.proxy == "unfenced" for p in pending):
            last = next((j for j in range(len(out) - 1, -1, -1)
                         if isinstance(out[j], ir.Op) and out[j].kind == "barrier"), None)
            if last is not None and all(isinstance(s, ir.Op) for s in out[last:]):
                old = out[last]
                assert isinstance(old, ir.Op)
                out[last] = old.with_notes(**{PROXY_FENCE: True, "reason":
                                              old.notes.get("reason", "") + "; " + reason})
                return None
        return ir.Op("barrier", (), None, {}, line, {"reason": reason, PROXY_FENCE: True})

    def _issued(self, loop: ir.For) -> list[_Access]:
        """What a scheduled loop's prologue issues: its staged copies' accesses, by any
        thread (the same objects on every visit)."""
        if id(loop) not in self._issues:
            self._issues[id(loop)] = [dataclasses.replace(a, owners=None)
                                      for c in issued_copies(loop) for a in self.accesses(c)]
        return self._issues[id(loop)]

    def body(self, body: tuple[ir.Stmt, ...], pending: list[_Access],
             ) -> tuple[list[ir.Stmt], list[_Access]]:
        out: list[ir.Stmt] = []
        pending = list(pending)
        in_prologue = False     # the issues of one prologue fill distinct stages
        for i, stmt in enumerate(body):
            in_prologue = in_prologue and isinstance(stmt, ir.Op)
            if isinstance(stmt, ir.Op):
                if stmt.kind == "barrier":
                    pending = _after_barrier(pending, stmt)
                    out.append(stmt)
                    continue
                accs = self._op_accesses(stmt, body[i + 1:])
                writes, reads = self.scratch(stmt)
                issue = stmt.kind in ISSUE_KINDS and stmt.attrs["prologue"]
                barrier = None if issue and in_prologue else self._barrier(
                    pending, accs + writes, stmt.line)
                in_prologue = issue or (in_prologue and stmt.kind == "async_commit")
                unfenced = self._unfenced(pending, accs)
                if unfenced is not None:
                    barrier = self._fence(out, barrier, pending, unfenced, stmt.line)
                    if barrier is None:     # an earlier barrier took the fence
                        pending = []
                if barrier is not None:
                    if stmt.kind in ISSUE_KINDS:
                        barrier = barrier.with_notes(reason=barrier.notes["reason"] +
                                                     ", before the pipeline's prologue")
                    out.append(barrier)
                    pending = _after_barrier(pending, barrier)
                if writes:      # the op's own barrier orders what came before it
                    pending = [p for p in pending if p.proxy == "unfenced"] + accs + reads
                elif stmt.kind in ISSUE_KINDS:
                    pending = _union(pending, accs)
                else:
                    pending = pending + accs
                out.append(stmt)
            elif isinstance(stmt, ir.For):
                entry = pending
                once = isinstance(stmt.extent, int) and stmt.extent <= 1
                for _ in range(4):
                    new_body, end = self.body(stmt.body, entry)
                    if once:  # nothing carries into a next iteration
                        break
                    carried = _union(pending, end)
                    if len(carried) == len(entry):
                        break
                    entry = carried
                out.append(dataclasses.replace(stmt, body=tuple(new_body)))
                pending = _union(entry, end)
            elif isinstance(stmt, ir.While):
                loop, after = self._while(stmt, pending)
                hoisted, hoisted_after = self._while(stmt, [])
                if _barriers(hoisted) < _barriers(loop):
                    # A hazard with what precedes the loop: one barrier before it rather
                    # than one per iteration.
                    out.append(ir.Op("barrier", (), None, {}, stmt.line,
                                     {"reason": "before the loop: accesses before it"}))
                    loop, after = hoisted, hoisted_after
                out.append(loop)
                pending = after
            else:
                then, t_end = self.body(stmt.then, pending)
                other, o_end = self.body(stmt.otherwise, pending)
                out.append(dataclasses.replace(stmt, then=tuple(then), otherwise=tuple(other)))
                pending = _union(t_end, o_end)
        return out, pending


def _after_barrier(pending: list[_Access], barrier: ir.Op) -> list[_Access]:
    """What stays pending after ``barrier``: the unfenced generic writes, unless it fences."""
    return [] if barrier.notes.get(PROXY_FENCE) else [p for p in pending
                                                      if p.proxy == "unfenced"]


def _barriers(stmt: ir.Stmt) -> int:
    return sum(isinstance(s, ir.Op) and s.kind == "barrier" for s in ir.walk([stmt]))


def _union(a: list[_Access], b: list[_Access]) -> list[_Access]:
    seen = {id(x) for x in a}
    return a + [x for x in b if id(x) not in seen]


def _disjoint(a: ir.Region, b: ir.Region) -> bool:
    """Whether two regions of one buffer provably share no element (static starts)."""
    for x, y in zip(a.index, b.index):
        if isinstance(x.start, int) and isinstance(y.start, int):
            if x.start + (x.size or 1) <= y.start or y.start + (y.size or 1) <= x.start:
                return True
    return False


def insert_barriers(kernel: ir.Kernel) -> ir.Kernel:
    """Insert the barriers shared-memory hazards need, bytes the plan recorded in the IR
    reused included; see the module docstring."""
    body, _ = _Walker(kernel).body(kernel.body, [])
    return dataclasses.replace(kernel, body=tuple(body))
