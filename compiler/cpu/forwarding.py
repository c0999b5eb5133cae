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

An accumulator's epilogue is forwarded in a tail form: a fragment that earlier statements
of the kernel's body filled (zeroed, accumulated into by gemms, in loops or not), whose
last accesses are loads of all of it, a store of all of it and its copy to the output,
``acc[...] = relu(acc[...])`` then ``jt.copy(acc, c.at[...])``. The loads read the
fragment as it is, the store goes to the output (masked edges as above) and the copy
disappears: one pass over the tile less. 1000 x 700 x 900 ``ops.matmul_relu`` in 64 x 64
tiles, one thread, process CPU time per call (medians of 40), the two forms interleaved in
one process, two runs per ISA: 0.2-5% less (AVX2 13.09 / 13.27 ms, 15.94 / 16.77; AVX-512
15.88 / 15.91, 16.83 / 16.96). Only in the kernel's own body, run once per block: in a loop's body
the statements before the segment run again after it.

The first operand of a gemm is forwarded too (:func:`gemm_operands`), without the test:
when its panel is filled by a float32 copy of a region that starts inside the source in
every block (a static proof over the grid), the gemm broadcasts ``A``'s elements from the
source where it would from the panel. The panel of a plain matmul is ``bm`` rows of the
source, so the gemm reads the same addresses in the same order, one block's copy of them
less: 64 x 1024 float32 (256 KiB) in every block of a 1024^3 product with 64 x 64 tiles,
about 15% of its time on a Zen 3. Its edges are masked too (:class:`GemmOperand`): columns
past the source's end along K (the last, partial K step) are the copy's pad, a constant the
gemm multiplies in over a loop of its own (read, they would be the next row's first
elements); rows past the end along M are read clamped to the last row, which is exact only
because they feed accumulator rows that reach no output, proven block by block from the
gemm's ``live`` note. In the quickstart's 1000 x 700 x 900 (64 x 64 x 64 tiles) neither
edge divides: copied, every block's A panel goes through the masked copy for the K tail,
14.5-16.0 ms a call against 13.1 forwarded (one Zen 4 core, thread CPU time, AVX-512).
A bfloat16 panel is forwarded too where its gemms re-lay it anyway (the bfloat16-dot and
AMX paths pair its K values first, :mod:`.gemm_bf16`): its copy widened 64 x 1024 values
into 256 KiB of float32 in every block, and the re-layout read them back, half the time
of the 1024^3 AMX GEMM (3.0 -> 2.0 ms, Sapphire Rapids class, 2 cores); on the FMA path
it stays copied, as the register tiles would widen each element once per tile of columns.
B's panels are not forwarded: their rows are the source's rows cut to ``bn`` columns, so a
register tile's strip of B would stride a whole source row per ``k`` (and
:mod:`.copy_reuse` already copies each of them once per call).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence

import ml_dtypes
import numpy as np
import tvm_ffi
from tvm import tirx
from tvm.ir import Expr

from .. import ir, op_defs
from ..analysis import scalars
from ..target import CpuCaps
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
    take positions from an index tile (gather, scatter). In the kernel's own body a
    fragment is also forwardable in the tail form (:func:`_forward_tail`: filled by
    anything before the segment, its last accesses loads, a store and the copy out), with
    no access of it inside the segment but those. Between the first and last forwarded
    statement there may be no loops or conditionals, and the scalar ops there must not
    read buffers (they are moved before the test).
    """
    accesses = _accesses(kernel)
    roles = {b.name: b for b in kernel.buffers}
    top = {id(s): pos for pos, s in enumerate(body) if isinstance(s, ir.Op)}
    # The tail form only in the kernel's own body, which runs once per block: in a loop's
    # body the statements before the segment run again after it, and would read what the
    # forwarded store no longer wrote into the fragment.
    whole_body = len(body) == len(kernel.body) and all(
        x is y for x, y in zip(body, kernel.body))
    forwards, positions, skip = [], [], set()
    for b in kernel.buffers:
        if b.role != "scratch" or not accesses.get(b.name):
            continue
        ops = accesses[b.name]
        found = None
        if all(id(op) in top for op in ops):
            found = _forward(b, [(top[id(op)], op) for op in ops], roles, body)
        if found is None and whole_body:
            found = _forward_tail(b, ops, top, roles, body)
        if found is not None:
            fwd, pos, copies = found
            forwards.append(fwd)
            positions += pos
            skip |= copies
    if not forwards:
        return None
    first, last = min(positions), max(positions)
    # A tail form's fragment is filled before the segment, and nothing in it but the tail
    # may touch the fragment (a store there would go to the output).
    filled = {id(s) for s in ir.walk(body[:first])}
    inside = {id(body[p]) for p in positions}
    if not all(id(op) in filled or id(op) in inside
               for f in forwards for op in accesses[f.fragment]):
        return None
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


@dataclasses.dataclass(frozen=True)
class GemmOperand:
    """A gemm's ``a`` panel read from the global region its copy fills it from
    (:func:`gemm_operands`)."""

    src: ir.Region
    pad: float | int | bool
    """What the copy reads past the end of its source (its ``pad``)."""
    rows_axis: int
    """The axis of ``src`` that runs along the gemm's M (1 when ``a`` is transposed)."""
    clamp_rows: bool
    """Some block's region may run past the source's end along M: reads there are
    clamped to its last row, which changes only accumulator rows that reach no output."""
    k_tail: bool
    """Some block's region may run past the source's end along K: the panel's columns
    there hold ``pad``, and the gemm multiplies that constant in instead of a read."""


MAX_BLOCKS_CHECKED = 1 << 16
"""The most block index combinations :func:`_dead_past_end` evaluates, per gemm."""


def gemm_operands(kernel: ir.Kernel, caps: CpuCaps | None = None) -> dict[str, GemmOperand]:
    """Scratch buffers whose gemm reads are forwarded to global memory: buffer name -> the
    operand (:class:`GemmOperand`: the global region its copy reads, and how its edges are
    masked).

    A buffer qualifies when its accesses are, all in one statement list, one ``copy`` into
    all of it from a 2-D region of a 2-D global input that no op writes, of the same dtype,
    float32 (or bfloat16 where the gemms re-lay it anyway: ``caps`` has the bfloat16 dot
    and every gemm reading it has a bfloat16 ``b`` and a float32 ``c``, so it takes the path
    of :mod:`.gemm_bf16`), and after it only gemms that read all of it as their ``a``
    operand (and nothing else of theirs), all with one transpose; and the region starts inside the
    source for every value the analysis bounds its starts to
    (:func:`..analysis.scalars.scalar_ranges`: over the grid and loops). It may run past
    the source's end along K (the gemm then multiplies ``pad`` in there, as the panel
    holds) and along M where every block's gemms compute only accumulator rows inside the
    source: each gemm has a ``live`` rows note (:mod:`..passes.gemm_edges`) and, evaluated
    in every block, ``live rows <= source rows - region start``. Guarantees: the gemm,
    reading the region where it reads the buffer (rows past the end clamped, the K tail
    taken as ``pad``), computes every live accumulator element from the same values in the
    same order; the copy can be left out.
    """
    accesses = _accesses(kernel)
    roles = {b.name: b for b in kernel.buffers}
    writers = {r.buffer for s in ir.walk(kernel.body) if isinstance(s, ir.Op)
               for r in op_defs.writes(s)}
    ranges = scalars.scalar_ranges(kernel)
    lists: list[Sequence[ir.Stmt]] = [kernel.body]
    lists += [blk for s in ir.walk(kernel.body) for blk in ir.blocks(s)]
    out: dict[str, GemmOperand] = {}
    for stmts in lists:
        where = {id(s): pos for pos, s in enumerate(stmts) if isinstance(s, ir.Op)}
        for b in kernel.buffers:
            ops = accesses.get(b.name, [])
            if b.role != "scratch" or b.dtype not in (np.float32, ml_dtypes.bfloat16) \
                    or not ops or not all(id(op) in where for op in ops):
                continue
            first, *readers = sorted(ops, key=lambda op: where[id(op)])
            if b.dtype != np.float32 and not _relaid_by_bf16_gemms(readers, roles, caps):
                continue
            whole = ir.whole(b.name, b.shape)
            if first.kind != "copy" or first.attrs["dst"] != whole or not readers:
                continue
            src = first.attrs["src"]
            source = roles[src.buffer]
            if not _plain_global(src, roles, "input") or src.buffer in writers \
                    or source.dtype != b.dtype or len(source.shape) != 2 \
                    or len(b.shape) != 2 or any(i.size is None for i in src.index):
                continue
            if not all(op.kind == "gemm" and op.attrs["a"] == whole
                       and b.name not in (op.attrs["b"].buffer, op.attrs["c"].buffer)
                       for op in readers):
                continue
            transposed = {bool(op.attrs["transpose_a"]) for op in readers}
            if len(transposed) != 1:
                continue
            rows_axis = 1 if transposed.pop() else 0
            if not all(_starts_inside(i, n, ranges) for i, n in zip(src.index, source.shape)):
                continue
            rows, n_rows = src.index[rows_axis], source.shape[rows_axis]
            clamp_rows = not _dim_inside(rows, n_rows, ranges)
            if clamp_rows and not all(_dead_past_end(kernel, op, rows.start, n_rows)
                                      for op in readers):
                continue
            k_tail = not _dim_inside(src.index[1 - rows_axis], source.shape[1 - rows_axis],
                                     ranges)
            pad = 0 if first.attrs["pad"] is None else first.attrs["pad"]
            out[b.name] = GemmOperand(src, pad, rows_axis, clamp_rows, k_tail)
    return out


def _relaid_by_bf16_gemms(readers: Sequence[ir.Op], buffers: dict[str, ir.Buffer],
                          caps: CpuCaps | None) -> bool:
    """Whether ``readers`` are all gemms that :mod:`.gemm_bf16` lowers on ``caps``: they
    re-lay their bfloat16 ``a`` into pairs first, so reading it from global memory costs
    nothing per use, where the FMA path would widen every element it reads, again for each
    tile of columns."""
    return bool(getattr(caps, "bf16_dot", False)) and all(
        op.kind == "gemm" and buffers[op.attrs["b"].buffer].dtype == ml_dtypes.bfloat16
        and buffers[op.attrs["c"].buffer].dtype == np.float32 for op in readers)


def _starts_inside(i: ir.Index, n: int | str, ranges: dict[ir.Value, scalars.Range]) -> bool:
    """Whether index ``i`` starts inside a dimension of ``n`` for every start the ranges
    allow."""
    start = (i.start, i.start) if isinstance(i.start, int) else ranges.get(i.start)
    return start is not None and isinstance(n, int) and 0 <= start[0] and start[1] < n


def _dead_past_end(kernel: ir.Kernel, gemm: ir.Op, start: int | ir.Value, n: int) -> bool:
    """Whether ``gemm`` computes, in every block, only accumulator rows whose row of ``a``
    (from ``start`` on) lies inside its ``n`` rows: its ``live`` rows note is at most
    ``n - start``, both evaluated block by block (they must depend on block indices and
    constants only; at most :data:`MAX_BLOCKS_CHECKED` combinations of the axes they
    use)."""
    live = gemm.notes.get("live", (None, None))[0]
    if live is None or not all(isinstance(g, int) for g in kernel.grid):
        return False
    defs = {s.result.id: s for s in ir.walk(kernel.body)
            if isinstance(s, ir.Op) and s.result is not None}
    axes = {v.id: a for a, v in enumerate(kernel.block_indices)}
    used = _block_axes(live, defs, axes)
    if isinstance(start, ir.Value):
        found = _block_axes(start, defs, axes)
        used = None if used is None or found is None else used | found
    if used is None or int(np.prod([kernel.grid[a] for a in used])) > MAX_BLOCKS_CHECKED:
        return False
    order = sorted(used)
    for point in np.ndindex(*(kernel.grid[a] for a in order)):
        env = {kernel.block_indices[a].id: int(p) for a, p in zip(order, point)}
        rows = _evaluate(live, defs, env)
        first = start if isinstance(start, int) else _evaluate(start, defs, env)
        if rows is None or first is None or rows > n - first:
            return False
    return True


def _block_axes(v: ir.Value, defs: dict[int, ir.Op], axes: dict[int, int]) -> set[int] | None:
    """The grid axes scalar ``v`` is computed from, or ``None`` if it depends on anything
    but block indices and constants (a loop variable, a load)."""
    if v.id in axes:
        return {axes[v.id]}
    op = defs.get(v.id)
    if op is None or ir.regions(op) or v.shape != ():
        return None
    out: set[int] = set()
    for o in op.operands:
        found = _block_axes(o, defs, axes)
        if found is None:
            return None
        out |= found
    return out


def _evaluate(v: ir.Value, defs: dict[int, ir.Op], env: dict[int, int | None]) -> int | None:
    """The value scalar ``v`` holds in the block whose indices ``env`` gives (memoised in
    ``env``), or ``None`` where the op's definition cannot tell."""
    if v.id not in env:
        op = defs[v.id]
        values = [_evaluate(o, defs, env) for o in op.operands]
        env[v.id] = None if None in values else op_defs.evaluate(op, values)
    return env[v.id]


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


def gemm_operand(low: Lowering, operand: GemmOperand, idx: Sequence[Expr]) -> Expr:
    """Element ``idx`` of a forwarded gemm operand (:func:`gemm_operands`), read from the
    global region it would have been copied from; a row past the source's end reads its
    last row instead. The caller reads only the columns of :func:`gemm_k_parts`' first
    part."""
    src = operand.src
    coords = _coords(low, src, idx)
    if operand.clamp_rows:
        axis = operand.rows_axis
        coords[axis] = tirx.min(coords[axis], extent(low.bufs[src.buffer].shape[axis]) - 1)
    return low.bufs[src.buffer][tuple(coords)]


def gemm_operand_reader(low: Lowering, operand: GemmOperand, k: int,
                        transpose: bool) -> Callable[[Expr, Expr], Expr]:
    """``read(i, kk)``: the element of the forwarded operand's panel at row ``i`` (along the
    gemm's M) and K index ``kk`` (below ``k``), as float32 (a bfloat16 value widens
    exactly); past the source's end along K the copy's pad, rounded to the panel's dtype
    as the copy would store it. For gemms that read each element once, re-laying the
    panel (:mod:`.gemm_bf16`)."""
    inside = gemm_k_parts(low, operand, k)[0][1]
    panel = ml_dtypes.bfloat16 if str(low.bufs[operand.src.buffer].dtype) == "bfloat16" \
        else np.float32
    pad = tirx.const(float(np.array(float(operand.pad)).astype(panel)), "float32")

    def read(i: Expr, kk: Expr) -> Expr:
        value = tirx.Cast("float32", gemm_operand(low, operand, (kk, i) if transpose
                                                  else (i, kk)))
        return tirx.if_then_else(kk < inside, value, pad) if operand.k_tail else value

    return read


def gemm_operand_rows(low: Lowering, operand: GemmOperand) -> tuple[tirx.Buffer, Expr,
                                                                    Expr] | None:
    """Where a forwarded operand's panel lies as it is: ``(buffer, row, col)``, its element
    ``(i, kk)`` being ``buffer[row + i, col + kk]`` for every element of the panel (not
    transposed, no edge masked: the whole panel lies inside the source); else None."""
    if operand.rows_axis != 0 or operand.clamp_rows or operand.k_tail:
        return None
    row, col = _coords(low, operand.src, (0, 0))
    return low.bufs[operand.src.buffer], row, col


def gemm_k_parts(low: Lowering, operand: GemmOperand | None, k: int,
                 live_k: Expr | None = None) -> list[tuple[int | Expr, int | Expr, bool]]:
    """The gemm's K loop over ``k`` panel columns in parts ``(start, stop, read)``: where
    ``read``, the operand is read (:func:`gemm_operand`); elsewhere (past the source's end
    along K) each of its elements is the copy's ``pad``. One part unless the operand has a
    K tail. With ``live_k`` (the gemm's ``live_k`` note, :mod:`..passes.gemm_edges`), the
    columns from there on, zero pads in both operands, are left out."""
    end: int | Expr = k
    if live_k is not None:
        end = low.bind(tirx.max(tirx.min(live_k, tirx.const(k, "int32")),
                                tirx.const(0, "int32")))
    if operand is None or not operand.k_tail:
        return [(0, end, True)]
    axis = 1 - operand.rows_axis
    n = extent(low.bufs[operand.src.buffer].shape[axis])
    start = low.start(operand.src.index[axis], n, clamp=False)
    inside = low.bind(tirx.max(tirx.min(n - start, end), tirx.const(0, "int32")))
    return [(0, inside, True), (inside, end, False)]


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


def _forward_tail(buf: ir.Buffer, ops: list[ir.Op], top: dict[int, int],
                  roles: dict[str, ir.Buffer], body: Sequence[ir.Stmt]
                  ) -> tuple[Forward, list[int], set[int]] | None:
    """The tail form: a fragment filled by earlier statements of ``body`` (an accumulator
    the gemms wrote, in loops or not) whose last accesses, ops of ``body`` itself, are loads
    of all of it, a store of all of it and the copy of all of it to a global output. The
    loads keep reading the fragment; the store goes to the output and the copy is left
    out, one pass over the tile less (``relu(acc)`` stored into ``acc`` and copied out).
    That the earlier accesses all lie before the segment, :func:`plan` checks for every
    forward at once."""
    whole = ir.whole(buf.name, buf.shape)
    if len(ops) < 3 or not all(id(op) in top for op in ops[-2:]):
        return None
    (store, out) = ops[-2:]
    if store.kind != "store" or store.attrs["dst"] != whole or out.kind != "copy" \
            or out.attrs["src"] != whole:
        return None
    tail = len(ops) - 2
    while tail and ops[tail - 1].kind == "load" and id(ops[tail - 1]) in top \
            and ops[tail - 1].attrs["src"] == whole:
        tail -= 1
    if not tail:
        return None
    p_store, p_out = top[id(store)], top[id(out)]
    dst = out.attrs["dst"]
    if not _plain_global(dst, roles, "output") or any(
            dst.buffer in {r.buffer for r in ir.regions(s)}
            for s in body[p_store + 1:p_out] if isinstance(s, ir.Op)):
        return None
    return Forward(buf.name, None, dst), [top[id(op)] for op in ops[tail:]], {p_out}


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
