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

A segment whose regions run past the end of their buffers along the last (contiguous)
axis only, as a row tile rounded up past a row's end does, is forwarded as well, with
masked edges (:class:`Edges`): every forwarded region then has the same number ``valid`` of
columns inside its buffer, and each loop over that axis runs in three parts: the vectors
wholly inside (plain loads and stores, at full speed), the one vector straddling the end
(read from and written to a small edge array that is filled before the statements, element
by element with ``pad`` past the end, and written out after them, element by element up to
the end), and the vectors wholly past the end (loads give ``pad``, stores are dropped). A
read of a forwarded fragment at a column the parts do not name (a transpose, a scalar
loop) selects ``pad`` past the end and reads a clamped address; such a store is skipped
past the end. Nothing is read or written outside the regions' valid columns, so a row's
end never reads the next row, and the last row never reads past the buffer.

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

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np
import tvm_ffi
from tvm import tirx
from tvm.ir import Expr

from .. import ir, op_defs
from ..analysis import scalars
from . import elementwise as ew
from .context import Lowering, extent
from .copies import all_of

INSIDE, EDGE, PAST = "inside", "edge", "past"
"""The parts of a loop over the last axis of a segment forwarded with masked edges: the
vectors wholly inside every region, the vector straddling the end, the vectors past it."""


@dataclasses.dataclass(frozen=True)
class Forward:
    """A fragment whose copies are forwarded: ``src`` is the global region it is filled
    from (``None`` if it is not filled by a copy), ``dst`` the global region it is copied
    to (``None`` if it is not copied out)."""

    fragment: str
    src: ir.Region | None
    dst: ir.Region | None
    pad: float | int | bool = 0
    """What the copy in reads past the end of its source (its ``pad``)."""


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
    return all(_dim_inside(i, n, ranges) for i, n in zip(region.index, buf.shape))


def _dim_inside(i: ir.Index, n: int | str, ranges: dict[ir.Value, scalars.Range]) -> bool:
    """Whether index ``i`` lies inside a dimension of ``n`` for every start the ranges
    allow."""
    start = (i.start, i.start) if isinstance(i.start, int) else ranges.get(i.start)
    return start is not None and isinstance(n, int) and start[0] >= 0 \
        and start[1] + (1 if i.size is None else i.size) <= n


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
    pad: float | int | bool = 0
    copies: set[int] = set()
    i = 0
    pos, op = ops[0]
    if op.kind == "copy" and op.attrs["dst"] == whole:
        src = op.attrs["src"]
        if not _plain_global(src, roles, "input"):
            return None
        pad = 0 if op.attrs["pad"] is None else op.attrs["pad"]
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
    return Forward(buf.name, src, dst, pad), [p for p, _ in ops], copies


def _plain_global(region: ir.Region, roles: dict[str, ir.Buffer], role: str) -> bool:
    b = roles[region.buffer]
    return b.scope == "global" and b.role == role and not any(
        isinstance(i.start, ir.Value) and i.start.shape != () for i in region.index)


def _hoistable(op: ir.Op) -> bool:
    """A scalar op of scalars that reads no buffer (block index arithmetic)."""
    return op_defs.is_pure(op) and not ir.regions(op) and all(
        v.shape == () for v in op.operands)


def inside(low: Lowering, segment: Segment) -> Expr | bool:
    """Whether every forwarded global region lies inside its buffer: ``True`` where the
    kernel's scalar ranges prove it for every block (so the statements as written need not
    be emitted), else the test."""
    regions = [r for f in segment.forwards for r in (f.src, f.dst) if r is not None]
    ranges = scalars.scalar_ranges(low.kernel)
    buffers = {b.name: b for b in low.kernel.buffers}
    if all(_always_inside(r, buffers[r.buffer], ranges) for r in regions):
        return True
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
    edges = low.edges
    part = None if edges is None else edges.part(idx[-1])
    if edges is None or part is not None and part[0] == INSIDE:
        value = src[tuple(_coords(low, fwd.src, idx))]
    elif part is not None and part[0] == EDGE:
        return edges.ins[fwd.fragment][(*idx[:-1], part[1])]
    elif part is not None:
        value = ew.const(fwd.pad, low.dtype(src))
    else:
        # A column of no part: select pad past the end, reading a clamped address.
        column = idx[-1]
        at = _coords(low, fwd.src, [*idx[:-1], tirx.min(column, edges.valid - 1)])
        value = tirx.Select(column < edges.valid, src[tuple(at)],
                            ew.const(fwd.pad, low.dtype(src)))
    value = low.kb.let(low.name("f"), value, through_memory=True)
    return ew.convert(value, low.dtype(src), low.dtype(frag), low.bind)


def store(low: Lowering, fwd: Forward, idx: Sequence[Expr], value: Expr) -> None:
    """Store element ``idx`` of ``value`` (already in the fragment's dtype) of a store into
    a forwarded fragment: into the global output, converted as the copy out would; with
    masked edges, into the edge array in the straddling vector, nowhere past it."""
    dst = low.bufs[fwd.dst.buffer]
    frag = low.bufs[fwd.fragment]
    edges = low.edges
    part = None if edges is None else edges.part(idx[-1])
    if edges is None or part is not None and part[0] == INSIDE:
        low.kb.store(dst, _coords(low, fwd.dst, idx),
                     ew.convert(value, low.dtype(frag), low.dtype(dst), low.bind))
    elif part is not None and part[0] == EDGE:
        low.kb.store(edges.outs[fwd.fragment], [*idx[:-1], part[1]], value)
    elif part is None:
        # A column of no part: the global output before the straddling vector, its edge
        # array in it (written out after the statements), nothing past it. (The value is
        # bound once: an expression with Let nodes may appear only once in a loop.)
        value = low.bind(value)
        column, start = idx[-1], edges.whole * edges.lanes
        with low.kb.if_(column < start):
            low.kb.store(dst, _coords(low, fwd.dst, idx),
                         ew.convert(value, low.dtype(frag), low.dtype(dst), low.bind))
        with low.kb.else_(), low.kb.if_(column < start + edges.lanes):
            low.kb.store(edges.outs[fwd.fragment], [*idx[:-1], column - start], value)


@dataclasses.dataclass
class Edges:
    """A segment forwarded with masked edges (see the module docstring), for one lowering
    of it: the runtime test that it applies, the column counts, the edge arrays and the
    column expressions of the loop parts being emitted."""

    width: int
    """Extent of the fragments' last axis (the regions' last size): a multiple of
    ``lanes``."""
    lanes: int
    valid: Expr
    """Columns of every forwarded region inside its buffer, 1..``width``."""
    whole: Expr
    """``valid // lanes``: the vectors wholly inside; the vector after them straddles the
    end (unless it is ``width // lanes``)."""
    cond: Expr | bool
    """Whether the segment may run so: every region inside its buffer but for its last
    axis, which starts inside and has ``valid`` columns inside in every region."""
    ins: dict[str, tirx.Buffer]
    """Fragment -> its edge array for loads (fragment shape, last axis ``lanes``)."""
    outs: dict[str, tirx.Buffer]
    """Fragment -> its edge array for stores."""
    parts: list[tuple[Expr, str, Expr | None]] = dataclasses.field(default_factory=list)
    """``(column, part, lane)`` of the loops being emitted: ``column`` (an index
    expression) lies in ``part``; in the straddling vector it is ``whole * lanes + lane``."""

    def part(self, column: Expr) -> tuple[str, Expr | None] | None:
        """The part a column expression was emitted in, if any."""
        for expr, part, lane in self.parts:
            if expr.same_as(column):
                return part, lane
        return None

    def splits(self, extent: int) -> bool:
        """Whether a loop over ``extent`` elements of the last axis runs in parts."""
        return extent == self.width

    def columns(self, low: Lowering, *, past: bool = True) -> Iterator[Expr]:
        """Emit the loops over the last axis, part by part, each vectorised; yields the
        column index inside each (registered while the caller emits its body). With
        ``past=False`` the vectors past the end are left out (a store drops them)."""
        lanes, n_vectors = self.lanes, self.width // self.lanes
        whole = self.whole
        with low.kb.loop(low.name("i"), whole) as i, \
                low.kb.loop(low.name("v"), lanes, kind="vectorized") as v:
            yield from self.mark(i * lanes + v, INSIDE, None)
        with low.kb.if_(whole < n_vectors), \
                low.kb.loop(low.name("v"), lanes, kind="vectorized") as v:
            yield from self.mark(whole * lanes + v, EDGE, v)
        if past:
            rest = tirx.max(n_vectors - whole - 1, 0)
            with low.kb.loop(low.name("i"), rest, start=whole + 1) as i, \
                    low.kb.loop(low.name("v"), lanes, kind="vectorized") as v:
                yield from self.mark(i * lanes + v, PAST, None)

    def mark(self, column: Expr, part: str, lane: Expr | None = None) -> Iterator[Expr]:
        """Yield ``column``, registered as lying in ``part`` (with its ``lane`` in the
        straddling vector) while the caller emits its body."""
        self.parts.append((column, part, lane))
        try:
            yield column
        finally:
            self.parts.pop()


def masked_edges(low: Lowering, kernel: ir.Kernel, segment: Segment) -> Edges | None:
    """The masked-edge form of ``segment``, or ``None`` when it does not apply or is not
    needed: every forwarded region must have a last axis of the fragments' last extent, a
    multiple of the target's vector lanes, and some region may run past its buffer's end
    along it (by the kernel's scalar ranges; otherwise the plain test suffices). Emits
    nothing; the test and the counts are expressions of the segment's scalars."""
    lanes = low.target.caps.vector_bits // 32
    regions = [r for f in segment.forwards for r in (f.src, f.dst) if r is not None]
    frags = [low.bufs[f.fragment].shape for f in segment.forwards]
    widths = {extent(shape[-1]) if len(shape) else None for shape in frags}
    widths |= {r.index[-1].size for r in regions}
    if len(widths) != 1:
        return None
    (width,) = widths
    if not isinstance(width, int) or width % lanes:
        return None
    ranges = scalars.scalar_ranges(kernel)
    if not any(_may_overhang(r, kernel, ranges) for r in regions):
        return None
    conds, valids = [], []
    for region in regions:
        buf = low.bufs[region.buffer]
        *lead, last = region.index
        for i, n in zip(lead, buf.shape[:-1]):
            s = low.start(i, extent(n), clamp=False)
            size = 1 if i.size is None else i.size
            conds += [s >= 0, s + size <= extent(n)]
        s = low.start(last, extent(buf.shape[-1]), clamp=False)
        n = extent(buf.shape[-1])
        conds += [s >= 0, s < n]
        valids.append(tirx.min(n - s, tirx.const(width, "int32")))
    distinct = [v for pos, v in enumerate(valids)
                if not any(tvm_ffi.structural_equal(v, w) for w in valids[:pos])]
    conds += [v == distinct[0] for v in distinct[1:]]
    # Where the ranges prove the test, the statements as written are not emitted at all.
    proven = len(distinct) == 1 and all(_inside_but_the_end(r, kernel, ranges)
                                        for r in regions)
    valid = low.bind(valids[0])
    whole = low.bind(tirx.floordiv(tirx.max(valid, 0), lanes))
    ins = {f.fragment: low.alloc_like(low.name("edge_in"), _edge_shape(low, f, lanes),
                                      low.bufs[f.fragment])
           for f in segment.forwards if f.src is not None}
    outs = {f.fragment: low.alloc_like(low.name("edge_out"), _edge_shape(low, f, lanes),
                                       low.bufs[f.fragment])
            for f in segment.forwards if f.dst is not None}
    return Edges(width, lanes, valid, whole, True if proven else all_of(conds), ins, outs)


def _edge_shape(low: Lowering, fwd: Forward, lanes: int) -> list[int]:
    return [*(int(n) for n in low.bufs[fwd.fragment].shape[:-1]), lanes]


def _may_overhang(region: ir.Region, kernel: ir.Kernel,
                  ranges: dict[ir.Value, scalars.Range]) -> bool:
    """Whether ``region``'s last axis may run past its buffer's end (as far as the scalar
    ranges tell)."""
    buf = next(b for b in kernel.buffers if b.name == region.buffer)
    last, n = region.index[-1], buf.shape[-1]
    start = (last.start, last.start) if isinstance(last.start, int) else ranges.get(last.start)
    return start is None or not isinstance(n, int) or start[1] + last.size > n


def _inside_but_the_end(region: ir.Region, kernel: ir.Kernel,
                        ranges: dict[ir.Value, scalars.Range]) -> bool:
    """Whether the ranges prove ``region`` inside its buffer but for the end of its last
    axis, where it starts inside."""
    buf = next(b for b in kernel.buffers if b.name == region.buffer)
    *lead, last = region.index
    if not all(_dim_inside(i, n, ranges) for i, n in zip(lead, buf.shape)):
        return False
    n = buf.shape[-1]
    start = (last.start, last.start) if isinstance(last.start, int) else ranges.get(last.start)
    return start is not None and isinstance(n, int) and start[0] >= 0 and start[1] < n


def fill_edges(low: Lowering, segment: Segment, edges: Edges) -> None:
    """Fill the load edge arrays: the straddling vector of each forwarded source region,
    element by element, ``pad`` past the end (converted as the copy would)."""
    for f in segment.forwards:
        if f.src is None:
            continue
        arr, src = edges.ins[f.fragment], low.bufs[f.src.buffer]
        with _edge_elements(low, edges, arr) as (idx, column):
            at = _coords(low, f.src, [*idx, tirx.min(column, edges.valid - 1)])
            value = tirx.Select(column < edges.valid, src[tuple(at)],
                                ew.const(f.pad, low.dtype(src)))
            low.kb.store(arr, [*idx, column - edges.whole * edges.lanes],
                         ew.convert(value, low.dtype(src), low.dtype(arr), low.bind))


def flush_edges(low: Lowering, segment: Segment, edges: Edges) -> None:
    """Write the store edge arrays out: each forwarded destination's straddling vector,
    element by element up to the end (converted as the copy out would)."""
    for f in segment.forwards:
        if f.dst is None:
            continue
        arr, dst = edges.outs[f.fragment], low.bufs[f.dst.buffer]
        with _edge_elements(low, edges, arr) as (idx, column), \
                low.kb.if_(column < edges.valid):
            value = arr[(*idx, column - edges.whole * edges.lanes)]
            low.kb.store(dst, _coords(low, f.dst, [*idx, column]),
                         ew.convert(value, low.dtype(arr), low.dtype(dst), low.bind))


@contextlib.contextmanager
def _edge_elements(low: Lowering, edges: Edges,
                   arr: tirx.Buffer) -> Iterator[tuple[list[Expr], Expr]]:
    """Scalar loops over the elements of edge array ``arr`` when there is a straddling
    vector: the fragment index but the last, and the element's column."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(low.kb.if_(edges.whole < edges.width // edges.lanes))
        idx = [stack.enter_context(low.kb.loop(low.name("i"), int(n)))
               for n in arr.shape[:-1]]
        lane = stack.enter_context(low.kb.loop(low.name("l"), edges.lanes))
        yield idx, edges.whole * edges.lanes + lane
