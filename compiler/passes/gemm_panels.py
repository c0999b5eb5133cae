"""Coarser K steps for GEMM loops: a Tile IR -> Tile IR pass the CPU runs.

A tiled matmul written the plain way loops over K in steps of ``bk``: copy a tile of A and
a tile of B into on-chip buffers, ``jt.gemm`` them into the accumulator. On the CPU each
gemm loads and stores every register tile of the accumulator (see :mod:`..cpu.gemm`), so a
small ``bk`` spends much of its time there and in loop overheads: 64 x 64 tiles ran 1.3x
slower with ``bk=16`` than with ``bk=64``. This pass makes each step ``u`` times longer,
with ``u * bk`` about :data:`PANEL_K`: the loop copies ``u`` consecutive tiles of A and of
B side by side into ``u`` times wider buffers (panels), then runs one gemm over them. The
gemm does the same multiply-adds in the same order, so the result is bitwise the same; the
iterations that do not fill a whole panel make one shorter panel. Where the ``u`` tiles lie
side by side in the source (the K start is ``bk * k`` plus a term the loop does not change),
one copy of the whole panel replaces the ``u`` copies: the same elements, and pads, in
fewer and longer rows. When both panels of all of K fit :data:`WHOLE_K_BYTES`, one panel
each takes all of it and the loop goes (its copies are then the block's own, which the CPU
lowering can share between blocks: ``cpu/copy_reuse.py``). bfloat16 and float16
operands of a float32 accumulator are widened (exactly) by the copies into the panels,
unless ``widen=False`` (a target whose gemm multiplies bfloat16 directly, see
:mod:`..cpu.gemm_bf16`, keeps bfloat16 panels: half the bytes, and no conversion).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import numpy as np

from .. import ir
from ..analysis import scalars

_WIDENED = frozenset({"bfloat16", "float16"})
"""Operand dtypes that float32 holds exactly."""

Ranges = dict[ir.Value, scalars.Range]

PANEL_K = 256
"""The K extent a gemm step is coarsened to (about): a register tile's strip of the B
panel, ``PANEL_K`` x 16 float32, then fits the L1 cache with room for the A rows."""


def coarsen_gemm_loops(kernel: ir.Kernel, *, widen: bool = True) -> ir.Kernel:
    """Coarsen the K loops of GEMMs (see the module doc).

    A loop qualifies when its start and extent are static, its body holds only scalar ops
    that read no buffer, one ``copy`` into each of two whole on-chip buffers from global
    memory, and one ``gemm`` of those two buffers (whole) into a third buffer, and the two
    buffers are used nowhere else in the kernel. Guarantees: every copy and multiply-add of
    the original loop happens, in the same order, on the same data; new buffers are
    scratch buffers named after the ones they replace, of the replaced buffers' dtype or,
    with ``widen``, float32 for half-precision operands of a float32 accumulator.
    """
    uses = Counter(r.buffer for s in ir.walk(kernel.body) if isinstance(s, ir.Op)
                   for r in ir.regions(s))
    buffers = {b.name: b for b in kernel.buffers}
    body = _rewrite(kernel.body, buffers, uses, widen, scalars.scalar_ranges(kernel))
    if body is None:
        return kernel
    used = {r.buffer for s in ir.walk(body) if isinstance(s, ir.Op) for r in ir.regions(s)}
    kept = tuple(b for b in buffers.values() if b.role != "scratch" or b.name in used)
    return dataclasses.replace(kernel, buffers=kept, body=body)


def _rewrite(stmts: Sequence[ir.Stmt], buffers: dict[str, ir.Buffer],
             uses: Counter, widen: bool, ranges: Ranges) -> tuple[ir.Stmt, ...] | None:
    """``stmts`` with qualifying loops coarsened (new buffers added to ``buffers``), or
    ``None`` if nothing changed."""
    out: list[ir.Stmt] = []
    changed = False
    for stmt in stmts:
        new: Sequence[ir.Stmt] | None = None
        if isinstance(stmt, ir.For):
            inner = _rewrite(stmt.body, buffers, uses, widen, ranges)
            if inner is not None:
                stmt = dataclasses.replace(stmt, body=inner)
                changed = True
            new = _coarsen(stmt, buffers, uses, widen, ranges)
        elif isinstance(stmt, ir.If):
            then = _rewrite(stmt.then, buffers, uses, widen, ranges)
            otherwise = _rewrite(stmt.otherwise, buffers, uses, widen, ranges)
            if then is not None or otherwise is not None:
                stmt = dataclasses.replace(stmt, then=then or stmt.then,
                                           otherwise=otherwise or stmt.otherwise)
                changed = True
        if new is None:
            out.append(stmt)
        else:
            out.extend(new)
            changed = True
    return tuple(out) if changed else None


@dataclasses.dataclass(frozen=True)
class _Match:
    gemm: ir.Op
    copies: dict[str, ir.Op]
    """Operand buffer -> the copy that fills it."""
    kdim: dict[str, int]
    """Operand buffer -> its K dimension."""
    bk: int


def _match(loop: ir.For, buffers: dict[str, ir.Buffer], uses: Counter) -> _Match | None:
    if not isinstance(loop.start, int) or not isinstance(loop.extent, int) \
            or loop.extent < 2:
        return None
    gemms = [s for s in loop.body if isinstance(s, ir.Op) and s.kind == "gemm"]
    if len(gemms) != 1:
        return None
    g = gemms[0]
    names = [g.attrs["a"].buffer, g.attrs["b"].buffer]
    kdim = {names[0]: 0 if g.attrs["transpose_a"] else 1,
            names[1]: 1 if g.attrs["transpose_b"] else 0}
    if names[0] == names[1] or g.attrs["c"].buffer in names:
        return None
    copies: dict[str, ir.Op] = {}
    for s in loop.body:
        if not isinstance(s, ir.Op):
            return None
        if s is g:
            if set(copies) != set(names):
                return None
        elif s.kind == "copy":
            dst, src = s.attrs["dst"].buffer, s.attrs["src"]
            if dst not in names or dst in copies or buffers[src.buffer].scope != "global" \
                    or any(isinstance(i.start, ir.Value) and i.start.shape != ()
                           for i in src.index):
                return None
            copies[dst] = s
        elif s.result is None or s.result.shape != () or ir.regions(s):
            return None
    for n in names:
        b = buffers[n]
        if b.role != "scratch" or len(b.shape) != 2 or uses[n] != 2 \
                or g.attrs["a" if n == names[0] else "b"] != ir.whole(n, b.shape) \
                or copies[n].attrs["dst"] != ir.whole(n, b.shape):
            return None
    bk = buffers[names[0]].shape[kdim[names[0]]]
    if buffers[names[1]].shape[kdim[names[1]]] != bk:
        return None
    return _Match(g, copies, kdim, bk)


def _coarsen(loop: ir.For, buffers: dict[str, ir.Buffer], uses: Counter,
             widen: bool, ranges: Ranges) -> list[ir.Stmt] | None:
    m = _match(loop, buffers, uses)
    if m is None:
        return None
    u = min(loop.extent, max(1, PANEL_K // m.bk))
    adjacent = _adjacent(loop, m, ranges)
    if adjacent and _whole_k_fits(loop, m, buffers, widen):
        u = loop.extent
    if u < 2:
        return None
    panels = {}
    acc = buffers[m.gemm.attrs["c"].buffer].dtype
    for n, k in m.kdim.items():
        b = buffers[n]
        shape = tuple(d * u if i == k else d for i, d in enumerate(b.shape))
        name = _fresh(f"{n}_panel", buffers)
        # Half-precision operands are widened exactly once, by the copy into the panel,
        # instead of every time the gemm reads them.
        dtype = acc if widen and b.dtype.name in _WIDENED and acc == np.float32 \
            else b.dtype
        buffers[name] = dataclasses.replace(b, name=name, shape=shape, dtype=np.dtype(dtype))
        panels[n] = name
    dtype = loop.var.dtype
    outer, step = ir.Value((), dtype), ir.Value((), dtype)
    prologue: list[ir.Stmt] = []

    def scalar(kind: str, operands: tuple, **attrs) -> ir.Value:
        v = ir.Value((), dtype)
        prologue.append(ir.Op(kind, operands, v, attrs, loop.line))
        return v

    gemm = dataclasses.replace(m.gemm, attrs={
        **m.gemm.attrs,
        "a": ir.whole(panels[m.gemm.attrs["a"].buffer],
                      buffers[panels[m.gemm.attrs["a"].buffer]].shape),
        "b": ir.whole(panels[m.gemm.attrs["b"].buffer],
                      buffers[panels[m.gemm.attrs["b"].buffer]].shape)})
    # k = start + outer * u + step; the panel column of this step is step * bk.
    k = scalar("elementwise", (outer, scalar("const", (), value=u)), fn="mul")
    if adjacent:
        # The u tiles lie side by side in the source: one copy of all of them per panel.
        if loop.start:
            k = scalar("elementwise", (k, scalar("const", (), value=loop.start)), fn="add")
        copies = _clone(loop, k, scalar("const", (), value=0), m, panels)
        body = (*prologue, *(_widened(s, m, panels, buffers, u) for s in copies), gemm)
        if u == loop.extent:
            # One panel holds all of K: no loop (the copies are then the block's own, which
            # the CPU lowering can share between blocks, see cpu/copy_reuse.py).
            return [ir.Op("const", (), outer, {"value": 0}, loop.line), *body]
    else:
        k = scalar("elementwise", (k, step), fn="add")
        if loop.start:
            k = scalar("elementwise", (k, scalar("const", (), value=loop.start)), fn="add")
        col = scalar("elementwise", (step, scalar("const", (), value=m.bk)), fn="mul")
        steps = prologue + _clone(loop, k, col, m, panels)
        body = (ir.For(step, 0, u, "serial", 1, steps, loop.line), gemm)
    out: list[ir.Stmt] = [ir.For(outer, 0, loop.extent // u, "serial", 1, body, loop.line)]
    if loop.extent % u:
        # The iterations left over make one shorter panel (or run as written if just one).
        done = loop.extent - loop.extent % u
        rest = dataclasses.replace(loop, start=loop.start + done, extent=loop.extent % u)
        out.extend(_coarsen(rest, buffers, uses, widen, ranges) or [rest])
    return out


WHOLE_K_BYTES = 256 << 10
"""A panel up to this size takes the whole K extent in one step: 64 x 1024 float32 panels
ran as fast as 64 x 256 ones (1024^3, one Zen 4 core, 25.5 against 26.2 ms)."""


def _whole_k_fits(loop: ir.For, m: _Match, buffers: dict[str, ir.Buffer], widen: bool) -> bool:
    """Whether both panels of all ``loop.extent`` tiles fit :data:`WHOLE_K_BYTES`."""
    acc = buffers[m.gemm.attrs["c"].buffer].dtype
    for n in m.kdim:
        b = buffers[n]
        dtype = acc if widen and b.dtype.name in _WIDENED and acc == np.float32 else b.dtype
        if int(np.prod(b.shape)) * loop.extent * np.dtype(dtype).itemsize > WHOLE_K_BYTES:
            return False
    return True


def _adjacent(loop: ir.For, m: _Match, ranges: Ranges) -> bool:
    """Whether consecutive iterations copy tiles that lie side by side along K: the K start
    of every copy's source is ``bk * var`` plus something the loop variable does not change,
    and its other starts do not depend on the variable."""
    defs = {s.result.id: s for s in loop.body if isinstance(s, ir.Op) and s.result is not None}
    for dst, copy in m.copies.items():
        sized = [i for i in copy.attrs["src"].index if i.size is not None]
        for d, index in enumerate(sized):
            want = m.bk if d == m.kdim[dst] else 0
            if _slope(index.start, loop.var, defs, ranges) != want:
                return False
    return True


def _slope(v: int | ir.Value, var: ir.Value, defs: dict[int, ir.Op],
           ranges: Ranges) -> int | None:
    """``d v / d var`` if ``v`` is an integer affine function of ``var`` with a static slope
    (computed by the loop body's scalar ops; a factor is a constant wherever the scalar
    analysis, ``ranges``, knows its one value: canonicalisation shares a constant with one
    outside the loop), else None."""
    if isinstance(v, int) or (v.id != var.id and v.id not in defs):
        return 0                                  # a constant, or defined outside the loop
    if v.id == var.id:
        return 1
    op = defs[v.id]
    if not np.issubdtype(v.dtype, np.integer):
        return None
    slopes = [_slope(o, var, defs, ranges) for o in op.operands]
    if None in slopes or op.kind not in ("const", "convert", "elementwise"):
        return None
    if not any(slopes):
        return 0
    if op.kind == "convert":
        return slopes[0]
    fn = op.attrs["fn"]
    if fn in ("add", "sub"):
        return slopes[0] + slopes[1] if fn == "add" else slopes[0] - slopes[1]
    if fn == "mul":
        for c, other in ((0, 1), (1, 0)):
            factor = ranges.get(op.operands[c])
            if slopes[c] == 0 and factor is not None and factor[0] == factor[1]:
                return factor[0] * slopes[other]
    return None


def _widened(copy: ir.Stmt, m: _Match, panels: dict[str, str], buffers: dict[str, ir.Buffer],
             u: int) -> ir.Stmt:
    """A copy of the first tile of a panel made the copy of all ``u`` tiles (see
    :func:`_adjacent`); other statements as they are."""
    if not isinstance(copy, ir.Op) or copy.kind != "copy":
        return copy
    original = next(b for b, p in panels.items() if p == copy.attrs["dst"].buffer)
    kd = m.kdim[original]
    src = copy.attrs["src"]
    sized = [d for d, i in enumerate(src.index) if i.size is not None]
    index = tuple(ir.Index(i.start, i.size * u) if d == sized[kd] else i
                  for d, i in enumerate(src.index))
    panel = copy.attrs["dst"].buffer
    return dataclasses.replace(copy, attrs={**copy.attrs, "src": ir.Region(src.buffer, index),
                                            "dst": ir.whole(panel, buffers[panel].shape)})


def _clone(loop: ir.For, k: ir.Value, col: ir.Value, m: _Match,
           panels: dict[str, str]) -> list[ir.Stmt]:
    """The loop body's scalar ops and copies for step ``k``, copying into the panels at
    column ``col``; fresh result values, so the original body stays valid."""
    values = {loop.var.id: k}

    def mapped(region: ir.Region) -> ir.Region:
        return ir.Region(region.buffer, tuple(
            ir.Index(values.get(i.start.id, i.start) if isinstance(i.start, ir.Value)
                     else i.start, i.size) for i in region.index))

    out: list[ir.Stmt] = []
    for s in loop.body:
        if s is m.gemm:
            continue
        if s.kind == "copy":
            dst = s.attrs["dst"]
            kd = m.kdim[dst.buffer]
            index = tuple(ir.Index(col, i.size) if d == kd else i
                          for d, i in enumerate(dst.index))
            out.append(dataclasses.replace(s, attrs={
                **s.attrs, "src": mapped(s.attrs["src"]),
                "dst": ir.Region(panels[dst.buffer], index)}))
            continue
        result = ir.Value(s.result.shape, s.result.dtype)
        values[s.result.id] = result
        out.append(dataclasses.replace(
            s, operands=tuple(values.get(v.id, v) for v in s.operands), result=result))
    return out


def _fresh(name: str, buffers: dict[str, ir.Buffer]) -> str:
    n, candidate = 0, name
    while candidate in buffers:
        n += 1
        candidate = f"{name}{n}"
    return candidate

