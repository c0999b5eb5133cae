"""Traced kernel body (stateful jaxpr) -> Tile IR.

Assumes the jaxpr's inputs are ``[block indices, *buffers]`` in the order of the given
buffers, as jaxtile's tracer produces. Guarantees a Tile IR kernel whose ops are defined in
:mod:`.op_defs`; any primitive without a Tile IR meaning is rejected with the user's source
line. Each primitive has one converter in :data:`CONVERTERS`. Values carried through loops
and out of conditionals pass through on-chip scratch buffers (``carryN``, after the given
buffers; :meth:`_Converter.carry_buffer`), so the IR's statements have no results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import ir, op_defs, sizes
from . import jax_internals as ji
from . import tile_primitives as tp
from .errors import KernelError, kernel_error

_UNARY = {
    "neg": "neg", "abs": "abs", "sign": "sign", "floor": "floor", "ceil": "ceil",
    "exp": "exp", "exp2": "exp2", "log": "log", "log1p": "log1p",
    "expm1": "expm1", "tanh": "tanh", "logistic": "logistic", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin",
    "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh",
    "acosh": "acosh", "atanh": "atanh", "erf": "erf", "erfc": "erfc", "not": "not",
    "square": "square", "is_finite": "is_finite",
}
_BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "rem": "rem", "max": "max",
    "min": "min", "pow": "pow", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq",
    "ne": "ne", "and": "and", "or": "or", "xor": "xor", "atan2": "atan2",
}
_REDUCE = {
    "reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min", "reduce_prod": "prod",
    "reduce_and": "and", "reduce_or": "or",
}
_INLINE = {"jit": "jaxpr", "closed_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr",
           "custom_vjp_call": "call_jaxpr", "remat2": "jaxpr"}
"""Call-like primitives whose body is converted in place, and the param holding it."""
_INT32 = np.iinfo(np.int32)


def _saturate(i: int) -> int:
    """``i`` clamped into the int32 range (see ``_Converter.scalar``)."""
    return min(max(i, int(_INT32.min)), int(_INT32.max))


_IDENTITY = ("copy", "optimization_barrier", tp.LOOP_INFO, "stop_gradient")

Converter = Callable[["_Converter", Any, list], None]
CONVERTERS: dict[str, Converter] = {}
"""Primitive name -> converter ``(converter, eqn, out)`` appending statements to ``out``."""


def _converts(*names: str) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for name in names:
            CONVERTERS[name] = fn
        return fn
    return register


class _Converter:
    def __init__(self, kernel: str, taken: Sequence[str] = ()):
        self.kernel = kernel
        self.env: dict[Any, Any] = {}
        self.carried: list[ir.Buffer] = []
        """Scratch buffers the conversion adds: loop-carried values, branch results, dot
        operands (see :meth:`scratch`), added to the kernel's buffers."""
        self._taken = set(taken)
        self.line: str | None = None
        # Eqns traced inside library code (e.g. jnp.sort's own jit) have no user frame;
        # they are reported at the line of the user's call that contains them.
        self.fallback_line: str | None = None

    def error(self, message: str) -> KernelError:
        return kernel_error(self.kernel, message, self.line)

    # values ---------------------------------------------------------------
    def read(self, atom: Any, out: list[ir.Stmt]) -> Any:
        if isinstance(atom, ji.Literal):
            return self.constant(atom.val, atom.aval.dtype, out)
        return self.env[atom]

    def constant(self, value: Any, dtype: Any, out: list[ir.Stmt]) -> ir.Value:
        val = np.asarray(value)
        if val.shape != ():
            raise self.error("array constants captured by a kernel body are not supported; "
                             "pass them as kernel arguments")
        return self.op(out, "const", (), ir.Value((), dtype), value=val.item())

    def bind_consts(self, jaxpr: Any, consts: Sequence[Any], out: list[ir.Stmt]) -> None:
        for var, const in zip(jaxpr.constvars, consts):
            self.env[var] = self.constant(const, var.aval.dtype, out)

    def value(self, atom: Any, out: list[ir.Stmt]) -> ir.Value:
        v = self.read(atom, out)
        if isinstance(v, ir.Buffer):
            raise self.error(f"buffer '{v.name}' used where a value was expected; "
                             "read it with ref[...]")
        return v

    def buffer(self, atom: Any) -> ir.Buffer:
        b = self.env.get(atom)
        if not isinstance(b, ir.Buffer):
            raise self.error("expected a ref operand")
        return b

    def op(self, out: list[ir.Stmt], kind: str, operands: Sequence[ir.Value],
           result: ir.Value | None, **attrs: Any) -> ir.Value | None:
        out.append(ir.Op(kind, tuple(operands), result, attrs, self.line))
        return result

    def emit(self, out: list[ir.Stmt], kind: str, operands: Sequence[ir.Value], outvar: Any,
             **attrs: Any) -> ir.Value:
        if not all(isinstance(d, int) for d in outvar.aval.shape):
            raise self.error(f"a tile of shape {tuple(outvar.aval.shape)} depends on a dynamic "
                             "size; tile shapes must be static")
        res = self.op(out, kind, operands, ir.Value(outvar.aval.shape, outvar.aval.dtype),
                      **attrs)
        self.env[outvar] = res
        return res

    def binary(self, out: list[ir.Stmt], fn: str, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.op(out, "elementwise", (a, b), ir.Value(a.shape, a.dtype), fn=fn)

    # indexing -------------------------------------------------------------
    def region(self, buf: ir.Buffer, transforms: list[Any], out: list[ir.Stmt]) -> ir.Region:
        if not all(isinstance(t, ji.NDIndexer) for t in transforms):
            raise self.error(f"unsupported view of buffer '{buf.name}' (only indexing views "
                             "such as x.at[i, ds(j, n)] are supported)")
        levels = [[self.index_entry(buf, e, out) for e in t.indices] for t in transforms]

        def add(a: int | ir.Value, b: int | ir.Value) -> ir.Value:
            ops = [x if isinstance(x, ir.Value) else self.constant(x, np.int32, out)
                   for x in (a, b)]
            return self.binary(out, "add", *ops)

        index = tuple(ir.Index(s, z) for s, z in ir.compose_indices(levels, buf.shape, add))
        for d, i in enumerate(index):
            if isinstance(i.size, str):
                raise self.error(
                    f"dimension {d} of '{buf.name}' has the dynamic size {i.size}, and a tile "
                    "taking all of it would have a dynamic shape; tiles have static shapes: "
                    "index that dimension with jt.ds(start, size) or copy a tile with jt.copy")
        return ir.Region(buf.name, index)

    def index_entry(self, buf: ir.Buffer, entry: Any, out: list[ir.Stmt]):
        """``(start, size)`` of one indexer entry; size None for a single index."""
        if isinstance(entry, ji.Slice):
            if entry.stride != 1:
                raise self.error(f"strided slices of '{buf.name}' are not supported")
            if not isinstance(entry.size, int):
                raise self.error(f"slices of '{buf.name}' must have a static size")
            return self.scalar(entry.start, out), entry.size
        if getattr(getattr(entry, "aval", None), "shape", ()) != ():
            raise self.error(f"gather-style (array) indexing of '{buf.name}' is not "
                             "supported; use jt.copy with tile origins")
        return self.scalar(entry, out), None

    def scalar(self, atom: Any, out: list[ir.Stmt]) -> int | ir.Value:
        """A scalar index or bound: an int, or a Value. Kernels index in int32, and a value
        of a wider integer type (an int64 index under x64) is saturated into int32's range:
        no dimension exceeds 2**31 - 1, so an index out of int32's range stays out of range
        and follows the edge rules, where a cast would wrap it onto a valid one."""
        if isinstance(atom, int | np.integer):
            return _saturate(int(atom))
        lit = ji.literal_value(atom)
        if lit is not None:
            return _saturate(int(lit))
        v = self.value(atom, out)
        if not np.issubdtype(v.dtype, np.integer):
            return v
        info = np.iinfo(v.dtype)
        if info.max <= _INT32.max and info.min >= _INT32.min:
            return v
        if info.max > _INT32.max:
            v = self.binary(out, "min", v, self.constant(_INT32.max, v.dtype, out))
        if info.min < _INT32.min:
            v = self.binary(out, "max", v, self.constant(_INT32.min, v.dtype, out))
        return self.op(out, "convert", (v,), ir.Value((), np.int32))

    def scalar_value(self, atom: Any, out: list[ir.Stmt]) -> ir.Value:
        """A scalar index as a Value (a constant for a static one)."""
        s = self.scalar(atom, out)
        return s if isinstance(s, ir.Value) else self.constant(s, np.int32, out)

    def starts_region(self, buf: ir.Buffer, starts: Sequence[Any],
                      sizes: Sequence[int | None], out: list[ir.Stmt]) -> ir.Region:
        """A region from per-dimension starts: scalars, or 1-D index tiles (gather)."""
        def start(atom: Any) -> int | ir.Value:
            if getattr(getattr(atom, "aval", None), "shape", ()) != ():
                return self.value(atom, out)
            return self.scalar(atom, out)
        return ir.Region(buf.name, tuple(ir.Index(start(s), z) for s, z in zip(starts, sizes)))

    # carried values -------------------------------------------------------
    def carry_buffer(self, aval: Any) -> ir.Buffer:
        """A new on-chip scratch buffer for one loop-carried value or branch result.

        Values flow between iterations and out of branches through memory, so the IR keeps
        plain SSA blocks and no backend needs to know: a tile lives in a ``fragment`` (the
        GPU's layout inference splits it over threads like any fragment), a scalar in a
        one-element ``local`` tile (scalars are the same in every thread, which is what a
        local tile must hold). Its value's shape is static: every value's is (:meth:`emit`)."""
        shape = tuple(aval.shape)
        return self.scratch("carry", shape or (1,), np.dtype(aval.dtype),
                            "fragment" if shape else "local")

    def scratch(self, prefix: str, shape: tuple[int, ...], dtype: np.dtype,
                scope: str) -> ir.Buffer:
        """A new on-chip scratch buffer the conversion itself needs (a loop carry, a dot's
        operands), named ``<prefix><n>`` with a name no other buffer has."""
        n = len(self.carried)
        while f"{prefix}{n}" in self._taken:
            n += 1
        buf = ir.Buffer(f"{prefix}{n}", shape, np.dtype(dtype), scope, "scratch", self.line)
        self._taken.add(buf.name)
        self.carried.append(buf)
        return buf

    def put(self, buf: ir.Buffer, atom: Any, out: list[ir.Stmt]) -> None:
        """Store the value of ``atom`` into all of ``buf`` (a :meth:`carry_buffer`)."""
        v = self.value(atom, out)
        if v.shape != buf.shape:
            v = self.op(out, "reshape", (v,), ir.Value(buf.shape, buf.dtype))
        self.op(out, "store", (v,), None, dst=ir.whole(buf.name, buf.shape))

    def take(self, buf: ir.Buffer, var: Any, out: list[ir.Stmt]) -> None:
        """Load all of ``buf`` (a :meth:`carry_buffer`) as the value of ``var``."""
        v = self.op(out, "load", (), ir.Value(buf.shape, buf.dtype),
                    src=ir.whole(buf.name, buf.shape))
        if tuple(var.aval.shape) != buf.shape:
            v = self.op(out, "reshape", (v,), ir.Value((), buf.dtype))
        self.env[var] = v

    # statements -----------------------------------------------------------
    def block(self, jaxpr: ji.Jaxpr, out: list[ir.Stmt],
              eqns: Sequence[ji.JaxprEqn] | None = None) -> None:
        """Convert ``jaxpr``'s equations (or the given ones of it) into ``out``."""
        outer = self.fallback_line
        for eqn in jaxpr.eqns if eqns is None else eqns:
            self.line = ji.user_source_line(eqn.source_info) or outer
            self.fallback_line = self.line
            convert = CONVERTERS.get(eqn.primitive.name)
            if eqn.primitive.name in _NOT_COMPILED:
                raise self.error(f"{_NOT_COMPILED[eqn.primitive.name]} is not supported in "
                                 "compiled kernels; print with jt.print(\"x {}\", x) instead "
                                 "(every backend), or run the body as plain JAX ops with "
                                 "interpret=True (@jt.kernel(interpret=True) or "
                                 "JAXTILE_INTERPRET=1)")
            if convert is None:
                raise self.error(f"the operation `{eqn.primitive.name}` is not supported in "
                                 "kernel bodies")
            convert(self, eqn, out)
        self.fallback_line = outer

    def nested(self, jaxpr: ji.Jaxpr, consts: Sequence[Any], invars: Sequence[Any],
               atoms: Sequence[Any], out: list[ir.Stmt], body: list[ir.Stmt]) -> None:
        """Convert ``jaxpr`` into ``body``, binding its constants (into ``out``) and its
        inputs to ``atoms``."""
        self.bind_consts(jaxpr, consts, out)
        for var, atom in zip(invars, atoms):
            self.env[var] = self.read(atom, out)
        line = self.line
        self.block(jaxpr, body)
        self.line = line


_NOT_COMPILED = {"debug_print": "jax.debug.print", "debug_callback": "jax.debug.callback"}
"""Operations that run in the reference semantics but are not compiled, by what the user
wrote."""


def _elementwise(fn: str) -> Converter:
    def convert(c: _Converter, eqn: Any, out: list) -> None:
        c.emit(out, "elementwise", [c.value(v, out) for v in eqn.invars], eqn.outvars[0], fn=fn)
    return convert


for _prim, _fn in {**_UNARY, **_BINARY}.items():
    CONVERTERS[_prim] = _elementwise(_fn)


@_converts("round")
def _round(c: _Converter, eqn: Any, out: list) -> None:
    fn = "round" if int(eqn.params["rounding_method"]) == 1 else "round_away"
    c.emit(out, "elementwise", [c.value(eqn.invars[0], out)], eqn.outvars[0], fn=fn)


@_converts("integer_pow")
def _integer_pow(c: _Converter, eqn: Any, out: list) -> None:
    """``x ** y`` by binary exponentiation, multiplying in XLA's order (so that floats round
    the same way), then a reciprocal for negative ``y``."""
    x = c.value(eqn.invars[0], out)
    y = eqn.params["y"]
    acc, base, n = None, x, abs(y)
    while n > 0:
        if n & 1:
            acc = base if acc is None else c.binary(out, "mul", acc, base)
        n >>= 1
        if n > 0:
            base = c.binary(out, "mul", base, base)
    if acc is None:
        c.emit(out, "broadcast", [c.constant(1, x.dtype, out)], eqn.outvars[0], dims=())
    elif y < 0:
        c.emit(out, "elementwise", [c.constant(1, x.dtype, out), acc], eqn.outvars[0],
               fn="div")
    else:
        c.env[eqn.outvars[0]] = acc


@_converts("convert_element_type")
def _convert(c: _Converter, eqn: Any, out: list) -> None:
    c.emit(out, "convert", [c.value(eqn.invars[0], out)], eqn.outvars[0])


@_converts("select_n")
def _select(c: _Converter, eqn: Any, out: list) -> None:
    if len(eqn.invars) != 3:
        raise c.error("select_n with more than two cases is not supported")
    c.emit(out, "select", [c.value(v, out) for v in eqn.invars], eqn.outvars[0])


@_converts("clamp")
def _clamp(c: _Converter, eqn: Any, out: list) -> None:
    lo, x, hi = (c.value(v, out) for v in eqn.invars)
    c.emit(out, "elementwise", [c.binary(out, "max", x, lo), hi], eqn.outvars[0], fn="min")


@_converts("broadcast_in_dim")
def _broadcast(c: _Converter, eqn: Any, out: list) -> None:
    c.emit(out, "broadcast", [c.value(eqn.invars[0], out)], eqn.outvars[0],
           dims=tuple(eqn.params["broadcast_dimensions"]))


@_converts("reshape", "squeeze", "expand_dims")
def _reshape(c: _Converter, eqn: Any, out: list) -> None:
    c.emit(out, "reshape", [c.value(eqn.invars[0], out)], eqn.outvars[0])


@_converts("transpose")
def _transpose(c: _Converter, eqn: Any, out: list) -> None:
    c.emit(out, "transpose", [c.value(eqn.invars[0], out)], eqn.outvars[0],
           perm=tuple(eqn.params["permutation"]))


@_converts("rev")
def _rev(c: _Converter, eqn: Any, out: list) -> None:
    c.emit(out, "rev", [c.value(eqn.invars[0], out)], eqn.outvars[0],
           dims=tuple(int(d) for d in eqn.params["dimensions"]))


@_converts("slice")
def _slice(c: _Converter, eqn: Any, out: list) -> None:
    p = eqn.params
    rank = len(p["start_indices"])
    c.emit(out, "slice", [c.value(eqn.invars[0], out)], eqn.outvars[0],
           start=tuple(int(s) for s in p["start_indices"]),
           stride=tuple(int(s) for s in (p["strides"] or (1,) * rank)))


@_converts("concatenate")
def _concatenate(c: _Converter, eqn: Any, out: list) -> None:
    c.emit(out, "concatenate", [c.value(v, out) for v in eqn.invars], eqn.outvars[0],
           dimension=int(eqn.params["dimension"]))


@_converts("stack")
def _stack(c: _Converter, eqn: Any, out: list) -> None:
    """``jnp.stack``: each operand with a unit dimension inserted at ``axis`` (a reshape),
    concatenated along it."""
    axis = int(eqn.params["axis"])
    parts = []
    for atom in eqn.invars:
        v = c.value(atom, out)
        shape = v.shape[:axis] + (1,) + v.shape[axis:]
        parts.append(c.op(out, "reshape", (v,), ir.Value(shape, v.dtype)))
    c.emit(out, "concatenate", parts, eqn.outvars[0], dimension=axis)


@_converts("dot_general")
def _dot(c: _Converter, eqn: Any, out: list) -> None:
    """``jnp.dot``/``@`` of 2-D tile values, as the gemm of on-chip tiles it is: A in a
    fragment (registers), B in shared memory (where the GPU's tensor-core gemm takes them),
    a zeroed accumulator fragment of the result's dtype (16-bit results accumulate in
    float32 and round once, as every gemm does), then its value. Each dot has its own
    buffers, reused by every iteration of a loop around it."""
    ((lc, rc), (lb, rb)) = eqn.params["dimension_numbers"]
    a, b = (c.value(v, out) for v in eqn.invars)
    res = eqn.outvars[0].aval
    if lb or rb or len(a.shape) != 2 or len(b.shape) != 2 or len(lc) != 1 or len(rc) != 1:
        raise c.error(f"jnp.dot of tile values takes two 2-D tiles contracting one dimension "
                      f"each (shapes {a.shape} and {b.shape} given); reshape the operands")
    if np.dtype(res.dtype) in op_defs.FLOAT8:
        raise c.error(f"jnp.dot of {res.dtype} tiles accumulates in float32: pass "
                      "preferred_element_type=jnp.float32")
    if not np.issubdtype(res.dtype, np.floating):
        raise c.error(f"jnp.dot of tile values computes in a float dtype, not {res.dtype}; "
                      "convert the operands (x.astype(jnp.float32))")
    operand = np.promote_types(a.dtype, b.dtype)
    if not np.issubdtype(operand, np.floating):
        operand = np.dtype(res.dtype)
    regions = []
    for role, v, scope in (("a", a, "fragment"), ("b", b, "shared")):
        if v.dtype != operand:
            v = c.op(out, "convert", (v,), ir.Value(v.shape, operand))
        buf = c.scratch(f"dot_{role}", v.shape, operand, scope)
        regions.append(ir.whole(buf.name, buf.shape))
        c.op(out, "store", (v,), None, dst=regions[-1])
    acc = c.scratch("dot_c", tuple(res.shape), np.dtype(res.dtype), "fragment")
    zero = c.op(out, "broadcast", (c.constant(0, res.dtype, out),),
                ir.Value(acc.shape, acc.dtype), dims=())
    whole = ir.whole(acc.name, acc.shape)
    c.op(out, "store", (zero,), None, dst=whole)
    c.op(out, "gemm", (), None, a=regions[0], b=regions[1], c=whole,
         transpose_a=lc[0] == 0, transpose_b=rc[0] == 1)
    c.emit(out, "load", [], eqn.outvars[0], src=whole)


@_converts("dim_as_value")
def _dim_as_value(c: _Converter, eqn: Any, out: list) -> None:
    # A dynamic size used as a value (a loop bound, a mask): computed on the device from the
    # shapes the kernel is called with.
    c.emit(out, "size", [], eqn.outvars[0], expr=sizes.canonical(eqn.params["dim"]))


@_converts("iota")
def _iota(c: _Converter, eqn: Any, out: list) -> None:
    c.emit(out, "iota", [], eqn.outvars[0], dimension=eqn.params["dimension"])


@_converts(*_REDUCE)
def _reduce(c: _Converter, eqn: Any, out: list) -> None:
    c.emit(out, "reduce", [c.value(eqn.invars[0], out)], eqn.outvars[0],
           fn=_REDUCE[eqn.primitive.name], axes=tuple(eqn.params["axes"]))


_SCANS = {"cumsum": "sum", "cumprod": "prod", "cummax": "max", "cummin": "min"}


@_converts(*_SCANS)
def _scan_op(c: _Converter, eqn: Any, out: list) -> None:
    c.emit(out, "scan", [c.value(eqn.invars[0], out)], eqn.outvars[0],
           fn=_SCANS[eqn.primitive.name], axis=int(eqn.params["axis"]),
           reverse=bool(eqn.params["reverse"]))


@_converts("argmax", "argmin")
def _argreduce(c: _Converter, eqn: Any, out: list) -> None:
    (axis,) = eqn.params["axes"]
    c.emit(out, "argreduce", [c.value(eqn.invars[0], out)], eqn.outvars[0],
           fn=eqn.primitive.name[3:], axis=int(axis))


@_converts("sort")
def _sort(c: _Converter, eqn: Any, out: list) -> None:
    # lax.sort of one or more operands (jnp.sort; jnp.argsort sorts the keys with an iota):
    # one op per result, each the same stable sort taking another operand; DCE drops the
    # ones nobody reads. XLA's order: NaNs last, -0.0 and 0.0 equal. An unstable sort may
    # order ties any way, so the stable one serves it too.
    operands = [c.value(v, out) for v in eqn.invars]
    for take, outvar in enumerate(eqn.outvars):
        c.emit(out, "sort", operands, outvar, axis=int(eqn.params["dimension"]),
               num_keys=int(eqn.params["num_keys"]), take=take, descending=False,
               total_order=False)


@_converts("top_k")
def _top_k(c: _Converter, eqn: Any, out: list) -> None:
    # The first k of a stable descending sort of (operand, its positions), as XLA's TopK:
    # floats in the IEEE total order (NaN above inf, 0.0 above -0.0, -NaN below -inf),
    # ties to the lower index.
    x = c.value(eqn.invars[0], out)
    axis = int(eqn.params.get("axis", -1)) % len(x.shape)
    positions = c.op(out, "iota", (), ir.Value(x.shape, np.dtype(np.int32)), dimension=axis)
    for take, outvar in enumerate(eqn.outvars):
        whole = c.op(out, "sort", (x, positions), ir.Value(x.shape, outvar.aval.dtype),
                     axis=axis, num_keys=1, take=take, descending=True, total_order=True)
        c.emit(out, "slice", [whole], outvar, start=(0,) * len(x.shape),
               stride=(1,) * len(x.shape))


@_converts(*_IDENTITY)
def _identity(c: _Converter, eqn: Any, out: list) -> None:
    c.env[eqn.outvars[0]] = c.read(eqn.invars[0], out)


@_converts(*_INLINE)
def _inline(c: _Converter, eqn: Any, out: list) -> None:
    sub = eqn.params[_INLINE[eqn.primitive.name]]
    closed = sub if isinstance(sub, ji.ClosedJaxpr) else None
    jaxpr = closed.jaxpr if closed else sub
    c.nested(jaxpr, closed.consts if closed else (), jaxpr.invars, eqn.invars, out, out)
    for var, atom in zip(eqn.outvars, jaxpr.outvars):
        c.env[var] = c.read(atom, out)


@_converts("get")
def _get(c: _Converter, eqn: Any, out: list) -> None:
    ref, transforms = ji.ref_indexers(eqn)
    buf = c.buffer(ref)
    c.emit(out, "load", [], eqn.outvars[0], src=c.region(buf, transforms, out))


@_converts("swap", "addupdate")
def _store(c: _Converter, eqn: Any, out: list) -> None:
    ref, transforms = ji.ref_indexers(eqn)
    buf = c.buffer(ref)
    if buf.role == "input":
        raise c.error(f"kernel inputs are read-only: the body writes to '{buf.name}'")
    region = c.region(buf, transforms, out)
    val = c.value(ji.value_operand(eqn), out)
    # swap returns the old contents; dead-code elimination drops the load if unused.
    old = c.op(out, "load", (), ir.Value(val.shape, buf.dtype), src=region)
    if eqn.primitive.name == "addupdate":
        val = c.binary(out, "add", old, val)
    else:
        c.env[eqn.outvars[0]] = old
    c.op(out, "store", (val,), None, dst=region)


@_converts(tp.COPY)
def _copy(c: _Converter, eqn: Any, out: list) -> None:
    p = eqn.params
    src, dst = c.buffer(eqn.invars[0]), c.buffer(eqn.invars[1])
    if dst.role == "input":
        raise c.error(f"kernel inputs are read-only: jt.copy writes to '{dst.name}'")
    starts = eqn.invars[2:]
    n = len(p["src_sizes"])
    c.op(out, "copy", (), None, src=c.starts_region(src, starts[:n], p["src_sizes"], out),
         dst=c.starts_region(dst, starts[n:], p["dst_sizes"], out), pad=p["pad"])


@_converts(tp.ATOMIC)
def _atomic(c: _Converter, eqn: Any, out: list) -> None:
    dst = c.buffer(eqn.invars[0])
    if dst.role == "input":
        raise c.error(f"kernel inputs are read-only: an atomic update writes to '{dst.name}'")
    region = c.starts_region(dst, eqn.invars[2:], eqn.params["sizes"], out)
    value = c.value(eqn.invars[1], out)
    if value.dtype != dst.dtype:
        value = c.op(out, "convert", (value,), ir.Value(value.shape, dst.dtype))
    c.op(out, "atomic", (value,), None, dst=region, fn=eqn.params["fn"])


@_converts(tp.LOAD_ACQUIRE)
def _load_acquire(c: _Converter, eqn: Any, out: list) -> None:
    src = c.buffer(eqn.invars[0])
    starts = eqn.invars[1:]
    c.emit(out, "load_acquire", [], eqn.outvars[0],
           src=c.starts_region(src, starts, [None] * len(starts), out))


@_converts(tp.STORE_RELEASE)
def _store_release(c: _Converter, eqn: Any, out: list) -> None:
    dst = c.buffer(eqn.invars[0])
    if dst.role == "input":
        raise c.error(f"kernel inputs are read-only: jt.store_release writes to '{dst.name}'")
    starts = eqn.invars[2:]
    region = c.starts_region(dst, starts, [None] * len(starts), out)
    c.op(out, "store_release", (c.value(eqn.invars[1], out),), None, dst=region)


@_converts(tp.FENCE)
def _fence(c: _Converter, eqn: Any, out: list) -> None:
    del eqn
    c.op(out, "fence", (), None)


@_converts(tp.PRINT)
def _print(c: _Converter, eqn: Any, out: list) -> None:
    c.op(out, "print", [c.value(a, out) for a in eqn.invars], None, text=eqn.params["text"],
         tag=eqn.params["tag"])


@_converts(tp.GEMM)
def _gemm(c: _Converter, eqn: Any, out: list) -> None:
    p = eqn.params
    regions, starts = {}, list(eqn.invars[3:])
    for role, atom in zip("abc", eqn.invars[:3]):
        sizes = p[f"{role}_sizes"]
        regions[role] = c.starts_region(c.buffer(atom), starts[:len(sizes)], sizes, out)
        starts = starts[len(sizes):]
    c.op(out, "gemm", (), None, **regions, transpose_a=p["transpose_a"],
         transpose_b=p["transpose_b"])


def _carry_slots(c: _Converter, carries: Sequence[Any], inits: Sequence[Any],
                 results: Sequence[Any], out: list[ir.Stmt]) -> list[ir.Buffer | None]:
    """One slot per loop-carried value: None for one the body returns unchanged (it keeps
    its initial value, read directly), else a carry buffer that holds the value between
    iterations, its initial value stored into it in ``out`` (before the loop)."""
    slots: list[ir.Buffer | None] = []
    for var, init, result in zip(carries, inits, results):
        if result is var:
            slots.append(None)
        else:
            slots.append(c.carry_buffer(var.aval))
            c.put(slots[-1], init, out)
    return slots


def _carried_block(c: _Converter, jaxpr: Any, consts: Sequence[Any], const_atoms: Sequence[Any],
                   carries: Sequence[Any], slots: Sequence[ir.Buffer | None],
                   inits: Sequence[Any], out: list[ir.Stmt],
                   results: Sequence[Any] | None) -> list[ir.Stmt]:
    """The statements of one iteration of ``jaxpr`` (a loop's body or condition): its first
    inputs bound to ``const_atoms``, then its carried values ``carries`` loaded from their
    ``slots`` (an unchanged one is its initial value, read in ``out``); with ``results``
    (the body's outputs), the new carried values stored back at the end."""
    c.bind_consts(jaxpr, consts, out)
    for var, atom in zip(jaxpr.invars, const_atoms):
        c.env[var] = c.read(atom, out)
    stmts: list[ir.Stmt] = []
    for var, slot, init in zip(carries, slots, inits):
        if slot is None:
            c.env[var] = c.read(init, out)
        else:
            c.take(slot, var, stmts)
    line = c.line
    c.block(jaxpr, stmts)
    c.line = line
    for slot, atom in zip(slots, results or ()):
        if slot is not None:
            c.put(slot, atom, stmts)
    return stmts


def _carried_results(c: _Converter, outvars: Sequence[Any], slots: Sequence[ir.Buffer | None],
                     inits: Sequence[Any], out: list[ir.Stmt]) -> None:
    """Bind a loop's results: each carried value's buffer loaded after the loop, or its
    initial value for one the loop never changes."""
    for var, slot, init in zip(outvars, slots, inits):
        if slot is None:
            c.env[var] = c.read(init, out)
        else:
            c.take(slot, var, out)


def _index_result(c: _Converter, var: Any, value: ir.Value, out: list[ir.Stmt]) -> None:
    """Bind a counted loop's final index (``value``, int32) to ``var``."""
    if value.dtype != np.dtype(var.aval.dtype):
        value = c.op(out, "convert", (value,), ir.Value((), var.aval.dtype))
    c.env[var] = value


def _steps_by_one(body: Any, carries: Sequence[Any]) -> bool:
    """Whether the body's first result is its first carried value, an integer scalar, plus 1
    (a loop index)."""
    aval = carries[0].aval
    if aval.shape != () or not np.issubdtype(aval.dtype, np.integer):
        return False
    step = next((e for e in body.eqns if e.outvars[0] is body.outvars[0]), None)
    return (step is not None and step.primitive.name == "add" and step.invars[0] is carries[0]
            and ji.literal_value(step.invars[1]) == 1)


@_converts("scan")
def _scan(c: _Converter, eqn: Any, out: list) -> None:
    """``lax.scan`` without xs and ys (``fori_loop`` with static bounds, ``jt.loop``) as a
    For statement. A first carried value that the body steps by one (fori_loop's index)
    becomes the loop variable; the other carried values live in carry buffers."""
    p = eqn.params
    closed = p["jaxpr"]
    body = closed.jaxpr
    n_consts, n_carry = p["num_consts"], p["num_carry"]
    if len(eqn.invars) != n_consts + n_carry or len(eqn.outvars) != n_carry:
        raise c.error("lax.scan over arrays (xs) or stacking per-iteration results (ys) is "
                      "not supported in kernel bodies; carry values through the loop "
                      "(lax.fori_loop, or lax.scan with xs=None) and read or write refs in "
                      "its body")
    carries, inits = body.invars[n_consts:], eqn.invars[n_consts:]
    var = ir.Value((), np.int32)
    length = int(p["length"])
    counted = n_carry > 0 and not p["reverse"] and _steps_by_one(body, carries)
    first = int(counted)
    start: int | ir.Value = 0
    kind, stages, ws, pp = "serial", 1, None, None
    if counted:
        start = c.scalar(inits[0], out)
        c.env[carries[0]] = var
        kind, stages, ws, pp = _loop_kind(body, carries[0])
    slots = _carry_slots(c, carries[first:], inits[first:], body.outvars[first:], out)
    stmts = _carried_block(c, body, closed.consts, eqn.invars[:n_consts], carries[first:],
                           slots, inits[first:], out, body.outvars[first:])
    out.append(ir.For(var, start, length, kind, stages, stmts, c.line, ws, pp))
    _carried_results(c, eqn.outvars[first:], slots, inits[first:], out)
    if counted:
        _index_result(c, eqn.outvars[0], c.binary(out, "add", c.scalar_value(inits[0], out),
                                                  c.constant(length, np.int32, out)), out)


@_converts("cond")
def _cond(c: _Converter, eqn: Any, out: list) -> None:
    """``lax.cond`` / ``lax.switch`` as If statements on the branch index; every branch
    stores its results into carry buffers, loaded after the If."""
    branches = eqn.params["branches"]
    index = c.value(eqn.invars[0], out)
    slots = [c.carry_buffer(v.aval) for v in eqn.outvars]
    cases = []
    for branch in branches:
        stmts: list[ir.Stmt] = []
        c.nested(branch.jaxpr, branch.consts, branch.jaxpr.invars, eqn.invars[1:], out, stmts)
        for slot, atom in zip(slots, branch.jaxpr.outvars):
            c.put(slot, atom, stmts)
        cases.append(stmts)
    # lax.switch clamps its index into range before the cond, so the last branch runs for
    # every index the others do not take (lax.cond's is 0 or 1).
    chain = cases[-1]
    for k in range(len(cases) - 2, -1, -1):
        test = c.constant(k, index.dtype, out)
        pred = c.op(out, "elementwise", (index, test), ir.Value((), np.bool_),
                    fn="ne" if k == 0 else "eq")
        # Index 0 against the rest as ``index != 0``, the form jt.when has always had.
        chain = [ir.If(pred, chain, cases[k], c.line) if k == 0
                 else ir.If(pred, cases[k], chain, c.line)]
    out.extend(chain)
    for var, slot in zip(eqn.outvars, slots):
        c.take(slot, var, out)


def _loop_kind(body: Any, index: Any) -> tuple[str, int, bool | None, bool | None]:
    """The kind, stages, warp-specialisation and ping-pong flags jt.loop/jt.pipelined
    recorded on a loop's index."""
    for e in body.eqns:
        if e.primitive.name == tp.LOOP_INFO and e.invars[0] is index:
            return (e.params["kind"], e.params["stages"], e.params.get("warp_specialize"),
                    e.params.get("pingpong"))
    return "serial", 1, None, None


def _counted(cond: Any, body: Any, n_consts: int) -> bool:
    """Whether a ``while`` is a counted loop as ``fori_loop`` with traced bounds makes it:
    carries ``(i, stop, *values)``, condition ``i < stop``, the body adds 1 to i and keeps
    stop."""
    if len(cond.eqns) != 1 or len(cond.invars) < 2:
        return False
    test = cond.eqns[0]
    if (test.primitive.name != "lt" or list(test.invars) != list(cond.invars[:2])
            or list(cond.outvars) != list(test.outvars)):
        return False
    carries = body.invars[n_consts:]
    return _steps_by_one(body, carries) and body.outvars[1] is carries[1]


def _flag_loop(cond: Any, body: Any, nc: int, nb: int) -> bool:
    """Whether a ``while`` is jt.while_'s: its only carry is a bool flag that the condition
    returns as is and the body recomputes at its end; the state lives in refs."""
    return (nc == 0 and not cond.eqns and len(cond.invars) == 1
            and cond.outvars[0] is cond.invars[0] and len(body.invars) == nb + 1
            and len(body.outvars) == 1)


def _flag_while(c: _Converter, eqn: Any, out: list) -> None:
    """``flag = cond(); while flag: body(); flag = cond()`` as a While statement: the body's
    equations after its last write compute the next flag (jt.while_ traces the condition,
    which only reads, after the body), so they are the While's condition block."""
    p = eqn.params
    nb = p["body_nconsts"]
    body = p["body_jaxpr"].jaxpr
    writes = [i for i, e in enumerate(body.eqns)
              if any(isinstance(f, ji.WriteEffect) for f in e.effects)]
    split = writes[-1] + 1 if writes else 0
    c.bind_consts(body, p["body_jaxpr"].consts, out)
    for var, atom in zip(body.invars, eqn.invars[:nb + 1]):
        c.env[var] = c.read(atom, out)
    body_stmts: list[ir.Stmt] = []
    cond_stmts: list[ir.Stmt] = []
    line = c.line
    c.block(body, body_stmts, body.eqns[:split])
    c.block(body, cond_stmts, body.eqns[split:])
    c.line = line
    test = c.value(body.outvars[0], cond_stmts)
    out.append(ir.While(cond_stmts, test, body_stmts, c.line))


@_converts("while")
def _while(c: _Converter, eqn: Any, out: list) -> None:
    """``lax.while_loop``: jt.while_'s flag loop; a counted loop (``fori_loop`` with traced
    bounds, ``jt.loop``) as a For statement whose other carried values live in carry
    buffers; any other as a While statement whose condition and body load the carried
    values from carry buffers (the body stores them back)."""
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]
    if _flag_loop(cond.jaxpr, body.jaxpr, nc, nb):
        _flag_while(c, eqn, out)
        return
    inits = eqn.invars[nc + nb:]
    carries = body.jaxpr.invars[nb:]
    if not nc and _counted(cond.jaxpr, body.jaxpr, nb):
        start = c.scalar(inits[0], out)
        kind, stages, ws, pp = _loop_kind(body.jaxpr, carries[0])
        first, stop = c.scalar_value(inits[0], out), c.scalar_value(inits[1], out)
        var = ir.Value((), np.int32)
        c.env[carries[0]] = var
        c.env[carries[1]] = c.read(inits[1], out)
        slots = _carry_slots(c, carries[2:], inits[2:], body.jaxpr.outvars[2:], out)
        stmts = _carried_block(c, body.jaxpr, body.consts, eqn.invars[nc:nc + nb],
                               carries[2:], slots, inits[2:], out, body.jaxpr.outvars[2:])
        last = c.scalar(inits[1], out)
        if isinstance(start, int) and isinstance(last, int):
            extent = max(last - start, 0)   # static: an unrolled loop needs it to be
        else:
            extent = c.binary(out, "sub", stop, first)
        out.append(ir.For(var, start, extent, kind, stages, stmts, c.line, ws, pp))
        _carried_results(c, eqn.outvars[2:], slots, inits[2:], out)
        _index_result(c, eqn.outvars[0], c.binary(out, "max", first, stop), out)
        c.env[eqn.outvars[1]] = c.read(inits[1], out)
        return
    slots = _carry_slots(c, carries, inits, body.jaxpr.outvars, out)
    test_stmts = _carried_block(c, cond.jaxpr, cond.consts, eqn.invars[:nc],
                                cond.jaxpr.invars[nc:], slots, inits, out, None)
    test = c.value(cond.jaxpr.outvars[0], test_stmts)
    stmts = _carried_block(c, body.jaxpr, body.consts, eqn.invars[nc:nc + nb], carries, slots,
                           inits, out, body.jaxpr.outvars)
    out.append(ir.While(test_stmts, test, stmts, c.line))
    _carried_results(c, eqn.outvars, slots, inits, out)


def convert(name: str, closed: ji.ClosedJaxpr, buffers: Sequence[ir.Buffer],
            grid: tuple[int, ...], threads: int,
            index_axes: Sequence[int | None]) -> ir.Kernel:
    """Convert a traced kernel body into a Tile IR kernel (see the module docstring).

    ``index_axes[i]`` is the grid axis that the jaxpr's i-th block-index input reads, or
    None for an unused one (it reads as 0).
    """
    conv = _Converter(name, [b.name for b in buffers])
    jaxpr = closed.jaxpr
    block_indices = tuple(ir.Value((), np.int32) for _ in grid)
    body: list[ir.Stmt] = []
    for var, axis in zip(jaxpr.invars, index_axes):
        if axis is None:
            conv.env[var] = conv.constant(0, np.int32, body)
        else:
            conv.env[var] = block_indices[axis]
    for var, buf in zip(jaxpr.invars[len(index_axes):], buffers):
        conv.env[var] = buf
    conv.bind_consts(jaxpr, closed.consts, body)
    conv.block(jaxpr, body)
    return ir.Kernel(name, tuple(grid), threads, tuple(buffers) + tuple(conv.carried),
                     block_indices, body)
