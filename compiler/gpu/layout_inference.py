"""Layout inference (GPU): which thread holds which element of every register tile.

Every ``fragment`` buffer and every tile value that is not *uniform* (the same in every
element and thread: scalars, constants and their broadcasts) gets a
:class:`~jaxtile.compiler.gpu.layout.Layout`, recorded in ``Buffer.layout`` and in the
defining op's ``notes["layout"]`` (so the IR text shows ``float32[4, 384]#blocked(...)``).

Ops state constraints at three levels, and inference runs from the strictest outward:

1. **strict**: user annotations (``jt.annotate_layout``, in ``Buffer.layout``), the
   caller's ``anchors`` (the accumulators the GEMM planner lays out for ``mma``), and
   tiles stored into ``local`` buffers (every thread holds all of a local tile:
   replicated) or used as gather indices (replicated);
2. **common**, propagated until nothing changes: elementwise ops, selects and casts share
   one layout among their full-shape operands and result (an operand with size-1
   dimensions takes the result's layout with those dimensions dropped, keepdims); a
   reduction's result is its operand's layout with the reduced dimensions dropped (their
   threads become replicas); a broadcast's operand is its result's layout with the new
   dimensions dropped; a transpose permutes; a whole-buffer load or store of a fragment
   has the buffer's layout;
3. **free**: what is still open gets a coalesced blocked layout (vectors of 16 bytes of
   the narrowest global dtype it is copied from or to), fragment buffers first, in
   program order, then values; after each choice, step 2 runs again.

Where an op then finds an operand in another layout than it demands (two strict demands,
or an order of propagation that reached a value from two sides), a ``relayout`` op is
inserted, which the lowering does through shared memory; inference never fails on
layouts. Ops whose data moves between threads anyway (reshape, rev, slice, concatenate,
scan, argreduce, loads from shared/global/local memory, and loads, stores and copies of
part of a fragment) demand nothing of their operands.

Assumes: the neutral pipeline ran. Guarantees: every non-uniform tile value and fragment
buffer has a layout consistent with every op's demands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from .. import ir, op_defs
from ..errors import KernelError
from . import layout as L

Anchors = Callable[[ir.Kernel], Mapping[str, L.Layout]]
"""Strict layouts of fragment buffers (by name), e.g. GEMM accumulators."""



def _layout_rule(op: ir.Op) -> str | None:
    """The op's layout rule (:data:`.op_defs.LAYOUT_RULES`)."""
    return op_defs.get(op.kind).layout


def uniform_values(kernel: ir.Kernel) -> set[int]:
    """Ids of values that are the same in every element (scalars, constants, and what is
    computed elementwise from those alone): the lowering keeps them as one scalar."""
    out: set[int] = set()
    for stmt in ir.walk(kernel.body):
        if not isinstance(stmt, ir.Op) or stmt.result is None:
            continue
        res = stmt.result
        if res.shape == () or stmt.kind == "const":
            out.add(res.id)
        elif (_layout_rule(stmt) in ("same", "broadcast")
              and all(v.id in out for v in stmt.operands)):
            out.add(res.id)
    return out


def _whole(region: ir.Region, buf: ir.Buffer) -> bool:
    return region.is_whole(buf.shape)


class _State:
    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.threads = kernel.threads
        self.bufs = {b.name: b for b in kernel.buffers}
        self.uniform = uniform_values(kernel)
        self.ops = [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op)]
        self.value: dict[int, L.Layout] = {}
        self.buffer: dict[str, L.Layout] = {}

    def open(self, v: ir.Value) -> bool:
        return v.id not in self.uniform and v.id not in self.value

    def set_value(self, v: ir.Value, lay: L.Layout) -> bool:
        if v.id in self.uniform or v.id in self.value:
            return False
        self.value[v.id] = lay
        return True

    def frag(self, region: ir.Region) -> ir.Buffer | None:
        b = self.bufs[region.buffer]
        return b if b.scope == "fragment" else None

    # -- common rules ---------------------------------------------------------------------

    def propagate(self) -> None:
        changed = True
        while changed:
            changed = False
            for op in self.ops:
                changed |= self._rule(op)

    def _rule(self, op: ir.Op) -> bool:
        k, rule, res = op.kind, _layout_rule(op), op.result
        if rule == "same" and res.id not in self.uniform:
            full = [v for v in (*op.operands, res) if v.id not in self.uniform
                    and v.shape == res.shape]
            known = next((self.value[v.id] for v in full if v.id in self.value), None)
            if known is None:
                return False
            changed = any([self.set_value(v, known) for v in full])
            for v in op.operands:
                if v.id not in self.uniform and v.shape != res.shape:
                    changed |= self.set_value(v, known.drop(_expanded(v.shape, res.shape),
                                                            keepdims=True))
            return changed
        if rule == "broadcast" and res.id in self.value:
            src = op.operands[0]
            if self.open(src):
                return self.set_value(src, _broadcast_operand(self.value[res.id], op))
            return False
        if rule == "reduce" and op.operands[0].id in self.value:
            return self.set_value(res, self.value[op.operands[0].id].drop(op.attrs["axes"]))
        if rule == "transpose":
            perm = op.attrs["perm"]
            src = op.operands[0]
            if src.id in self.value:
                return self.set_value(res, self.value[src.id].permute(perm))
            if res.id in self.value:
                return self.set_value(src, self.value[res.id].permute(np.argsort(perm)))
            return False
        if k in ("load", "store"):
            region = op.attrs["src" if k == "load" else "dst"]
            buf = self.frag(region)
            v = res if k == "load" else op.operands[0]
            if buf is None or not _whole(region, buf) or v.id in self.uniform:
                return False
            if buf.name in self.buffer:
                return self.set_value(v, self.buffer[buf.name])
            if v.id in self.value:
                self.buffer[buf.name] = self.value[v.id]
                return True
        return False

    # -- strict and free choices ------------------------------------------------------------

    def strict(self, anchors: Mapping[str, L.Layout]) -> None:
        for b in self.kernel.buffers:
            if b.layout is None:
                continue
            if b.name in anchors and anchors[b.name] != b.layout:
                raise KernelError(f"fragment '{b.name}' is annotated {b.layout.text()}, but "
                                  f"its gemm needs {anchors[b.name].text()} (at {b.line})")
            self.buffer[b.name] = b.layout
        self.buffer.update(anchors)
        for op in self.ops:
            if op.kind == "store" and self.bufs[op.attrs["dst"].buffer].scope == "local":
                v = op.operands[0]
                if v.id not in self.uniform:
                    self.set_value(v, L.replicated(v.shape, self.threads))
            for v in _index_tiles(op):
                self.set_value(v, L.replicated(v.shape, self.threads))

    def free(self) -> bool:
        """Choose one open layout; False when none is left."""
        for b in self.kernel.buffers:
            if b.scope == "fragment" and b.name not in self.buffer:
                self.buffer[b.name] = L.blocked(b.shape, self.threads,
                                                _vec(b.shape, self._copy_dtypes(b)))
                return True
        for op in self.ops:
            if op.result is not None and self.open(op.result):
                r = op.result
                self.value[r.id] = L.blocked(r.shape, self.threads, _vec(r.shape, [r.dtype]))
                return True
        return False

    def _copy_dtypes(self, b: ir.Buffer) -> list[np.dtype]:
        out = [b.dtype]
        for op in self.ops:
            if op.kind == "copy" and b.name in (op.attrs["src"].buffer, op.attrs["dst"].buffer):
                out += [self.bufs[op.attrs[r].buffer].dtype for r in ("src", "dst")]
        return out


def _expanded(small: tuple[int, ...], big: tuple[int, ...]) -> list[int]:
    return [d for d, (n, m) in enumerate(zip(small, big)) if n == 1 and m != 1]


def _broadcast_operand(res_layout: L.Layout, op: ir.Op) -> L.Layout:
    """The operand layout a broadcast demands: the result's with the new dimensions
    dropped and the size-1 operand dimensions kept as size 1."""
    dims, src = op.attrs["dims"], op.operands[0]
    expanded = [dims[i] for i, n in enumerate(src.shape)
                if n == 1 and op.result.shape[dims[i]] != 1]
    lay = res_layout.drop(expanded, keepdims=True) if expanded else res_layout
    new = [d for d in range(len(op.result.shape)) if d not in dims]
    return lay.drop(new) if new else lay


def _index_tiles(op: ir.Op) -> list[ir.Value]:
    return [i.start for r in ir.regions(op) for i in r.index
            if isinstance(i.start, ir.Value) and i.start.shape != ()]


def _vec(shape: tuple[int, ...], dtypes: list[np.dtype]) -> int:
    """Elements per 16-byte vector of the narrowest dtype, as long as it divides the last
    dimension."""
    if not shape:
        return 1
    vec = 16 // min(np.dtype(d).itemsize for d in dtypes)
    while vec > 1 and shape[-1] % vec:
        vec //= 2
    return vec


def _demands(st: _State, op: ir.Op) -> list[tuple[int, L.Layout]]:
    """(operand index, layout it must have) for an op, given the result's layout."""
    res = op.result
    out: list[tuple[int, L.Layout]] = []
    rule = _layout_rule(op)
    if rule == "same" and res.id not in st.uniform:
        lay = st.value[res.id]
        for i, v in enumerate(op.operands):
            if v.id in st.uniform:
                continue
            want = lay if v.shape == res.shape else lay.drop(_expanded(v.shape, res.shape),
                                                              keepdims=True)
            out.append((i, want))
    elif (rule == "broadcast" and res.id not in st.uniform
          and op.operands[0].id not in st.uniform):
        out.append((0, _broadcast_operand(st.value[res.id], op)))
    elif rule == "transpose":
        out.append((0, st.value[res.id].permute(np.argsort(op.attrs["perm"]))))
    elif op.kind == "store":
        region, v = op.attrs["dst"], op.operands[0]
        buf = st.bufs[region.buffer]
        if v.id not in st.uniform:
            if buf.scope == "fragment" and _whole(region, buf):
                out.append((0, st.buffer[buf.name]))
            elif buf.scope == "local":
                out.append((0, L.replicated(v.shape, st.threads)))
    return out


def _natural(st: _State, op: ir.Op) -> L.Layout | None:
    """The layout an op produces by itself, where it has one: a reduction's and a
    whole-fragment load's."""
    if _layout_rule(op) == "reduce":
        return st.value[op.operands[0].id].drop(op.attrs["axes"])
    if op.kind == "load":
        buf = st.frag(op.attrs["src"])
        if buf is not None and _whole(op.attrs["src"], buf):
            return st.buffer[buf.name]
    return None


class _Rewriter:
    """Writes the layouts into the IR and inserts the relayouts that mismatches need."""

    def __init__(self, st: _State):
        self.st = st
        self.conversions = 0

    def _relayout(self, v: ir.Value, lay: L.Layout, line: str | None) -> ir.Op:
        self.conversions += 1
        return ir.Op("relayout", (v,), ir.Value(v.shape, v.dtype), {}, line, {"layout": lay})

    def op(self, op: ir.Op) -> list[ir.Op]:
        st, pre, post = self.st, [], []
        operands = list(op.operands)
        for i, want in _demands(st, op):
            v = operands[i]
            if st.value[v.id] != want:
                conv = self._relayout(v, want, op.line)
                pre.append(conv)
                operands[i] = conv.result
        res = op.result
        notes = dict(op.notes)
        if res is not None and res.id not in st.uniform:
            lay = st.value[res.id]
            natural = _natural(st, op)
            if natural is not None and natural != lay:
                inner = ir.Value(res.shape, res.dtype)
                post.append(ir.Op("relayout", (inner,), res, {}, op.line, {"layout": lay}))
                self.conversions += 1
                res, lay = inner, natural
            notes["layout"] = lay
        return [*pre, dataclasses.replace(op, operands=tuple(operands), result=res,
                                          notes=notes), *post]


def infer_layouts(kernel: ir.Kernel, anchors: Anchors | None = None) -> ir.Kernel:
    """Give every fragment buffer and non-uniform tile value a layout; see the module
    docstring. Raises KernelError for what the CUDA lowering does not take yet."""
    st = _State(kernel)
    st.strict(anchors(kernel) if anchors is not None else {})
    st.propagate()
    while st.free():
        st.propagate()
    rw = _Rewriter(st)
    body = ir.map_ops(kernel.body, rw.op)
    buffers = tuple(dataclasses.replace(b, layout=st.buffer[b.name]) if b.name in st.buffer
                    else b for b in kernel.buffers)
    return dataclasses.replace(kernel, buffers=buffers, body=tuple(body))
