"""Copies through on-chip tiles forwarded to global memory, for the CPU.

A kernel written the plain way copies a global tile into a fragment, computes on the
fragment, stores the result back into it and copies it out: four passes over the tile where
two would do. On the CPU a fragment is just memory, so when a fragment is only a staging
area for such a sequence, and the global regions lie inside their buffers (the copies then
neither pad nor drop anything), the sequence can read the global input where it reads the
fragment and store straight into the global output.

:func:`plan` finds such fragments in one statement list; the lowering emits the statements
from the first copy to the last twice, under ``if <every forwarded region is inside its
buffer>``: forwarded (the copies disappear, loads and the store are redirected by
:func:`load` and :func:`store_target`) and, in the ``else`` branch, as written. The scalar
ops of that range are emitted once, before the test, since the regions' starts need them.

The first operand of a gemm is forwarded too (:func:`gemm_operands`), without the test:
when its panel is filled by a float32 copy of a region that every block's starts keep inside
the source (a static proof over the grid), the gemm broadcasts ``A``'s elements from the
source where it would from the panel. The panel of a plain matmul is ``bm`` rows of the
source, so the gemm reads the same addresses in the same order, one block's copy of them
less: 64 x 1024 float32 (256 KiB) in every block of a 1024^3 product with 64 x 64 tiles,
about 15% of its time on a Zen 3. B's panels are not forwarded: their rows are the source's
rows cut to ``bn`` columns, so a register tile's strip of B would stride a whole source row
per ``k`` (and :mod:`.copy_reuse` already copies each of them once per call).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from tvm import tirx
from tvm.ir import Expr

from .. import ir, op_defs
from ..analysis import scalars
from . import elementwise as ew
from .context import Lowering, extent
from .copies import all_of


@dataclasses.dataclass(frozen=True)
class Forward:
    """A fragment whose copies are forwarded: ``src`` is the global region it is filled
    from (``None`` if it is not filled by a copy), ``dst`` the global region it is copied
    to (``None`` if it is not copied out)."""

    fragment: str
    src: ir.Region | None
    dst: ir.Region | None


@dataclasses.dataclass(frozen=True)
class Segment:
    """Statements ``first..last`` (inclusive) of a list, whose fragments in ``forwards``
    are forwarded; ``skip`` holds the positions of the copies that disappear."""

    first: int
    last: int
    forwards: tuple[Forward, ...]
    skip: frozenset[int]


def plan(kernel: ir.Kernel, body: Sequence[ir.Stmt]) -> Segment | None:
    """The forwardable fragments of statement list ``body`` of ``kernel``, or ``None``.

    A fragment (a scratch buffer) is forwardable when every access to it in the kernel is
    an op of ``body`` itself (none nested in loops or conditionals), in this order: an
    optional ``copy`` into the whole fragment from a region of a global input; loads of the
    whole fragment (only after that copy); an optional ``store`` of the whole fragment
    followed, with no other access in between, by a ``copy`` of the whole fragment to a
    region of a global output that nothing else in between touches. Neither region may
    take positions from an index tile (gather, scatter). Between the first and last
    forwarded statement there may be no loops or conditionals, and the scalar ops there
    must not read buffers (they are moved before the test).
    """
    accesses = _accesses(kernel)
    roles = {b.name: b for b in kernel.buffers}
    top = {id(s): pos for pos, s in enumerate(body) if isinstance(s, ir.Op)}
    forwards, positions, skip = [], [], set()
    for b in kernel.buffers:
        if b.role != "scratch" or not accesses.get(b.name):
            continue
        ops = accesses[b.name]
        if not all(id(op) in top for op in ops):
            continue
        found = _forward(b, [(top[id(op)], op) for op in ops], roles, body)
        if found is not None:
            fwd, pos, copies = found
            forwards.append(fwd)
            positions += pos
            skip |= copies
    if not forwards:
        return None
    first, last = min(positions), max(positions)
    used_at: dict[int, list[int]] = {}
    for pos, stmt in enumerate(body):
        for sub in ir.walk([stmt]):
            for v in ir.uses(sub):
                used_at.setdefault(v.id, []).append(pos)
    for stmt in body[first:last + 1]:
        if not isinstance(stmt, ir.Op):
            return None
        res = stmt.result
        if res is not None and res.shape == () and not _hoistable(stmt):
            return None
        # A fused value is expanded where it is used: a use after the segment would read
        # the fragment, which the forwarded branch never filled.
        if res is not None and stmt.notes.get("inline") and any(
                p > last for p in used_at.get(res.id, [])):
            return None
    return Segment(first, last, tuple(forwards), frozenset(skip))


def gemm_operands(kernel: ir.Kernel) -> dict[str, ir.Region]:
    """Scratch buffers whose gemm reads are forwarded to global memory: buffer name -> the
    global region its copy reads.

    A buffer qualifies when its accesses are, all in one statement list, one ``copy`` into
    all of it from a region of a global input that no op writes, of the same dtype, float32,
    and after it only gemms that read all of it as their ``a`` operand (and nothing else of
    theirs); and the region lies inside the source for every value the analysis bounds its
    starts to (:func:`..analysis.scalars.scalar_ranges`: over the grid and loops), so no
    block's copy pads. Guarantees: reading the region where the gemms read the buffer reads
    the same values; the copy can be left out.
    """
    accesses = _accesses(kernel)
    roles = {b.name: b for b in kernel.buffers}
    writers = {r.buffer for s in ir.walk(kernel.body) if isinstance(s, ir.Op)
               for r in op_defs.writes(s)}
    ranges = scalars.scalar_ranges(kernel)
    lists: list[Sequence[ir.Stmt]] = [kernel.body]
    lists += [blk for s in ir.walk(kernel.body) for blk in ir.blocks(s)]
    out: dict[str, ir.Region] = {}
    for stmts in lists:
        where = {id(s): pos for pos, s in enumerate(stmts) if isinstance(s, ir.Op)}
        for b in kernel.buffers:
            ops = accesses.get(b.name, [])
            if b.role != "scratch" or b.dtype != np.float32 or not ops \
                    or not all(id(op) in where for op in ops):
                continue
            first, *readers = sorted(ops, key=lambda op: where[id(op)])
            whole = ir.whole(b.name, b.shape)
            if first.kind != "copy" or first.attrs["dst"] != whole or not readers:
                continue
            src = first.attrs["src"]
            if not _plain_global(src, roles, "input") or src.buffer in writers \
                    or roles[src.buffer].dtype != b.dtype \
                    or not _always_inside(src, roles[src.buffer], ranges):
                continue
            if all(op.kind == "gemm" and op.attrs["a"] == whole
                   and b.name not in (op.attrs["b"].buffer, op.attrs["c"].buffer)
                   for op in readers):
                out[b.name] = src
    return out


def _always_inside(region: ir.Region, buf: ir.Buffer,
                   ranges: dict[ir.Value, scalars.Range]) -> bool:
    """Whether ``region`` lies inside ``buf`` for every start the ranges allow."""
    for i, n in zip(region.index, buf.shape):
        start = (i.start, i.start) if isinstance(i.start, int) else ranges.get(i.start)
        if start is None or not isinstance(n, int) \
                or start[0] < 0 or start[1] + (1 if i.size is None else i.size) > n:
            return False
    return True


def gemm_operand(low: Lowering, src: ir.Region, idx: Sequence[Expr]) -> Expr:
    """Element ``idx`` of a forwarded gemm operand (:func:`gemm_operands`), read from the
    global region ``src`` it would have been copied from."""
    return low.bufs[src.buffer][tuple(_coords(low, src, idx))]


def _accesses(kernel: ir.Kernel) -> dict[str, list[ir.Op]]:
    """The ops that read or write each buffer, in program order."""
    out: dict[str, list[ir.Op]] = {}
    for stmt in ir.walk(kernel.body):
        if isinstance(stmt, ir.Op):
            for name in dict.fromkeys(r.buffer for r in ir.regions(stmt)):
                out.setdefault(name, []).append(stmt)
    return out


def _forward(buf: ir.Buffer, ops: list[tuple[int, ir.Op]], roles: dict[str, ir.Buffer],
             body: Sequence[ir.Stmt]) -> tuple[Forward, list[int], set[int]] | None:
    whole = ir.whole(buf.name, buf.shape)
    ops = sorted(ops, key=lambda p: p[0])
    src = dst = None
    copies: set[int] = set()
    i = 0
    pos, op = ops[0]
    if op.kind == "copy" and op.attrs["dst"] == whole:
        src = op.attrs["src"]
        if not _plain_global(src, roles, "input"):
            return None
        copies.add(pos)
        i = 1
    while i < len(ops) and ops[i][1].kind == "load":
        if src is None or ops[i][1].attrs["src"] != whole:
            return None
        i += 1
    if i < len(ops):
        if len(ops) - i != 2:
            return None
        (p_store, store), (p_out, out) = ops[i], ops[i + 1]
        if store.kind != "store" or store.attrs["dst"] != whole or out.kind != "copy" \
                or out.attrs["src"] != whole:
            return None
        dst = out.attrs["dst"]
        if not _plain_global(dst, roles, "output") or any(
                dst.buffer in {r.buffer for r in ir.regions(s)}
                for s in body[p_store + 1:p_out] if isinstance(s, ir.Op)):
            return None
        copies.add(p_out)
    if src is None and dst is None:
        return None
    return Forward(buf.name, src, dst), [p for p, _ in ops], copies


def _plain_global(region: ir.Region, roles: dict[str, ir.Buffer], role: str) -> bool:
    b = roles[region.buffer]
    return b.scope == "global" and b.role == role and not any(
        isinstance(i.start, ir.Value) and i.start.shape != () for i in region.index)


def _hoistable(op: ir.Op) -> bool:
    """A scalar op of scalars that reads no buffer (block index arithmetic)."""
    return op_defs.is_pure(op) and not ir.regions(op) and all(
        v.shape == () for v in op.operands)


def inside(low: Lowering, segment: Segment) -> Expr | bool:
    """Whether every forwarded global region lies inside its buffer."""
    conds = []
    for f in segment.forwards:
        for region in (f.src, f.dst):
            if region is None:
                continue
            buf = low.bufs[region.buffer]
            for i, n in zip(region.index, buf.shape):
                s = low.start(i, extent(n), clamp=False)
                size = 1 if i.size is None else i.size
                conds.append(tirx.And(s >= 0, s + size <= extent(n)))
    return all_of(conds)


def _coords(low: Lowering, region: ir.Region, idx: Sequence[Expr]) -> list[Expr]:
    it = iter(idx)
    return [low.start(i, 0, clamp=False) + (0 if i.size is None else next(it))
            for i in region.index]


def load(low: Lowering, fwd: Forward, idx: Sequence[Expr]) -> Expr:
    """Element ``idx`` of the fragment, read from the global region it was copied from
    (converted as the copy would). The element goes through a small local array, as it
    went through the fragment: TVM's vectorizer folded ``x[...] * 0.0`` to ``0.0`` (wrong
    for NaN, inf and -0.0) for such a load of a parameter, never for a local array, and a
    bound variable made it scalarise some loops wrongly. LLVM keeps the value in
    registers."""
    src = low.bufs[fwd.src.buffer]
    frag = low.bufs[fwd.fragment]
    value = low.kb.let(low.name("f"), src[tuple(_coords(low, fwd.src, idx))],
                       through_memory=True)
    return ew.convert(value, low.dtype(src), low.dtype(frag), low.bind)


def store_target(low: Lowering, fwd: Forward, idx: Sequence[Expr],
                 value: Expr) -> tuple[tirx.Buffer, list[Expr], Expr]:
    """Where and what to store for element ``idx`` of a store of ``value`` (already in the
    fragment's dtype) into a forwarded fragment: the global output, converted as the copy
    out would."""
    dst = low.bufs[fwd.dst.buffer]
    frag = low.bufs[fwd.fragment]
    return dst, _coords(low, fwd.dst, idx), ew.convert(value, low.dtype(frag),
                                                       low.dtype(dst), low.bind)
