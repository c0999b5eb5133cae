"""Tile IR -> TVM TIR -> a CPU shared library.

The kernel becomes one function over a range of grid blocks (``block_begin``..``block_end``;
the FFI handler spreads the range over threads). Shared, fragment and local buffers and
materialised tile values become arrays allocated once per call; scalars become TIR
variables; fused values (see :mod:`..passes.fusion`) are expanded inside their consumers'
loop nests. Tile ops become loop nests: innermost loops over whole tiles are vectorised,
copies take an unmasked fast path when the tile lies inside both buffers and a masked path
(pad on read, drop on write) at the edges.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from tvm import tirx
from tvm.ir import Expr

from .. import cache, ir, op_defs, sizes
from .. import cpu_abi as abi
from ..errors import kernel_error
from ..passes.liveness import live_intervals, share_storage
from ..target import Target
from . import bf16_dot, block_groups, copies, copy_reuse, forwarding, rows, tir_emit
from . import elementwise as ew
from .atomics import (
    lower_atomic,
    lower_fence,
    lower_load_acquire,
    lower_store_release,
    polled_load,
    written_globals,
)
from .context import FALLBACK_LANES, extent
from .gemm import lower_gemm, strip_panels
from .printing import lower_print
from .reductions import lower_reduce
from .scans import lower_argreduce, lower_scan
from .sorts import lower_sort

MAX_SCRATCH_BYTES = 1 << 30
"""Scratch memory (on-chip buffers, tile values, temporaries) one call of a CPU kernel may
use, per thread it runs on; a kernel that needs more is rejected when it is compiled."""

STATEMENTS = lowers = op_defs.Lowerings("cpu", {
    "reduce": lower_reduce, "scan": lower_scan, "atomic": lower_atomic,
    "argreduce": lower_argreduce, "sort": lower_sort,
    # Memory ordering between blocks (atomics.py).
    "load_acquire": lower_load_acquire, "store_release": lower_store_release,
    "fence": lower_fence, "print": lower_print,
})
"""Ops lowered as statements of their own: ``f(lowering, op)`` emits the op's loops."""
ELEMENTS = element = op_defs.Lowerings("cpu")
"""Ops whose result is computed element by element: ``f(lowering, op, idx)`` is the
result's element at tile index ``idx``, a TIR expression; the lowering puts it in a loop
nest over the result (or inlines it into a consumer, as fusion decided)."""

_BINDS_OPERANDS = frozenset({"exp", "exp2", "expm1", "logistic", "tanh", "erfc", "round_away",
                             "sign"})


def symbol_name(kernel: ir.Kernel) -> str:
    """The C-safe function name the kernel is compiled under."""
    return "jt_" + re.sub(r"\W", "_", kernel.name)


class _Lowering:
    def __init__(self, kernel: ir.Kernel, target: Target):
        self.kernel = kernel
        self.target = target
        params = kernel.params
        # One int32 variable per dynamic size, bound from the shapes the kernel is called with
        # (by the packed-call entry, from the first dimension of that size; the FFI handler
        # checks that every buffer agrees with them: see entry_signature).
        self._size_vars: dict[str, tirx.Var] = {}
        self.kb = tir_emit.KernelBuilder(
            symbol_name(kernel), data_alignment=abi.DATA_ALIGNMENT,
            blocks=kernel.num_blocks if sizes.is_static(kernel.grid) else None,
            buffers=[(b.name, [self._param_dim(b.name, a, d) for a, d in enumerate(b.shape)],
                      ew.tvm_dtype(b.dtype)) for b in params])
        self.bufs: dict[str, tirx.Buffer] = dict(zip((b.name for b in params),
                                                     self.kb.buffers))
        self.scopes = {b.name: b.scope for b in kernel.buffers}
        self._dtypes = {b.name: ew.name(b.dtype) for b in kernel.buffers}
        for b in kernel.buffers:
            if b.role == "scratch":
                self.bufs[b.name] = self.kb.alloc_local(b.name, b.shape,
                                                        ew.tvm_dtype(b.dtype))
        self.scalars: dict[int, Expr] = {}
        # Inside a while loop, a scalar read of global memory the kernel writes (a flag or
        # counter other blocks change) must be a real read every time (atomics.polled_load).
        self.while_depth = 0
        self.written_globals = written_globals(kernel)
        self.arrays: dict[int, tirx.Buffer] = {}
        # Materialised values whose lifetimes do not overlap share one array.
        self._slot_of = share_storage(live_intervals(kernel),
                                      lambda v: (v.shape, v.dtype.name))
        self._slots: dict[int, tirx.Buffer] = {}
        self.inline: dict[int, ir.Op] = {}
        self.gemm_sources = forwarding.gemm_operands(kernel, target.caps)
        """Buffers the gemms read from global memory instead (:func:`.forwarding.gemm_operands`):
        their copies are left out."""
        self.panel_strips = strip_panels(kernel, target.caps)
        """On-chip B operands held strip-major, and their strips' width (:mod:`.gemm`)."""
        self.forwards: dict[str, forwarding.Forward] = {}
        """Fragments whose copies the statements being lowered forward (see
        :mod:`.forwarding`)."""
        self.edges: forwarding.Edges | None = None
        """The masked edges of the forwarded statements being lowered, if they have them
        (:class:`.forwarding.Edges`)."""
        self._row: tuple[int, Expr] | None = None
        """``(R, r)`` while statements run one row at a time (see :mod:`.rows`)."""
        self._row_local: set[int] = set()
        """Values of the statements running row by row that nothing else reads: they get
        arrays of one row, so the passes over a row stay in a few KiB of cache."""
        self._row_arrays: set[str] = set()
        self._users: dict[int, list[ir.Stmt]] = {}
        for stmt in ir.walk(kernel.body):
            for v in ir.uses(stmt):
                self._users.setdefault(v.id, []).append(stmt)
        self._names = 0
        self._shared = copy_reuse.Shared(self, kernel, copy_reuse.Reuse(frozenset(), 0))
        """The copies the blocks of a call share (:mod:`.copy_reuse`); none by default."""

    def size(self, size: sizes.Size, dtype: str = "int32") -> int | Expr:
        """A buffer dimension or grid extent: an int, or an expression of the dynamic sizes
        computed in ``dtype``."""
        def leaf(name: str) -> Expr:
            if name not in self._size_vars:
                self._size_vars[name] = tirx.Var(name, "int32")
            var = self._size_vars[name]
            return var if dtype == "int32" else tirx.Cast(dtype, var)
        return sizes.fold(size, leaf, _size_ops(dtype))

    def _param_dim(self, buffer: str, axis: int, size: sizes.Size) -> int | Expr:
        # A dimension that is an expression of the sizes gets a variable of its own: TVM
        # binds parameter shapes before its common-subexpression elimination runs, which
        # then breaks the binding of a shape expression (the caller computed that shape
        # from the same expression).
        if isinstance(size, int) or sizes.parse(size)[0] == "sym":
            return self.size(size)
        return tirx.Var(f"{buffer}_{axis}", "int32")

    def dtype(self, buf: tirx.Buffer) -> str:
        """The dtype (name) ``buf`` holds: its TIR type, except for an 8-bit float, which
        TIR holds as ``uint8`` bits (:mod:`.float8`)."""
        return self._dtypes.get(buf.name, str(buf.dtype))

    def alloc_like(self, name: str, shape: Sequence[int], like: tirx.Buffer) -> tirx.Buffer:
        """A local array ``name`` of the dtype ``like`` holds."""
        self._dtypes[name] = self.dtype(like)
        return self.kb.alloc_local(name, list(shape), str(like.dtype))

    def bind(self, value: Expr) -> Expr:
        """``value`` evaluated once, as an expression free of bfloat16 and of Let nodes
        (TVM's vectorizer rejects a Let whose value holds further Lets)."""
        return self.kb.let(self.name("r"), value)

    def value_array(self, v: ir.Value) -> tirx.Buffer:
        """The array that holds materialised value ``v`` (shared with values that are dead
        by the time ``v`` is defined) and makes ``at`` read it."""
        if self._row is not None and v.id in self._row_local:
            arr = self.kb.alloc_local(self.name("t"), (1, *v.shape[1:]), ew.tvm_dtype(v.dtype))
            self._row_arrays.add(arr.name)
            self.arrays[v.id] = arr
            return arr
        slot = self._slot_of[v.id]
        arr = self._slots.get(slot)
        if arr is None:
            arr = self._slots[slot] = self.kb.alloc_local(self.name("t"), v.shape,
                                                          ew.tvm_dtype(v.dtype))
        self.arrays[v.id] = arr
        return arr

    def array_index(self, arr: tirx.Buffer, idx: Sequence[Expr]) -> list[Expr]:
        """The index into ``arr`` (from :meth:`value_array`) of a value's element ``idx``:
        an array of one row is indexed by row 0."""
        if arr.name in self._row_arrays:
            return [tirx.const(0, "int32"), *idx[1:]]
        return list(idx)

    def name(self, prefix: str) -> str:
        self._names += 1
        return f"{prefix}{self._names}"

    # --- expressions ------------------------------------------------------
    def at(self, v: ir.Value, idx: Sequence[Expr]) -> Expr:
        """The element of value ``v`` at tile index ``idx``."""
        if v.shape == ():
            return self.scalars[v.id]
        if v.id in self.arrays:
            arr = self.arrays[v.id]
            return arr[tuple(self.array_index(arr, idx))]
        return self.expr(self.inline[v.id], idx)

    def start(self, index: ir.Index, dim: int | Expr, clamp: bool) -> Expr:
        """An index start as an int32 expression; with ``clamp``, JAX's ``get``/``swap``
        rule: negative starts count from the end, then the slice is clamped into range."""
        s = index.start
        if not isinstance(s, ir.Value):
            return tirx.const(s, "int32")
        e = self.scalars[s.id]
        if clamp:
            size = 1 if index.size is None else index.size
            e = tirx.Select(e < 0, e + dim, e)
            high = tirx.const(dim - size, "int32") if isinstance(dim, int) else dim - size
            e = tirx.max(tirx.min(e, high), tirx.const(0, "int32"))
        return e

    def element(self, region: ir.Region, idx: Sequence[Expr], clamp: bool) -> list[Expr]:
        """Buffer coordinates of tile element ``idx`` of ``region``."""
        buf = self.bufs[region.buffer]
        coords, it = [], iter(idx)
        for i, dim in zip(region.index, buf.shape):
            s = self.start(i, extent(dim), clamp)
            coords.append(s if i.size is None else s + next(it))
        return coords

    def expr(self, op: ir.Op, idx: Sequence[Expr]) -> Expr:
        """The value of ``op``'s result at tile index ``idx`` (see :data:`ELEMENTS`)."""
        return ELEMENTS.get(op.kind)(self, op, idx)

    # --- statements -------------------------------------------------------
    @contextlib.contextmanager
    def nest(self, shape: Sequence[int], vectorize: bool = True) -> Iterator[list[Expr]]:
        """Loops over a tile; the innermost is vectorised when it divides evenly, in vectors
        of the target's width or, failing that, of 8 lanes."""
        idx: list[Expr] = []
        width = self.target.caps.vector_bits // 32
        with contextlib.ExitStack() as stack:
            for d, n in enumerate(shape):
                lanes = next((w for w in (width, FALLBACK_LANES) if n % w == 0), None)
                if vectorize and d == len(shape) - 1 and lanes:
                    outer = stack.enter_context(self.kb.loop(self.name("i"), n // lanes))
                    lane = stack.enter_context(
                        self.kb.loop(self.name("v"), lanes, kind="vectorized"))
                    idx.append(outer * lanes + lane)
                else:
                    idx.append(stack.enter_context(self.kb.loop(self.name("i"), n)))
            yield idx

    @contextlib.contextmanager
    def value_nest(self, shape: Sequence[int], vectorize: bool = True) -> Iterator[list[Expr]]:
        """Loops over a tile value's own shape (see :meth:`nest`); while statements run
        one row at a time, the leading index of a value with ``R`` rows is the row."""
        if self._row is not None and shape and shape[0] == self._row[0]:
            with self.nest(shape[1:], vectorize) as idx:
                yield [self._row[1], *idx]
        else:
            with self.nest(shape, vectorize) as idx:
                yield idx

    def value_nests(self, shape: Sequence[int], vectorize: bool = True,
                    past: bool = True) -> Iterator[list[Expr]]:
        """Loops over a tile value's own shape (see :meth:`value_nest`), yielding the index
        inside each; while forwarded statements run with masked edges, a last axis of
        their width runs in parts (:meth:`.forwarding.Edges.columns`, which ``past``
        passes on), so the caller's body is emitted once per part."""
        edges = self.edges
        row = self._row is not None and bool(shape) and shape[0] == self._row[0]
        lead = list(shape[1:] if row else shape)
        if edges is None or not vectorize or not lead or not edges.splits(lead[-1]):
            with self.value_nest(shape, vectorize) as idx:
                yield idx
            return
        with self.nest(lead[:-1], vectorize=False) as outer:
            prefix = [self._row[1], *outer] if row else outer
            for column in edges.columns(self, past=past):
                yield [*prefix, column]

    def while_loop(self, stmt: ir.While) -> None:
        """``test = cond; while test: body; test = cond``: the condition block is emitted
        twice, before the loop and at the end of its body, storing the test in a flag."""
        flag = self.kb.alloc_local(self.name("go"), (1,), "int8")

        def test() -> None:
            self.body(stmt.cond)
            self.kb.store(flag, [0], tirx.Cast("int8", self.at(stmt.test, ())))

        self.while_depth += 1
        test()
        with self.kb.while_(flag[0] != tirx.const(0, "int8")):
            self.body(stmt.body)
            test()
        self.while_depth -= 1

    def body(self, stmts: Sequence[ir.Stmt]) -> None:
        segment = forwarding.plan(self.kernel, stmts)
        if segment is None:
            self._statements(stmts)
            return
        self._statements(stmts[:segment.first])
        part = list(enumerate(stmts[segment.first:segment.last + 1], segment.first))
        scalars = [s for _, s in part if s.result is not None and s.result.shape == ()]
        self._statements(scalars)
        rest = [(pos, s) for pos, s in part if s.result is None or s.result.shape != ()]
        inside = forwarding.inside(self, segment)
        # Regions that may run past their buffers' ends along the last axis are forwarded
        # with masked edges (which also covers blocks inside), else under the plain test.
        edges = None if inside is True else forwarding.masked_edges(self, self.kernel,
                                                                    segment)
        test = inside if edges is None else edges.cond
        with contextlib.ExitStack() as branch:
            if test is not True:
                branch.enter_context(self.kb.if_(test))
            self.forwards = {f.fragment: f for f in segment.forwards}
            if edges is not None:
                forwarding.fill_edges(self, segment, edges)
            self.edges = edges
            forwarded = [s for pos, s in rest if pos not in segment.skip]
            n_rows = rows.rows(forwarded)
            if n_rows is None:
                self._statements(forwarded)
            else:
                with self.kb.loop(self.name("row"), n_rows) as r:
                    self._rows(segment, forwarded, n_rows, r)
            self.edges = None
            if edges is not None:
                forwarding.flush_edges(self, segment, edges)
            self.forwards = {}
        if test is not True:
            with self.kb.else_():
                self._statements([s for _, s in rest])
        self.body(stmts[segment.last + 1:])

    def _statements(self, stmts: Sequence[ir.Stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, ir.Op):
                self.op(stmt)
            elif isinstance(stmt, ir.For):
                start = self.scalar(stmt.start)
                extent = stmt.extent if isinstance(stmt.extent, int) else \
                    tirx.max(self.scalars[stmt.extent.id], tirx.const(0, "int32"))
                kind = "unrolled" if stmt.kind == "unrolled" else "serial"
                with self.kb.loop(self.name("k"), extent, start=start, kind=kind) as var:
                    self.scalars[stmt.var.id] = var
                    self.body(stmt.body)
            elif isinstance(stmt, ir.While):
                self.while_loop(stmt)
            else:
                with self.kb.if_(self.scalars[stmt.cond.id]):
                    self.body(stmt.then)
                if stmt.otherwise:
                    with self.kb.else_():
                        self.body(stmt.otherwise)

    def scalar(self, s: int | ir.Value) -> Expr:
        return tirx.const(s, "int32") if isinstance(s, int) else self.scalars[s.id]

    def op(self, op: ir.Op) -> None:
        statement = STATEMENTS.get(op.kind)
        if op.notes.get("inline"):
            self.inline[op.result.id] = op
        elif statement is not None:
            statement(self, op)
        elif ELEMENTS.get(op.kind) is None:
            raise kernel_error(self.kernel.name, f"{op.kind} is not lowered for the CPU",
                               op.line)
        elif op.result.shape == ():
            value = self.expr(op, ())
            self.scalars[op.result.id] = (value if op.kind == "const"
                                          else self.kb.let(self.name("s"), value))
        else:
            arr = self.value_array(op.result)
            for idx in self.value_nests(op.result.shape):
                self.kb.store(arr, self.array_index(arr, idx), self.expr(op, idx))

    @lowers("store")
    def store(self, op: ir.Op) -> None:
        value, dst = op.operands[0], op.attrs["dst"]
        buf = self.bufs[dst.buffer]
        forwarded = self.forwards.get(dst.buffer)
        # A forwarded store drops what lies past the end of its region (masked edges).
        for idx in self.value_nests(value.shape, past=forwarded is None):
            coords = self.element(dst, idx, clamp=True)
            v = ew.convert(self.at(value, idx), ew.name(value.dtype), self.dtype(buf),
                           self.bind)
            if forwarded is not None:
                forwarding.store(self, forwarded, idx, v)
            else:
                self.kb.store(buf, coords, v)

    def snapshot(self, region: ir.Region, transpose: bool = False) -> str:
        """A fresh local copy of a 2-D tile of an on-chip buffer (transposed if asked), for
        ops that read what they write, want another layout, or work on whole buffers."""
        src = self.bufs[region.buffer]
        shape = list(region.shape)
        if transpose:
            shape = shape[::-1]
        copy_name = self.name(f"{region.buffer}_copy")
        self.bufs[copy_name] = self.alloc_like(copy_name, shape, src)
        self.scopes[copy_name] = "local"
        with self.nest(shape) as idx:
            at = self.element(region, idx[::-1] if transpose else idx, clamp=True)
            self.kb.store(self.bufs[copy_name], idx, src[tuple(at)])
        return copy_name

    def write_back(self, name: str, region: ir.Region) -> None:
        """Store the whole local tile ``name`` into ``region``."""
        dst = self.bufs[region.buffer]
        with self.nest(region.shape) as idx:
            self.kb.store(dst, self.element(region, idx, clamp=True),
                          self.bufs[name][tuple(idx)])

    def relayout(self, op: ir.Op, role: str) -> copy_reuse.Relayout | None:
        """Where gemm ``op`` keeps its re-laid operand ``role`` between blocks
        (:meth:`.copy_reuse.Shared.relayout`), or None."""
        return self._shared.relayout(op, role)

    @lowers("gemm")
    def gemm(self, op: ir.Op) -> None:
        lower_gemm(self, op, lanes=self.target.caps.vector_bits // 32)

    def run(self) -> tirx.PrimFunc:
        grouping = block_groups.plan(self.kernel)
        if grouping is not None:
            self._grouped(grouping)
            return self.kb.finish()
        reuse = copy_reuse.plan(self.kernel, self.gemm_sources)
        order = None
        if reuse is not None:
            order = [reuse.fastest] + [a for a in range(len(self.kernel.grid))
                                       if a != reuse.fastest]
            self._shared = copy_reuse.Shared(self, self.kernel, reuse)
        with self.kb.block_loop() as blk:
            self._decode(blk, order=order)
            self.body(self.kernel.body)
        return self.kb.finish()

    @lowers("copy")
    def copy(self, op: ir.Op) -> None:
        if op.attrs["dst"].buffer not in self.gemm_sources:
            self._shared.copy(self, op)

    def _decode(self, blk: Expr, offset: Expr | int = 0,
                order: Sequence[int] | None = None) -> None:
        """Bind the block indices of block ``blk``, with ``offset`` added to index 0; the
        axes vary in ``order``, fastest first (default: axis 0 fastest)."""
        order = list(range(len(self.kernel.grid))) if order is None else list(order)
        extents = {a: self.size(self.kernel.grid[a], "int64") for a in order}
        strides = {a: math.prod([extents[b] for b in order[:pos]], start=1)
                   for pos, a in enumerate(order)}
        # Decoded slowest axis first, by truncating division (the operands are not
        # negative): TVM 0.27's LowerIntrin fails on a floordiv by a dynamic extent
        # here ("Let cannot bind the same var to two different values").
        rest = blk
        coords = {}
        for pos in reversed(range(len(order))):
            axis = order[pos]
            stride = strides[axis]
            coords[axis] = rest if _is_one(stride) else tirx.truncdiv(rest, stride)
            if pos:
                rest = self.kb.let(self.name("r"), rest - coords[axis] * stride)
        for axis, v in enumerate(self.kernel.block_indices):
            coord = tirx.Cast("int32", coords[axis])
            self.scalars[v.id] = self.kb.let(self.name("b"), coord + offset if axis == 0
                                             else coord)

    def _grouped(self, grouping: block_groups.Grouping) -> None:
        """The blocks of this call in groups of ``grouping.size`` run row by row together
        (:mod:`.block_groups`), and the blocks outside whole groups one by one."""
        g = grouping.size
        kb, body = self.kb, self.kernel.body
        first = (kb.block_begin + (g - 1)) // g   # the whole groups in [begin, end)
        last = tirx.max(kb.block_end // g, first)
        with kb.block_loop() as blk:
            with kb.if_(tirx.Or(blk < first * g, blk >= last * g)):
                self._decode(blk)
                self.body(body)
        segment, scalars, forwarded = grouping.segment, grouping.scalars, grouping.forwarded
        with kb.loop(self.name("group"), last - first, start=first) as grp:
            # Block starts move right with index 0, so a group is inside its buffers when
            # its first and last blocks are.
            ends = []
            for q in (0, g - 1):
                self._decode(grp * g, q)
                self._statements(scalars)
                ends.append(forwarding.inside(self, segment))
            with contextlib.ExitStack() as branch:
                inside = copies.all_of(ends)
                if inside is not True:
                    branch.enter_context(kb.if_(inside))
                with kb.loop(self.name("row"), grouping.rows) as r, \
                        kb.loop(self.name("q"), g) as q:
                    self._decode(grp * g, q)
                    self._statements(scalars)
                    self._rows(segment, forwarded, grouping.rows, r)
            if inside is not True:
                with kb.else_(), kb.loop(self.name("q"), g) as q:
                    self._decode(grp * g, q)
                    self.body(body)

    def _rows(self, segment: forwarding.Segment, forwarded: Sequence[ir.Stmt], n_rows: int,
              r: Expr) -> None:
        """Row ``r`` of the forwarded statements of ``segment``."""
        self.forwards = {f.fragment: f for f in segment.forwards}
        inside_ids = {id(st) for st in forwarded}
        self._row_local = {
            st.result.id for st in forwarded if st.result is not None
            and len(st.result.shape) >= 1 and not st.notes.get("inline")
            and all(id(u) in inside_ids for u in self._users.get(st.result.id, []))}
        self._row = (n_rows, r)
        self._statements(forwarded)
        self._row = None
        self.forwards = {}


@element("const")
def _const(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    return ew.const(op.attrs["value"], ew.name(op.result.dtype))


@element("iota")
def _iota(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    return tirx.Cast(ew.tvm_dtype(op.result.dtype), idx[op.attrs["dimension"]])


@element("size")
def _size(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    return tirx.Cast(ew.tvm_dtype(op.result.dtype), lw.size(op.attrs["expr"]))


@element("elementwise")
def _elementwise(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    args = [lw.at(v, _operand_index(v, idx)) for v in op.operands]
    in_dtype = ew.tvm_dtype(op.operands[0].dtype)
    if op.attrs["fn"] in _BINDS_OPERANDS and any(map(tir_emit.involves_bfloat16, args)):
        # These expand into TIR Let expressions, which TVM miscompiles when the bound value
        # involves bfloat16: compute in float32 from operands bound through a store
        # (KernelBuilder.let).
        args = [lw.kb.let(lw.name("h"), tirx.Cast("float32", a)) for a in args]
        in_dtype = "float32"
    return ew.elementwise(op.attrs["fn"], args, in_dtype, ew.tvm_dtype(op.result.dtype),
                          lw.bind)


@element("convert")
def _convert(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    src = op.operands[0]
    return ew.convert(lw.at(src, idx), ew.name(src.dtype), ew.name(op.result.dtype), lw.bind)


@element("select")
def _select(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    pred, on_false, on_true = (lw.at(v, _operand_index(v, idx)) for v in op.operands)
    return tirx.Select(pred, on_true, on_false)


@element("broadcast")
def _broadcast(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    src = op.operands[0]
    sub = [idx[d] if n == op.result.shape[d] else tirx.const(0, "int32")
           for d, n in zip(op.attrs["dims"], src.shape)]
    return lw.at(src, sub)


@element("transpose")
def _transpose(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    sub = [None] * len(idx)
    for i, p in enumerate(op.attrs["perm"]):
        sub[p] = idx[i]
    return lw.at(op.operands[0], sub)


@element("reshape")
def _reshape(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    return lw.at(op.operands[0], _reindex(idx, op.result.shape, op.operands[0].shape))


@element("rev")
def _rev(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    dims = op.attrs["dims"]
    return lw.at(op.operands[0], [n - 1 - e if d in dims else e
                                  for d, (n, e) in enumerate(zip(op.result.shape, idx))])


@element("slice")
def _slice(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    return lw.at(op.operands[0], [s + e * t for s, t, e in zip(
        op.attrs["start"], op.attrs["stride"], idx)])


@element("concatenate")
def _concatenate(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    """Every operand is read at an index clamped into it (so no read leaves its array),
    and the one that holds ``idx`` selected."""
    d = op.attrs["dimension"]
    value, offset = None, 0
    for v in op.operands:
        n = v.shape[d]
        at = list(idx)
        at[d] = tirx.max(tirx.min(idx[d] - offset, tirx.const(n - 1, "int32")),
                         tirx.const(0, "int32"))
        x = lw.at(v, at)
        value = x if value is None else tirx.Select(idx[d] < offset, value, x)
        offset += n
    return value


@element("load")
def _load(lw: _Lowering, op: ir.Op, idx: Sequence[Expr]) -> Expr:
    src = op.attrs["src"]
    if src.buffer in lw.forwards and lw.forwards[src.buffer].src is not None:
        return forwarding.load(lw, lw.forwards[src.buffer], idx)
    coords = lw.element(src, idx, clamp=True)
    if lw.while_depth and op.result.shape == () and src.buffer in lw.written_globals:
        return polled_load(lw.bufs[src.buffer], coords)
    return lw.bufs[src.buffer][tuple(coords)]


def _is_one(v: int | Expr) -> bool:
    return isinstance(v, int) and v == 1


def _size_ops(dtype: str) -> dict[str, Any]:
    """Size-expression operators on TIR expressions of ``dtype`` (see :func:`..sizes.fold`)."""
    def c(v: int | Expr) -> Expr:
        return tirx.const(v, dtype) if isinstance(v, int) else v
    return {
        "+": lambda a, b: c(a) + c(b), "-": lambda a, b: c(a) - c(b),
        "*": lambda a, b: c(a) * c(b), "neg": lambda a: -c(a),
        "floordiv": lambda a, b: tirx.floordiv(c(a), c(b)),
        "mod": lambda a, b: tirx.floormod(c(a), c(b)),
        "max": lambda a, b: tirx.max(c(a), c(b)), "min": lambda a, b: tirx.min(c(a), c(b)),
    }


def _operand_index(v: ir.Value, idx: Sequence[Expr]) -> list[Expr]:
    """An elementwise operand's index: scalars have none, and dimensions of size 1 are
    broadcast (JAX allows ``(4, 1) - (4, 8)`` in jaxprs)."""
    if v.shape == ():
        return []
    return [tirx.const(0, "int32") if n == 1 else e for n, e in zip(v.shape, idx)]


def _reindex(idx: Sequence[Expr], shape: Sequence[int], target: Sequence[int]) -> list[Expr]:
    """Map an index of ``shape`` to the same element (row-major) of ``target``."""
    if [d for d in shape if d != 1] == [d for d in target if d != 1]:
        kept = iter(e for e, d in zip(idx, shape) if d != 1)
        return [next(kept) if d != 1 else tirx.const(0, "int32") for d in target]
    flat: Expr = tirx.const(0, "int32")
    for e, d in zip(idx, shape):
        flat = flat * d + e
    out = []
    for d in reversed(target):
        out.append(tirx.floormod(flat, d))
        flat = tirx.floordiv(flat, d)
    return out[::-1]


def to_tir(kernel: ir.Kernel, target: Target) -> tirx.PrimFunc:
    """The TIR function of a kernel that went through the CPU's pass pipeline (see
    :mod:`..pipelines`), for a CPU ``target`` (see the module docstring). Raises
    KernelError if it needs more than :data:`MAX_SCRATCH_BYTES`."""
    lowering = _Lowering(kernel, target)
    func = lowering.run()
    _check_scratch(kernel, lowering.kb.scratch_bytes)
    return func


def _check_scratch(kernel: ir.Kernel, nbytes: int) -> None:
    if nbytes <= MAX_SCRATCH_BYTES:
        return
    scratch = [b for b in kernel.buffers if b.role == "scratch"]
    biggest = max(scratch, key=lambda b: b.dtype.itemsize * math.prod(b.shape), default=None)
    detail = ""
    if biggest is not None:
        size = biggest.dtype.itemsize * math.prod(biggest.shape)
        detail = (f"; the largest on-chip buffer, {biggest.scope} {biggest.name} "
                  f"{list(biggest.shape)} {biggest.dtype}, takes {_bytes(size)}")
    raise kernel_error(kernel.name, f"needs {_bytes(nbytes)} of scratch memory (on-chip "
                       f"buffers and tile values) per call, more than the "
                       f"{_bytes(MAX_SCRATCH_BYTES)} a CPU kernel may use{detail}; use "
                       "smaller tiles", biggest.line if biggest is not None else None)


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def source(kernel: ir.Kernel, target: Target) -> str:
    """The generated TIR as TVMScript text, for inspection."""
    return to_tir(kernel, target).script()


@dataclasses.dataclass(frozen=True)
class CompiledCpu:
    """A kernel compiled for the CPU, as :func:`compile_to_library` returns it."""

    library: bytes
    """A relocatable object (kind :data:`cache.CPU_OBJECT`) or a shared library
    (:data:`cache.CPU_SHARED_LIBRARY`)."""
    symbol: str
    """The exported symbol of its entry point."""
    num_blocks: int
    """Its grid's blocks; 1 for a grid computed from the shapes (``Entry.launched_with``
    sets one per size when it is loaded)."""
    signature: str
    """The buffers it was compiled for (:func:`entry_signature`)."""
    kind: str = cache.CPU_OBJECT
    """The cache's name for what :attr:`library` holds."""

    def store(self, key: str) -> cache.Entry:
        """Put the library into the build cache under ``key``."""
        return cache.store(key, self.library, self.symbol, self.num_blocks,
                           signature=self.signature, kind=self.kind)


def compile_to_library(kernel: ir.Kernel, target: Target) -> CompiledCpu:
    """Compile a kernel for the CPU ``target`` describes (the host, or an ISA level, which
    is also LLVM's name for the generic CPU of that level) into a relocatable object, which
    the FFI links in process, or, where it cannot (``_ffi.CPU_LINKS_OBJECTS`` is false: not
    x86-64), a shared library linked with ``ld``.

    The library has no entry assertions (``tir_emit.build(checks=False)``): they cost a
    sixth of the compile time, and the FFI handler checks every call against the
    signature instead (``ffi/cpu/signature.h``)."""
    level = target.caps.level
    cpu = tir_emit.host_cpu() if level == "host" else level
    module = bf16_dot.resolve(tir_emit.build(to_tir(kernel, target), cpu, checks=False))
    from jaxtile import _ffi

    if _ffi.CPU_LINKS_OBJECTS:
        data, kind = tir_emit.object_code(module), cache.CPU_OBJECT
    else:
        with tempfile.TemporaryDirectory(prefix="jaxtile-build-") as tmp:
            path = os.path.join(tmp, "kernel.so")
            tir_emit.export(module, path)
            with open(path, "rb") as f:
                data, kind = f.read(), cache.CPU_SHARED_LIBRARY
    blocks = kernel.num_blocks if sizes.is_static(kernel.grid) else 1
    return CompiledCpu(data, tir_emit.ffi_symbol(symbol_name(kernel)), blocks,
                       entry_signature(kernel), kind)


def entry_signature(kernel: ir.Kernel) -> str:
    """The buffers a kernel's library expects, operands then results, as the FFI handler
    reads them (``ffi/cpu/signature.h``): ``x:float32[?,128];out:float32[dim0_0,128]``.
    A dynamic size's first plain occurrence is ``?`` (the entry binds the size from that
    dimension, as :meth:`_Lowering.size` arranges); every other dimension that involves
    dynamic sizes is their expression over those dimensions (``dim<i>_<j>``), which the
    handler checks the call against."""
    params = kernel.params
    where: dict[str, str] = {}
    for i, b in enumerate(params):
        for j, d in enumerate(b.shape):
            if isinstance(d, str) and sizes.parse(d)[0] == "sym":
                where.setdefault(d, f"dim{i}_{j}")

    def dim(i: int, j: int, d: sizes.Size) -> str:
        if isinstance(d, int):
            return str(d)
        if where.get(d) == f"dim{i}_{j}" or not sizes.symbols(d) <= where.keys():
            # The binding occurrence, or sizes the entry binds from no dimension (which the
            # kernel then cannot use): nothing to compare with.
            return "?"
        return str(sizes.fold(d, where.__getitem__, _SIZE_TEXT))

    return ";".join(
        f"{re.sub(r'[^A-Za-z0-9_]', '_', b.name)}:{b.dtype.name}"
        f"[{','.join(dim(i, j, d) for j, d in enumerate(b.shape))}]"
        for i, b in enumerate(params))


_SIZE_TEXT = {
    "+": lambda a, b: f"({a}+{b})", "-": lambda a, b: f"({a}-{b})",
    "*": lambda a, b: f"({a}*{b})", "neg": lambda a: f"(-{a})",
    "floordiv": lambda a, b: f"floordiv({a},{b})", "mod": lambda a, b: f"mod({a},{b})",
    "max": lambda a, b: f"max({a},{b})", "min": lambda a, b: f"min({a},{b})",
}
"""Size operators as the text of ``ffi/common/launch_spec.h``'s expression grammar."""
