"""Copies that the blocks of one call share, made once, for the CPU.

A matmul written the plain way copies, in every block, a panel of B into an on-chip buffer
(whole K deep once :mod:`..passes.gemm_panels` has coarsened the K loop): with 64 x 64 tiles
of a 1024^3 product, each panel of B is copied 16 times, once per block row, where a BLAS
packs B once, and those copies took 10-17% of the kernel's time. The blocks of one call run
one after another on one thread, and an on-chip buffer of the CPU is just memory that keeps
its contents from one block to the next, so a copy whose source starts are the same as in
the last block that made it would copy the same elements again: it can be skipped. Making
that the common case takes a block order in which the starts change rarely: the grid's
fastest axis is made one that the starts do not depend on (blocks are independent, so their
order is the runtime's to choose).

:func:`plan` finds such copies and the axis; the lowering (``Lowering.run``) decodes the
block index with that axis fastest and emits each copy under ``if`` its starts differ from
the ones it last copied from (:class:`Shared`).

A gemm that re-lays a shared operand out first (the bfloat16 gemms pair its K values,
:mod:`.gemm_bf16`, :mod:`.gemm_amx`) would redo that re-layout just as needlessly: for the
1024^3 bfloat16 matmul on AMX, re-laying B's panel took 2.9 of a block's 15 µs.
:meth:`Shared.relayout` gives such a gemm a :class:`Relayout`: arrays that keep the
re-laid operand from one block to the next and a flag that the shared copy raises when it
copies again.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Iterator, Sequence

import numpy as np
from tvm import tirx

from .. import ir, op_defs
from .context import Lowering
from .copies import lower_copy
from .tir_emit import KernelBuilder


@dataclasses.dataclass(frozen=True)
class Reuse:
    """Skip ``copies`` (ids of top-level copy ops) when their starts repeat, with grid axis
    ``fastest`` varying fastest."""

    copies: frozenset[int]
    fastest: int


def plan(kernel: ir.Kernel, forwarded: Collection[str]) -> Reuse | None:
    """The shared copies of ``kernel`` and the block order for them, or ``None``.
    ``forwarded``: the buffers whose copies the lowering leaves out (the gemm operands of
    :func:`.forwarding.gemm_operands`).

    A copy qualifies when it is a statement of the kernel body itself (not in a loop or
    conditional), reads a region of a global input (which no op writes) at scalar starts,
    and fills a scratch buffer that no other op writes and only gemms read (so no forwarding
    ever leaves it unfilled, and nothing changes it between blocks). The grid must be static
    and have an axis of more than one block whose index none of the copies' starts depend
    on, through the body's scalar ops. ``fastest`` is the axis of more than one block that
    the most copying does not depend on (by :func:`_cost`; the first such axis on a tie),
    and ``copies`` the qualifying copies that do not depend on it. Guarantees: a skipped
    copy would have written the buffer with what it already holds.
    """
    if not kernel.grid or not all(isinstance(n, int) for n in kernel.grid):
        return None
    buffers = {b.name: b for b in kernel.buffers}
    writers: dict[str, int] = {}
    readers: dict[str, set[str]] = {}
    for stmt in ir.walk(kernel.body):
        if not isinstance(stmt, ir.Op):
            continue
        for r in op_defs.writes(stmt):
            writers[r.buffer] = writers.get(r.buffer, 0) + 1
        for r in op_defs.reads(stmt):
            readers.setdefault(r.buffer, set()).add(stmt.kind)
    defs = {s.result.id: s for s in kernel.body if isinstance(s, ir.Op) and s.result is not None}
    axes = {v.id: a for a, v in enumerate(kernel.block_indices)}
    candidates = []   # (copy, the axes its starts depend on, its cost)
    for stmt in kernel.body:
        if not isinstance(stmt, ir.Op) or stmt.kind != "copy":
            continue
        src, dst = stmt.attrs["src"], stmt.attrs["dst"]
        if dst.buffer in forwarded or buffers[src.buffer].role != "input" \
                or writers.get(src.buffer) or buffers[dst.buffer].role != "scratch" \
                or writers.get(dst.buffer) != 1 \
                or readers.get(dst.buffer, set()) - {"gemm", "copy"} \
                or any(isinstance(i.start, ir.Value) and i.start.shape != ()
                       for i in (*src.index, *dst.index)):
            continue
        deps: set[int] = set()
        for v in src.values():
            deps |= _axes_of(v, defs, axes)
        candidates.append((stmt, deps, _cost(src, buffers[src.buffer])))
    best, saved = None, 0
    for axis, n in enumerate(kernel.grid):
        gain = sum(cost for _, deps, cost in candidates if axis not in deps)
        if n > 1 and gain > saved:
            best, saved = axis, gain
    if best is None:
        return None   # every copy's starts change from each block to the next
    return Reuse(frozenset(id(c) for c, deps, _ in candidates if best not in deps), best)


def _cost(src: ir.Region, buf: ir.Buffer) -> int:
    """What a copy costs, roughly: its bytes, and 256 more for each contiguous run (each
    starts a TLB lookup and a prefetch stream). In the profile of the plain 1024^3 matmul the
    copies of B's panels (rows of 256 bytes) took 10-17% of the time, A's (rows of 1 KiB)
    under 2%, for as many bytes."""
    shape = src.shape
    runs = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    return int(np.prod(shape)) * buf.dtype.itemsize + 256 * runs


def _axes_of(v: ir.Value, defs: dict[int, ir.Op], axes: dict[int, int]) -> set[int]:
    """The grid axes whose block index scalar ``v`` is computed from."""
    if v.id in axes:
        return {axes[v.id]}
    op = defs.get(v.id)
    if op is None:
        return set()
    out: set[int] = set()
    for o in op.operands:
        out |= _axes_of(o, defs, axes)
    return out


class Relayout:
    """A gemm operand's re-laid copy kept from one block to the next: valid while the
    shared copy that fills the operand has not copied again.

    ``stale`` is a one-element int32 flag, raised before the block loop and by every copy
    into the operand, lowered by the gemm once it has re-laid the operand
    (:meth:`when_stale`). The arrays (:meth:`array`) are the gemm's, one per tag: a gemm
    lowered twice (a statement has a forwarded and a plain form, ``Lowering.body``) gets the
    same arrays and flag both times, so both forms must re-lay the operand alike."""

    def __init__(self, stale: tirx.Buffer) -> None:
        self.stale = stale
        self._arrays: dict[str, tirx.Buffer] = {}

    def array(self, kb: KernelBuilder, name: Callable[[str], str], tag: str,
              shape: Sequence[int], dtype: str) -> tirx.Buffer:
        """The local array ``tag`` of this operand's re-layout, made with ``kb`` on the first
        call (``name`` makes fresh names)."""
        buf = self._arrays.get(tag)
        if buf is None:
            buf = self._arrays[tag] = kb.alloc_local(name(tag), shape, dtype)
        elif [int(d) for d in buf.shape] != list(shape) or str(buf.dtype) != dtype:
            raise AssertionError(f"the re-layout {tag!r} of one operand was asked for as "
                                 f"{list(shape)} {dtype} and as {buf.shape} {buf.dtype}")
        return buf

    @contextlib.contextmanager
    def when_stale(self, kb: KernelBuilder) -> Iterator[None]:
        """A body (the re-layout) that runs only while the flag is raised, and lowers it."""
        with kb.if_(self.stale[0] != tirx.const(0, "int32")):
            yield
            kb.store(self.stale, [0], tirx.const(0, "int32"))


def relaid_array(kb: KernelBuilder, name: Callable[[str], str], relayout: Relayout | None,
                 tag: str, shape: Sequence[int], dtype: str) -> tirx.Buffer:
    """The array ``tag`` of ``relayout`` (kept between blocks), or without one a new local
    array."""
    if relayout is None:
        return kb.alloc_local(name(tag), shape, dtype)
    return relayout.array(kb, name, tag, shape, dtype)


def relaying(kb: KernelBuilder, relayout: Relayout | None) -> contextlib.AbstractContextManager:
    """The body that re-lays an operand: under :meth:`Relayout.when_stale`, or without a
    ``relayout`` unconditional."""
    return contextlib.nullcontext() if relayout is None else relayout.when_stale(kb)


class Shared:
    """The lowering's side of the shared copies of :func:`plan`: what each copied last, and
    the re-layouts of the gemm operands they fill."""

    def __init__(self, low: Lowering, kernel: ir.Kernel, reuse: Reuse) -> None:
        """Emit, before the block loop, for each shared copy the array of the starts it last
        copied from and a flag that it has copied at all in this call, and for each gemm
        operand a shared copy fills, the raised flag of its :class:`Relayout`."""
        self._last: dict[int, tuple[list[ir.Value], tirx.Buffer, tirx.Buffer]] = {}
        filled: set[str] = set()
        for stmt in kernel.body:
            if id(stmt) in reuse.copies:
                keys = stmt.attrs["src"].values()
                last = low.kb.alloc_local(low.name("last"), (max(len(keys), 1),), "int32")
                done = low.kb.alloc_local(low.name("copied"), (1,), "int32")
                low.kb.store(done, [0], tirx.const(0, "int32"))
                self._last[id(stmt)] = (keys, last, done)
                filled.add(stmt.attrs["dst"].buffer)
        self._relayouts: dict[tuple[int, str], tuple[str, Relayout]] = {}
        for stmt in ir.walk(kernel.body):
            if not (isinstance(stmt, ir.Op) and stmt.kind == "gemm"):
                continue
            for role in ("a", "b"):
                name = stmt.attrs[role].buffer
                if name in filled:
                    stale = low.kb.alloc_local(low.name("stale"), (1,), "int32")
                    low.kb.store(stale, [0], tirx.const(1, "int32"))
                    self._relayouts[(id(stmt), role)] = (name, Relayout(stale))

    def relayout(self, op: ir.Op, role: str) -> Relayout | None:
        """The :class:`Relayout` of operand ``role`` (``"a"`` or ``"b"``) of gemm ``op``, or
        None where no shared copy fills it (re-lay it in every block). The gemm must read
        the whole buffer, as filled."""
        found = self._relayouts.get((id(op), role))
        return None if found is None else found[1]

    def copy(self, low: Lowering, op: ir.Op) -> None:
        """Emit copy ``op``: as is, or for a shared copy under ``if`` its starts changed."""
        if id(op) not in self._last:
            lower_copy(low, op)
            return
        keys, last, done = self._last[id(op)]
        changed = done[0] == tirx.const(0, "int32")
        for n, v in enumerate(keys):
            changed = tirx.Or(changed, last[n] != low.scalars[v.id])
        with low.kb.if_(changed):
            lower_copy(low, op)
            for n, v in enumerate(keys):
                low.kb.store(last, [n], low.scalars[v.id])
            low.kb.store(done, [0], tirx.const(1, "int32"))
            for name, relayout in self._relayouts.values():
                if name == op.attrs["dst"].buffer:
                    low.kb.store(relayout.stale, [0], tirx.const(1, "int32"))
