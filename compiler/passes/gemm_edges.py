"""Ragged edges of GEMMs: which accumulator rows and columns reach an output, and how much
of the contraction multiplies anything but pads; a Tile IR -> Tile IR pass the CPU runs.

A tiled matmul on a shape that the tiles do not divide (M = 1000 with 128-row tiles) has
edge blocks whose accumulator tile hangs over the end of the output: ``jt.copy(acc,
c.at[by * bm, bx * bn])`` drops the rows and columns past the edge, yet the gemms computed
them, on the zeros the copies padded the operands with. This pass finds, for each
accumulator, the rows and columns that can reach an output, and notes on its gemms a bound
computed on the device: ``notes["live"] = (rows, cols)``, each ``None`` (all of them) or a
scalar int32 Value ``n`` meaning only rows (columns) ``< n`` need be computed. The CPU
gemm lowering (:mod:`..cpu.gemm`) then skips the register tiles past the bound.

Assumes: the verified IR of a kernel with static buffer shapes. An accumulator qualifies
when it is a 2-D scratch buffer written only by gemms into all of it, by stores of all of
it, and read only by gemms (as ``c``), by loads of all of it whose values flow only through
per-element ops of the accumulator's shape (``relu``, a bias added along rows) into stores
of all of it, and by exactly one tile-origin copy of all of it into a global buffer whose
origin is computed from block indices and constants only. Element ``(r, j)`` then only ever
depends on element ``(r, j)`` of earlier values, and reaches an output only if ``origin + r``
is inside it; anything else about the accumulator (a reduction, a second copy, a gemm
operand, a dynamic size) leaves its gemms as they are.

The contraction has a ragged edge too: with K = 900 in 64-deep steps, the last step's
panels (or the whole-K panels of :mod:`.gemm_panels`, 960 deep) hold 60 columns of A and
60 rows of B that the copies padded with zeros, and the gemm multiplies them: 6% of a
1000 x 700 x 900 product's work. A gemm whose ``a`` and ``b`` are each all of a 2-D static
scratch buffer with one writer, a copy of all of it from a 2-D global region with pad zero
earlier in the gemm's own statement list, gets ``notes["live_k"] = n``, a scalar int32
Value computed right before it: ``max(end of a, end of b)``, where an operand's end is its
source's extent along K minus the region's start there. Past ``n`` both operands hold zero
pads, and their products are ``+0``, which leave every sum as it is (a sum that is ``-0``
would become ``+0``: the only difference leaving them out makes). Where one operand ends
earlier than the other, its pads still meet the other's values, which may be infinite, so
the bound is the larger end. No note where the scalar ranges show that one operand never
runs past its source.

Guarantees: every row and column of every accumulator that reaches an output is computed
exactly as before (same operands, same order), up to the sign of a zero sum; the others
may hold anything. New ops are scalar ops at the start of the kernel (a clone of the copy's
origin computation and one subtraction per axis) and before noted gemms (a subtraction per
operand and a ``max``); no op is removed or changed except for the gemms' notes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .. import ir, op_defs
from ..analysis import scalars

_ORIGIN_OPS = frozenset({"const", "elementwise", "convert"})
"""Scalar ops a copy's origin may be computed with (from block indices and constants)."""


def trim_edge_gemms(kernel: ir.Kernel) -> ir.Kernel:
    """Note on each qualifying gemm the accumulator rows and columns that reach an output
    and the end of its operands' non-pad contraction (see the module doc)."""
    buffers = {b.name: b for b in kernel.buffers}
    defs = {s.result.id: s for s in ir.walk(kernel.body)
            if isinstance(s, ir.Op) and s.result is not None}
    prologue: list[ir.Stmt] = []
    live: dict[str, tuple[ir.Value | None, ir.Value | None]] = {}
    for name in _accumulators(kernel):
        copy = _single_copy_out(kernel, buffers, name)
        if copy is None:
            continue
        ops: list[ir.Stmt] = []
        bounds = _bounds(copy, buffers, kernel.block_indices, defs, ops)
        if bounds is not None and bounds != (None, None):
            live[name] = bounds
            prologue.extend(ops)
    depth = _contraction_bounds(kernel, buffers)
    if not live and not depth:
        return kernel
    body = ir.map_ops(kernel.body, lambda op: _annotate(op, live, depth))
    return dataclasses.replace(kernel, body=tuple(prologue) + body)


def _accumulators(kernel: ir.Kernel) -> list[str]:
    """2-D scratch buffers that gemms accumulate into, all of it, with static shapes."""
    shapes = {b.name: b.shape for b in kernel.buffers if b.role == "scratch"}
    out = []
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Op) and s.kind == "gemm":
            c = s.attrs["c"].buffer
            shape = shapes.get(c)
            if shape is not None and len(shape) == 2 and c not in out \
                    and s.attrs["c"] == ir.whole(c, shape):
                out.append(c)
    return out


def _single_copy_out(kernel: ir.Kernel, buffers: dict[str, ir.Buffer],
                     name: str) -> ir.Op | None:
    """The one copy of all of ``name`` into a global buffer, if ``name`` is used only in the
    ways the module doc allows; else None."""
    whole = ir.whole(name, buffers[name].shape)
    derived: set[int] = set()
    copies = []
    for s in ir.walk(kernel.body):
        if not isinstance(s, ir.Op):
            if any(v.id in derived for v in ir.uses(s)):
                return None
            continue
        touched = [r for r in ir.regions(s) if r.buffer == name]
        if touched:
            if any(r != whole for r in touched):
                return None
            if s.kind == "gemm" and s.attrs["c"] == whole \
                    and name not in (s.attrs["a"].buffer, s.attrs["b"].buffer):
                continue
            if s.kind == "load":
                derived.add(s.result.id)
                continue
            if s.kind == "store":
                continue
            if s.kind == "copy" and s.attrs["src"] == whole \
                    and buffers[s.attrs["dst"].buffer].scope == "global":
                copies.append(s)
                continue
            return None
        if any(v.id in derived for v in s.operands):
            if not (op_defs.get(s.kind).per_element and s.result is not None
                    and s.result.shape == whole.shape):
                return None
            derived.add(s.result.id)
    return copies[0] if len(copies) == 1 else None


def _bounds(copy: ir.Op, buffers: dict[str, ir.Buffer], blocks: Sequence[ir.Value],
            defs: dict[int, ir.Op], prologue: list[ir.Stmt]
            ) -> tuple[ir.Value | None, ir.Value | None] | None:
    """Per accumulator axis, the Value ``dim - origin`` (rows or columns that land inside
    the copy's destination), or None where the axis always fits; None if an origin is not
    computed from block indices and constants alone."""
    src, dst = copy.attrs["src"], copy.attrs["dst"]
    dims = buffers[dst.buffer].shape
    sized = [(i, d) for i, d in zip(dst.index, dims) if i.size is not None]
    if len(sized) != 2 or any(i.size != n for (i, _), n in zip(sized, src.shape)) \
            or not all(isinstance(d, int) for _, d in sized):
        return None
    out: list[ir.Value | None] = []
    for (index, dim), size in zip(sized, src.shape):
        start = index.start
        if isinstance(start, int):
            # A static origin: the bound is a constant, and only worth noting if it cuts.
            out.append(_const(dim - start, prologue) if dim - start < size else None)
            continue
        if dim % size == 0:
            # Origins at multiples of the tile fit exactly; others are rare enough to leave.
            out.append(None)
            continue
        origin = _clone(start, set(v.id for v in blocks), defs, prologue, {})
        if origin is None:
            return None
        bound = ir.Value((), np.int32)
        prologue.append(ir.Op("elementwise", (_const(dim, prologue), origin), bound,
                              {"fn": "sub"}, copy.line))
        out.append(bound)
    return out[0], out[1]


def _const(value: int, prologue: list[ir.Stmt]) -> ir.Value:
    v = ir.Value((), np.int32)
    prologue.append(ir.Op("const", (), v, {"value": int(value)}))
    return v


def _clone(v: ir.Value, blocks: set[int], defs: dict[int, ir.Op], prologue: list[ir.Stmt],
           done: dict[int, ir.Value]) -> ir.Value | None:
    """``v`` recomputed by fresh scalar ops appended to ``prologue`` (block indices are used
    as they are), or None if it depends on anything else (a loop variable, a load)."""
    if v.id in blocks:
        return v
    if v.id in done:
        return done[v.id]
    op = defs.get(v.id)
    if op is None or op.kind not in _ORIGIN_OPS or v.shape != () \
            or not np.issubdtype(v.dtype, np.integer):
        return None
    operands = []
    for o in op.operands:
        c = _clone(o, blocks, defs, prologue, done)
        if c is None:
            return None
        operands.append(c)
    result = ir.Value((), v.dtype)
    prologue.append(dataclasses.replace(op, operands=tuple(operands), result=result))
    done[v.id] = result
    return result


def _contraction_bounds(kernel: ir.Kernel, buffers: dict[str, ir.Buffer]
                        ) -> dict[int, tuple[list[ir.Stmt], ir.Value]]:
    """Per gemm (by ``id``) whose operands are both padded copies of global tiles along K:
    the scalar ops computing ``max(bound of a, bound of b)``, to go right before it, and
    that Value (see the module doc)."""
    ops = [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op)]
    if not any(s.kind == "gemm" for s in ops):
        return {}
    writers: dict[str, int] = {}
    for s in ops:
        for r in op_defs.writes(s):
            writers[r.buffer] = writers.get(r.buffer, 0) + 1
    ranges = scalars.scalar_ranges(kernel)
    out: dict[int, tuple[list[ir.Stmt], ir.Value]] = {}
    lists: list[Sequence[ir.Stmt]] = [kernel.body]
    lists += [blk for s in ir.walk(kernel.body) for blk in ir.blocks(s)]
    for stmts in lists:
        for pos, gemm in enumerate(stmts):
            if not isinstance(gemm, ir.Op) or gemm.kind != "gemm":
                continue
            a = gemm.attrs
            k_axis = {"a": 0 if a["transpose_a"] else 1, "b": 1 if a["transpose_b"] else 0}
            ends = [_padded_from(a[role], k_axis[role], stmts[:pos], buffers, writers)
                    for role in ("a", "b")]
            if None in ends:
                continue
            depth = buffers[a["a"].buffer].shape[k_axis["a"]]
            if max(_least(e, ranges) for e in ends) >= depth:
                continue            # never past the end of both: nothing to leave out
            emitted: list[ir.Stmt] = []
            values = [_const(e, emitted) if isinstance(e, int) else _sub(e, emitted)
                      for e in ends]
            bound = ir.Value((), np.int32)
            emitted.append(ir.Op("elementwise", tuple(values), bound, {"fn": "max"},
                                 gemm.line))
            out[id(gemm)] = (emitted, bound)
    return out


def _padded_from(region: ir.Region, axis: int, before: Sequence[ir.Stmt],
                 buffers: dict[str, ir.Buffer], writers: dict[str, int]
                 ) -> int | tuple[int, ir.Value] | None:
    """Where along ``axis`` a gemm operand starts holding zero pads: the operand is all of
    a 2-D static scratch buffer whose one writer is a copy, in ``before``, of all of it
    from a 2-D static global region with pad zero. Returns ``n - start`` (``n`` the
    source's extent along the axis) as an int for a static start, else ``(n, start)``;
    None if the operand is anything else."""
    buf = buffers[region.buffer]
    shape = buf.shape
    if buf.role != "scratch" or len(shape) != 2 or not all(isinstance(d, int) for d in shape) \
            or region != ir.whole(buf.name, shape) or writers.get(buf.name) != 1:
        return None
    copies = [s for s in before if isinstance(s, ir.Op) and s.kind == "copy"
              and s.attrs["dst"] == region]
    if len(copies) != 1:
        return None
    copy = copies[0]
    src = copy.attrs["src"]
    source = buffers[src.buffer]
    if source.scope != "global" or len(source.shape) != 2 \
            or not isinstance(source.shape[axis], int) \
            or [i.size for i in src.index] != list(shape) \
            or copy.attrs["pad"] not in (None, 0):
        return None
    start = src.index[axis].start
    n = source.shape[axis]
    return n - start if isinstance(start, int) else (n, start)


def _least(end: int | tuple[int, ir.Value], ranges: dict[ir.Value, scalars.Range]) -> int:
    """The least value an operand's end (:func:`_padded_from`) takes, as far as the scalar
    ranges tell (a large negative number where they do not)."""
    if isinstance(end, int):
        return end
    n, start = end
    r = ranges.get(start)
    return -(1 << 31) if r is None else n - r[1]


def _sub(end: tuple[int, ir.Value], ops: list[ir.Stmt]) -> ir.Value:
    n, start = end
    v = ir.Value((), np.int32)
    ops.append(ir.Op("elementwise", (_const(n, ops), start), v, {"fn": "sub"}))
    return v


def _annotate(op: ir.Op, live: dict[str, tuple[ir.Value | None, ir.Value | None]],
              depth: dict[int, tuple[list[ir.Stmt], ir.Value]]) -> list[ir.Stmt]:
    if op.kind != "gemm":
        return [op]
    notes = {}
    if op.attrs["c"].buffer in live:
        notes["live"] = live[op.attrs["c"].buffer]
    ops: list[ir.Stmt] = []
    if id(op) in depth:
        ops, notes["live_k"] = depth[id(op)]
    return [*ops, op.with_notes(**notes)] if notes else [op]
