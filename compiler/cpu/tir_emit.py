"""Build, compile and export TVM TIR kernels for jaxtile's CPU backend.

The CPU lowering builds one ``PrimFunc`` per kernel with :class:`KernelBuilder` (TIR AST
nodes, no TVMScript text), compiles it with :func:`build` and emits a relocatable object with
:func:`object_code`, which jaxtile's FFI links in process (``ffi/cpu/elf_object.h``), or a
shared object with :func:`export` where it cannot (both after :func:`reload_ir`, which leaves
out the debug info TVM emits).
Everything here was checked against apache-tvm 0.27 (``tvm.tirx``) with its
LLVM backend.

Kernel ABI
----------
Parameters are ``block_begin: int64, block_end: int64`` followed by the buffers, in order
(a builder given the grid's ``blocks`` clamps them to ``[0, blocks)``).
The object (and the shared object) defines the tvm-ffi packed function ``__tvm_ffi_<name>`` (see
:func:`ffi_symbol`; a weak alias ``__tvm_ffi_main`` is emitted too) with the C signature
``int (void* self, const TVMFFIAny* args, int num_args, TVMFFIAny* result)``. Buffers are
passed as DLTensors on the CPU with exactly the declared shape and dtype, compact row-major
strides and ``byte_offset == 0``; with ``checks=True`` all of this is verified at entry and a
mismatch returns -1 with an error raised through ``TVMFFIErrorSetRaisedFromCStrParts``.
jaxtile's kernels are built with ``checks=False`` (the FFI handler checks each call against
the kernel's signature instead: ``ffi/cpu/signature.h``); the entry still binds dynamic
sizes from the shapes. That
is the only symbol the object needs from TVM (it lives in ``libtvm_ffi.so``); kernels built
here never call the TVM runtime otherwise (no workspace allocation, no thread pool), so the
object also runs when loaded with ``tvm_ffi.load_module`` alone.

Data pointers are only assumed aligned to ``data_alignment`` bytes (default 16; emitted as
``llvm.assume`` alignment, never checked). TVM's own default of 64 makes LLVM use aligned
vector moves that fault on data that is only 16-byte aligned. All buffer accesses share one
TBAA tag and no pointer is ``noalias``, so buffers may alias, but a vectorised loop loads a
whole vector before storing it: partially overlapping input/output buffers are unsupported.

Partial tiles
-------------
In a ``"vectorized"`` loop every load becomes a full-width vector load, also under a
``tirx.Select`` (so a select does not prevent out-of-bounds reads), while ``if`` statements
and ``tirx.if_then_else`` make TVM scalarise the loop. Branch once per tile instead:
``with kb.if_(<tile entirely in bounds>)`` a vectorised loop, ``with kb.else_()`` a serial
loop using ``tirx.if_then_else(in_bounds, load, pad)`` (the load is only evaluated when in
bounds) or an ``if_`` around the store.

Expressions
-----------
Use ``tvm.tirx`` directly for expressions: ``buf[i, j]`` loads, Python operators,
``tirx.Cast``, ``tirx.Select``, comparisons, ``tirx.floordiv``/``tirx.floormod`` (integer
operands only), ``tirx.log/sqrt/abs/pow/floor`` (``log``, ``pow`` and ``tirx.exp`` become one
scalar libm call per lane). :mod:`.vector_math` covers the cases where the plain TVM op is
wrong or slow. The Python operators fold constants as if floats were real numbers
(``x * 0.0`` -> ``0.0``), so float arithmetic that must stay IEEE-exact is built from node
constructors (``tirx.Mul``); TVM's simplifier, which does the same for ``x - x`` and more, is
not in the pipeline.

bfloat16
--------
bfloat16 buffers and casts work in stores, but TVM 0.27 miscompiles any ``Bind``/``Let``
whose value involves bfloat16 and folds ``Cast("float32", Cast("bfloat16", x))`` to ``x``.
:meth:`KernelBuilder.let` works around the first (and :func:`build` rejects such bindings
made any other way); use :func:`.vector_math.round_to_bfloat16` for the second.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import Expr, PrimType
from tvm.sym import Analyzer
from tvm.tirx.layout import S, TileLayout

from jaxtile.compiler.cpu import tir_passes

ExprLike = Expr | int | float | bool

_LOOP_KINDS = {
    "serial": tirx.ForKind.SERIAL,
    "vectorized": tirx.ForKind.VECTORIZED,
    "unrolled": tirx.ForKind.UNROLLED,
}

# Keeps an allocation out of LowerTVMBuiltin, which would otherwise turn every allocation of
# 1 KiB or more (and any in "local" scope) into TVMBackendAllocWorkspace/FreeWorkspace calls,
# made where the allocation sits (per iteration inside a loop) through function pointers
# that only the TVM runtime's loader fills in. With it the array is one fixed-size alloca in
# the entry block.
_STACK_ALLOCATION = {"disable_lower_builtin": tirx.IntImm("bool", 1)}

#: Local arrays share this much stack per call, smallest first; the rest go to the heap
#: (TVMBackendAllocWorkspace, whose slot jaxtile's loader fills with an aligned malloc), once
#: per call. The threads a kernel runs on (XLA's, the FFI pool's, the caller's) may have
#: small stacks, and the budget is per call whatever the number of arrays.
MAX_STACK_BYTES = 256 * 1024


def host_cpu() -> str:
    """Return LLVM's name for the host CPU, e.g. ``"znver4"``.

    Pass it to :func:`build`: ``mcpu="native"`` is not understood by TVM and silently yields
    generic x86-64 code.
    """
    return str(tvm.get_global_func("target.llvm_get_system_cpu")())


def ffi_symbol(name: str) -> str:
    """Return the exported symbol of the packed function for kernel ``name``."""
    return f"__tvm_ffi_{name}"


def dtype_of(value: Expr) -> str:
    """Return the dtype string of a TIR expression (``Expr`` has no ``.dtype`` in TVM 0.27)."""
    return str(value.ty.dtype)


def as_expr(value: ExprLike, dtype: str) -> Expr:
    """Turn a Python scalar into a constant of ``dtype``; pass expressions through."""
    return value if isinstance(value, Expr) else tirx.const(value, dtype)


def _as_index(value: ExprLike, dtype: str) -> Expr:
    """An integer constant or expression of exactly ``dtype``."""
    value = as_expr(value, dtype)
    return value if dtype_of(value) == dtype else tirx.Cast(dtype, value)


def _decl_buffer(name: str, shape: Sequence[int], dtype: str, alignment: int) -> tirx.Buffer:
    """A compact row-major buffer; the explicit layout makes 0-d buffers work."""
    shape = tuple(shape)
    return tirx.decl_buffer(
        shape, dtype, name, data_alignment=alignment, layout=TileLayout(S[shape])
    )


def _index_dtype(*values: ExprLike) -> str:
    """The integer dtype wide enough for all ``values`` (int32 unless an int64 expr is given)."""
    wide = any(isinstance(v, Expr) and dtype_of(v) == "int64" for v in values)
    return "int64" if wide else "int32"


_NODE_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(cls: type) -> tuple[str, ...]:
    """The reflected fields of a node class that may hold nodes (not its type or span),
    looked up once per class: the walk below visits every node of a kernel."""
    names = _NODE_FIELDS.get(cls)
    if names is None:
        found, info = [], cls.__tvm_ffi_type_info__
        while info is not None:
            found += [f.name for f in info.fields if f.name not in ("ty", "span")]
            info = info.parent_type_info
        names = _NODE_FIELDS[cls] = tuple(found)
    return names


_NODE, _SEQUENCE, _OTHER = 0, 1, 2
_KINDS: dict[type, int] = {}


def _kind(cls: type) -> int:
    """Whether a field's value of class ``cls`` is a node, a sequence or neither (the
    ``isinstance`` tests go through ABC checks, so they are made once per class)."""
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = (_NODE if issubclass(cls, tirx.Stmt | Expr) else
                              _SEQUENCE if issubclass(cls, list | tuple | tvm_ffi.Array)
                              else _OTHER)
    return kind


def _nodes(root: tirx.Stmt | Expr) -> Iterator[tirx.Stmt | Expr]:
    """All statement and expression nodes under ``root`` (found through FFI reflection)."""
    pending = [root]
    while pending:
        node = pending.pop()
        yield node
        for name in _fields(type(node)):
            value = getattr(node, name)
            kind = _kind(type(value))
            if kind == _NODE:
                pending.append(value)
            elif kind == _SEQUENCE:
                pending.extend(v for v in value if _kind(type(v)) == _NODE)


def involves_bfloat16(value: Expr) -> bool:
    """Whether any part of ``value`` (a load, cast, constant, variable) is bfloat16."""
    return any(
        isinstance(node, Expr)
        and isinstance(node.ty, PrimType)
        and str(node.ty.dtype) == "bfloat16"
        for node in _nodes(value)
    )


_INTEGER_NODES = (
    tirx.IntImm, tirx.Var, tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv,
    tirx.FloorMod, tirx.Min, tirx.Max, tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE,
    tirx.And, tirx.Or, tirx.Not, tirx.Cast,
)


def _decidable(value: ExprLike) -> bool:
    """Whether ``value`` is integer arithmetic on variables and constants alone: what the
    analyzer of :meth:`KernelBuilder.if_` may reason about. A load is excluded because
    memory changes between two reads the analyzer would take as equal; calls, because
    they may read memory or have effects."""
    if isinstance(value, int):
        return True
    if not isinstance(value, Expr):
        return False
    for node in _nodes(value):
        if type(node) not in _INTEGER_NODES:
            return False
        dtype = dtype_of(node)
        if not (dtype.startswith(("int", "uint")) or dtype == "bool"):
            return False
    return True


def _check_bindings(func: tirx.PrimFunc) -> None:
    """Reject bindings that TVM 0.27 miscompiles.

    Its bfloat16 legalisation passes do not visit the values of ``Bind`` statements and
    ``Let`` expressions: a bfloat16 load there reads garbage (parameters) or an undefined
    variable (local arrays), and a bfloat16 cast there fails to compile.
    """
    binds: dict[type, bool] = {}
    for node in _nodes(func.body):
        cls = type(node)
        is_binding = binds.get(cls)
        if is_binding is None:
            is_binding = binds[cls] = issubclass(cls, tirx.Bind | tirx.Let)
        if is_binding and involves_bfloat16(node.value):
            raise ValueError(
                f"binding of {node.var} involves bfloat16, which TVM miscompiles; "
                "bind such values with KernelBuilder.let"
            )


class KernelBuilder:
    """Incrementally build a jaxtile CPU kernel as a TIR ``PrimFunc``.

    Statements are appended at the current insertion point; ``with`` blocks
    (:meth:`loop`, :meth:`block_loop`, :meth:`if_`, :meth:`else_`) open nested bodies::

        kb = KernelBuilder("add", [("x", (n,), "float32"), ("y", (n,), "float32")])
        x, y = kb.buffers
        with kb.block_loop() as b:
            with kb.loop("i", 64, kind="vectorized") as i:
                kb.store(y, [b * 64 + i], x[b * 64 + i] + 1.0)
        func = kb.finish()

    Every loop variable and :meth:`let` variable is a fresh ``tirx.Var``; TIR requires each
    variable to be defined once, so never reuse one for a second loop.
    """

    def __init__(
        self,
        name: str,
        buffers: Sequence[tuple[str, Sequence[int], str]],
        *,
        data_alignment: int = 16,
        blocks: int | None = None,
    ) -> None:
        """Declare the kernel signature.

        Args:
            name: kernel name; becomes the global symbol (see :func:`ffi_symbol`).
            buffers: ``(name, shape, dtype)`` per buffer parameter, e.g.
                ``("x", (128, 64), "bfloat16")``; ``shape == ()`` declares a 0-d buffer.
            data_alignment: alignment in bytes the generated code may assume for every
                buffer's data pointer.
            blocks: the grid's number of blocks, where it is static: the kernel then clamps
                ``[block_begin, block_end)`` to ``[0, blocks)``, and :meth:`if_` decides
                from it (and from the loops' ranges and the bindings made with :meth:`let`)
                the conditions it can, emitting only the branch taken (see :meth:`if_`).
        """
        if not name.isidentifier():
            raise ValueError(f"kernel name {name!r} is not a valid C identifier")
        self.name = name
        self.block_begin = tirx.Var("block_begin", "int64")
        self.block_end = tirx.Var("block_end", "int64")
        self.buffers = [
            _decl_buffer(bname, shape, dtype, data_alignment) for bname, shape, dtype in buffers
        ]
        self._allocations: list[tuple[int, tirx.Buffer]] = []
        self._stack: list[list[tirx.Stmt]] = [[]]
        self._vector_loops: list[tuple[tirx.Var, int]] = []
        # What the conditions of if_ may be decided from: loop ranges, pure integer lets, the
        # block range. Only ever asked to decide integer conditions, never to rewrite.
        self._facts = Analyzer()
        self._folded: tuple[int, int, bool] | None = None
        self._params = (self.block_begin, self.block_end)
        self._blocks = blocks
        if blocks is not None:
            # The FFI launches [0, blocks) in chunks; clamping makes what the conditions are
            # decided from true of any call, so a folded guard can never be out of bounds.
            top = tirx.const(blocks, "int64")
            zero = tirx.const(0, "int64")
            self.block_begin = self._clamped("begin", self.block_begin, zero, top)
            self.block_end = self._clamped("end", self.block_end, zero, top)

    def alloc_local(self, name: str, shape: Sequence[int], dtype: str) -> tirx.Buffer:
        """Declare a local array, allocated once at function entry: on the stack while the
        arrays fit in :data:`MAX_STACK_BYTES` together (smallest first), on the heap beyond.

        The array lives for the whole call and is uninitialised. A one-element array is the
        way to get a mutable scalar; LLVM keeps it in a register.
        """
        # The LLVM codegen gives stack arrays 16-byte alignment whatever is declared (and
        # only assumes that much), so declare what is actually provided.
        buf = _decl_buffer(name, shape, dtype, 16)
        nbytes = math.prod(shape) * max(1, tvm.runtime.DataType(dtype).bits // 8)
        self._allocations.append((nbytes, buf))
        return buf

    @property
    def scratch_bytes(self) -> int:
        """Bytes of local arrays declared so far (stack and heap): one call's scratch."""
        return sum(nbytes for nbytes, _ in self._allocations)

    def emit(self, stmt: tirx.Stmt) -> None:
        """Append an arbitrary TIR statement at the insertion point."""
        self._stack[-1].append(stmt)

    def store(self, buf: tirx.Buffer, indices: Sequence[ExprLike], value: ExprLike) -> None:
        """Append ``buf[indices] = value``; a Python scalar ``value`` takes ``buf``'s dtype."""
        self.emit(tirx.BufferStore(buf, as_expr(value, buf.dtype), list(indices)))

    def let(self, name: str, value: Expr, *, through_memory: bool = False) -> Expr:
        """Evaluate ``value`` once, here; return an expression for it that is valid in the rest
        of the current body.

        Normally that is a new variable bound by a ``Bind`` statement. TVM miscompiles
        bindings that involve bfloat16 (see :func:`build`) and cannot vectorise a binding
        whose value holds ``Let`` expressions, so such a value is stored to a
        fresh local array instead (one element per lane of the enclosing vectorised loops),
        and a load of it is returned; LLVM keeps it in registers all the same. So is any
        value with ``through_memory``.
        """
        dtype = dtype_of(value)
        # TVM's vectorizer also rejects a Bind whose value holds Let expressions (it binds
        # their variables twice), so those go through a store as well. Integer arithmetic
        # alone (most bindings: indices, tile starts) has neither, found in one walk.
        decidable = _decidable(value)
        if not through_memory and (decidable or (not involves_bfloat16(value) and not any(
                isinstance(node, tirx.Let) for node in _nodes(value)))):
            var = tirx.Var(name, dtype)
            self.emit(tirx.Bind(var, value))
            if decidable:
                self._facts.bind(var, value)
            return var
        shape = tuple(extent for _, extent in self._vector_loops) or (1,)
        indices = [var for var, _ in self._vector_loops] or [0]
        scratch = self.alloc_local(name, shape, dtype)
        self.store(scratch, indices, value)
        return scratch[tuple(indices)]

    def _clamped(self, name: str, value: Expr, low: Expr, high: Expr) -> tirx.Var:
        """``value`` clamped to ``[low, high]`` as a new variable the analyzer knows the
        range of."""
        var = tirx.Var(name, dtype_of(value))
        self.emit(tirx.Bind(var, tirx.min(tirx.max(value, low), high)))
        self._facts.bind(var, tvm.ir.Range(low, high + 1))
        return var

    @contextlib.contextmanager
    def loop(
        self, name: str, extent: ExprLike, *, start: ExprLike = 0, kind: str = "serial",
        within: tuple[int, int] | None = None,
    ) -> Iterator[tirx.Var]:
        """Open ``for name in range(start, start + extent)``; yields the loop variable.

        ``kind`` is ``"serial"``, ``"vectorized"`` or ``"unrolled"``; the last two need a
        constant ``extent``. A vectorised body must be straight-line code (stores, lets):
        TVM scalarises ``if`` statements and ``tirx.if_then_else`` in it and makes every
        load full-width even under a ``tirx.Select`` (see "Partial tiles" in the module
        docs). The variable is int64 if ``start`` or ``extent`` is an int64 expression, else
        int32. ``within`` is a ``[low, high)`` known to hold the variable's values where its
        bounds alone do not tell (:meth:`if_` decides from it).
        """
        if kind not in _LOOP_KINDS:
            raise ValueError(f"unknown loop kind {kind!r}; expected one of {list(_LOOP_KINDS)}")
        if kind != "serial" and not isinstance(extent, int):
            raise ValueError(f"a {kind} loop needs a constant int extent, got {extent!r}")
        dtype = _index_dtype(start, extent)
        var = tirx.Var(name, dtype)
        if within is not None:
            self._facts.bind(var, tvm.ir.Range(*within))
        elif _decidable(start) and _decidable(extent):
            self._facts.bind(var, tvm.ir.Range.from_min_extent(
                _as_index(start, dtype), _as_index(extent, dtype)))
        self._stack.append([])
        if kind == "vectorized":
            self._vector_loops.append((var, extent))
        yield var
        if kind == "vectorized":
            self._vector_loops.pop()
        body = self._pop_body()
        self.emit(
            tirx.For(
                var, _as_index(start, dtype), _as_index(extent, dtype), _LOOP_KINDS[kind], body
            )
        )

    @contextlib.contextmanager
    def block_loop(self, name: str = "block") -> Iterator[tirx.Var]:
        """Open the serial int64 loop over this call's blocks, ``[block_begin, block_end)``."""
        within = None if self._blocks is None else (0, self._blocks)
        with self.loop(name, self.block_end - self.block_begin, start=self.block_begin,
                       within=within) as b:
            yield b

    @contextlib.contextmanager
    def if_(self, cond: Expr) -> Iterator[None]:
        """Open ``if cond:``; may be followed directly by :meth:`else_`.

        A condition of integers alone (no loads, no calls) that the loops' ranges, the
        :meth:`let` bindings and the grid (``blocks``) decide is not emitted: its body is
        emitted bare when it holds, dropped when it cannot (and an :meth:`else_` after it
        likewise). A static shape that divides its tiles then leaves no masked edge path
        for TVM and LLVM to compile."""
        decided = self._decide(cond)
        self._stack.append([])
        yield
        body = self._pop_body()
        if decided is None:
            self.emit(tirx.IfThenElse(cond, body, None))
            self._folded = None
            return
        if decided:
            self.emit(body)
        self._folded = (id(self._stack[-1]), len(self._stack[-1]), decided)

    def _decide(self, cond: Expr) -> bool | None:
        """``True`` or ``False`` where the known facts decide ``cond``, else ``None``."""
        if not _decidable(cond):
            return None
        if self._facts.can_prove(cond):
            return True
        if self._facts.can_prove(tirx.Not(cond)):
            return False
        return None

    @contextlib.contextmanager
    def while_(self, cond: Expr) -> Iterator[None]:
        """Open ``while cond:`` (``cond`` is re-evaluated before every iteration)."""
        self._stack.append([])
        yield
        self.emit(tirx.While(cond, self._pop_body()))

    @contextlib.contextmanager
    def else_(self) -> Iterator[None]:
        """Open the ``else:`` of the ``if_`` block that was closed just before."""
        body = self._stack[-1]
        folded, self._folded = self._folded, None
        if folded is not None and folded[:2] == (id(body), len(body)):
            self._stack.append([])
            yield
            taken = self._pop_body()
            if not folded[2]:
                self.emit(taken)
            return
        last = body[-1] if body else None
        if not isinstance(last, tirx.IfThenElse) or last.else_case is not None:
            raise ValueError("else_() must directly follow an if_() block without else")
        body.pop()
        self._stack.append([])
        yield
        self.emit(tirx.IfThenElse(last.condition, last.then_case, self._pop_body()))

    def finish(self) -> tirx.PrimFunc:
        """Return the finished ``PrimFunc``; the builder must not be used afterwards."""
        if len(self._stack) != 1:
            raise ValueError("finish() called inside an open loop/if block")
        body = self._placed_allocations() + self._stack.pop()
        params = [*self._params, *self.buffers]
        attrs = tvm.ir.make_node("ir.DictAttrs", global_symbol=self.name)
        return tirx.PrimFunc(params, _seq(body), attrs=attrs)

    def _placed_allocations(self) -> list[tirx.Stmt]:
        """One allocation per local array: the smallest on the stack (where LLVM can keep
        them in registers) within the stack budget, the others on the heap."""
        stack_left = MAX_STACK_BYTES
        placed = []
        for nbytes, buf in sorted(self._allocations, key=lambda a: a[0]):
            on_stack = nbytes <= stack_left
            stack_left -= nbytes if on_stack else 0
            placed.append(tirx.AllocBuffer(buf, _STACK_ALLOCATION if on_stack else None))
        return placed

    def _pop_body(self) -> tirx.Stmt:
        return _seq(self._stack.pop())


def _seq(stmts: list[tirx.Stmt]) -> tirx.Stmt:
    """A statement list as one statement (a no-op if empty)."""
    if not stmts:
        return tirx.Evaluate(tirx.const(0, "int32"))
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def build(
    func: tirx.PrimFunc, cpu: str, *, opt_level: int = 2, checks: bool = True
) -> tvm.runtime.Module:
    """Compile ``func`` for the host with LLVM and return the (not yet exported) module.

    Args:
        func: a function from :meth:`KernelBuilder.finish`.
        cpu: LLVM CPU name, normally :func:`host_cpu`.
        opt_level: LLVM optimisation level 0-3 (TVM runs LLVM's ``default<On>``
            pipeline and code generation at that level). Level 2 builds a new
            specialisation in about three quarters of level 3's time: the TIR is already
            vectorised and its GEMM micro-kernels unrolled, and what level 3 adds is mostly
            more unrolling (the plain kernels gave bitwise-equal results at both levels and
            the same speed; the one loop whose full unrolling mattered, a reduction's, is
            unrolled in the TIR, :data:`.reductions.UNROLLED_VECTORS`). Level 1's code ran
            up to 3.4x slower (softmax); level 0 compiles ~5x faster but its code ran
            1.7-5x slower.
        checks: verify argument count, types, shapes, dtypes, strides and device at entry
            (TVM's ``MakePackedAPI`` assertions). Without them the entry still binds the
            shape variables from the first buffer dimension that has each, and compiles
            about a sixth faster.

    Raises ``ValueError`` for a ``Bind`` or ``Let`` whose value involves bfloat16: TVM's
    bfloat16 legalisation skips those values and would silently compute garbage.

    Uses the pipeline of :mod:`.tir_passes`: TVM's ``"tirx"`` pipeline without its simplifier,
    which applies float identities IEEE does not have. TVM's default (``"s_tir"``) adds
    schedule-oriented passes (buffer compaction, allocation re-planning, loop partitioning,
    storage rewriting) that hand-written kernels do not need, and its buffer compaction
    shrinks an array accessed only through ``address_of(buf[0])`` to one element.
    """
    _check_bindings(func)
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu, "opt-level": opt_level})
    with tvm.transform.PassContext(config={"tirx.disable_assert": not checks}):
        return tirx.build(func, target, pipeline=tir_passes.NAME)


_DEBUG_RECORD = re.compile(r"^[ \t]*(?:#dbg_|!llvm\.dbg\.cu ).*\n", re.MULTILINE)
_DEBUG_CALL = re.compile(r"^.*(?:call|declare) void @llvm\.dbg\..*\n", re.MULTILINE)
_DEBUG_REF = re.compile(r",? !dbg !\d+")


def without_debug_info(text: str) -> str:
    """LLVM IR text with its debug info detached: no ``!dbg`` attachments, no debug
    records or ``llvm.dbg`` intrinsic calls (the form before LLVM 19), no ``llvm.dbg.cu``
    (the debug metadata nodes stay, unreferenced, so nothing else can lose an operand).
    TVM's LLVM code generator always emits debug info, and LLVM then spends time on it in
    code generation (debug-value tracking, DWARF emission) without changing the machine
    code."""
    text = _DEBUG_RECORD.sub("", text if text.endswith("\n") else text + "\n")
    if "@llvm.dbg." in text:
        text = _DEBUG_CALL.sub("", text)
    return _DEBUG_REF.sub("", text)


def reload_ir(module: tvm.runtime.Module,
              rewrite: Callable[[str], str] | None = None) -> tvm.runtime.Module:
    """``module`` (from :func:`build`, optimised, no machine code yet) as a new module
    parsed from its LLVM IR, rewritten by ``rewrite`` if given and without debug info
    (see :func:`without_debug_info`): the same machine code for :func:`export`, emitted
    in less time into an object about half the size."""
    text = module.inspect_source("ll")
    if rewrite is not None:
        text = rewrite(text)
    with tempfile.TemporaryDirectory(prefix="jaxtile-ir-") as tmp:
        path = os.path.join(tmp, "kernel.ll")
        with open(path, "w") as f:
            f.write(without_debug_info(text))
        return tvm.runtime.load_module(path)


def object_code(module: tvm.runtime.Module) -> bytes:
    """The relocatable ELF object of ``module``: LLVM code generation only, no linking (which
    took ``ld`` 5-6 ms a kernel and needed binutils). jaxtile's FFI links it into the process
    (``ffi/cpu/elf_object.h``); TVM's own loader cannot load it."""
    with tempfile.TemporaryDirectory(prefix="jaxtile-obj-") as tmp:
        path = os.path.join(tmp, "kernel.o")
        module.write_to_file(path)
        with open(path, "rb") as f:
            return f.read()


def export(module: tvm.runtime.Module, path: str) -> None:
    """Write ``module`` as a shared object at ``path``, replacing any existing file atomically.

    Emits the object file (LLVM code generation, the bulk of the time) and links it with
    ``ld -shared`` directly, which takes a few ms where ``export_library``'s compiler driver
    takes 15-40 ms: how jaxtile builds kernels on machines whose FFI does not link objects
    itself (``jaxtile._ffi.CPU_LINKS_OBJECTS``). Load the result with
    ``tvm_ffi.load_module(path)`` (an absolute path, or ``dlopen`` will search the library
    path) or ``dlopen`` + ``dlsym(ffi_symbol(name))``.
    """
    directory = os.path.dirname(os.path.abspath(path))
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        obj = os.path.join(tmp, "kernel.o")
        lib = os.path.join(tmp, "kernel.so")
        module.write_to_file(obj)
        subprocess.run(["ld", "-shared", "-o", lib, obj], check=True, capture_output=True)
        os.replace(lib, path)
