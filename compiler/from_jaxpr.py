"""Traced kernel body (stateful jaxpr) -> Tile IR.

Assumes the jaxpr's inputs are ``[block indices, *buffers]`` in the order of the given
buffers, as jaxtile's tracer produces. Guarantees a Tile IR kernel whose ops are those listed
in :mod:`jaxtile.compiler.ir`; any primitive without a Tile IR meaning is rejected with the
user's source line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import ir
from . import jax_internals as ji
from .errors import KernelError, kernel_error

_UNARY = {
    "neg": "neg", "abs": "abs", "sign": "sign", "floor": "floor", "ceil": "ceil",
    "exp": "exp", "exp2": "exp2", "log": "log", "log1p": "log1p",
    "expm1": "expm1", "tanh": "tanh", "logistic": "logistic", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "sin": "sin", "cos": "cos", "erf": "erf", "not": "not",
    "square": "square",
}
_BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "rem": "rem", "max": "max",
    "min": "min", "pow": "pow", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq",
    "ne": "ne", "and": "and", "or": "or", "xor": "xor",
}
_REDUCE = {
    "reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min", "reduce_prod": "prod",
    "reduce_and": "and", "reduce_or": "or",
}
_INLINE = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr",
           "custom_jvp_call": "call_jaxpr",
           "custom_vjp_call": "call_jaxpr", "remat": "jaxpr", "checkpoint": "jaxpr"}
_IDENTITY = {"copy", "copy_p", "optimization_barrier", "jt_loop_info", "stop_gradient"}


class _Converter:
    def __init__(self, kernel: str, buffers: Sequence[ir.Buffer]):
        self.kernel = kernel
        self.buffers = {id(b): b for b in buffers}
        self.env: dict[Any, Any] = {}
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
        res = ir.Value((), dtype)
        out.append(ir.Op("const", (), res, {"value": val.item()}, self.line))
        return res

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

    def emit(self, out: list[ir.Stmt], kind: str, operands: Sequence[ir.Value], outvar: Any,
             **attrs: Any) -> ir.Value:
        res = ir.Value(outvar.aval.shape, outvar.aval.dtype)
        out.append(ir.Op(kind, tuple(operands), res, attrs, self.line))
        self.env[outvar] = res
        return res

    # indexing -------------------------------------------------------------
    def index(self, buf: ir.Buffer, transforms: list[Any], out: list[ir.Stmt]):
        if not all(isinstance(t, ji.NDIndexer) for t in transforms):
            raise self.error(f"unsupported view of buffer '{buf.name}' (only indexing views "
                             "such as x.at[i, ds(j, n)] are supported)")
        levels = [[self.index_entry(buf, e, out) for e in t.indices] for t in transforms]

        def add(a, b):
            res = ir.Value((), np.int32)
            ops = [a if isinstance(a, ir.Value) else self.constant(a, np.int32, out),
                   b if isinstance(b, ir.Value) else self.constant(b, np.int32, out)]
            out.append(ir.Op("elementwise", tuple(ops), res, {"fn": "add"}, self.line))
            return res

        return tuple(ir.Index(s, z) for s, z in ir.compose_indices(levels, buf.shape, add))

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
        if isinstance(atom, int | np.integer):
            return int(atom)
        lit = ji.literal_value(atom)
        if lit is not None:
            return int(lit)
        return self.value(atom, out)

    # statements -----------------------------------------------------------
    def block(self, jaxpr: ji.Jaxpr, out: list[ir.Stmt]) -> None:
        outer = self.fallback_line
        for eqn in jaxpr.eqns:
            self.line = ji.user_source_line(eqn.source_info) or outer
            self.fallback_line = self.line
            self.eqn(eqn, out)
        self.fallback_line = outer

    def eqn(self, eqn: Any, out: list[ir.Stmt]) -> None:
        name = eqn.primitive.name
        p = eqn.params
        if name == "round":
            fn = "round" if int(p["rounding_method"]) == 1 else "round_away"
            self.emit(out, "elementwise", [self.value(eqn.invars[0], out)], eqn.outvars[0], fn=fn)
        elif name in _BINARY or name in _UNARY:
            ops = [self.value(v, out) for v in eqn.invars]
            self.emit(out, "elementwise", ops, eqn.outvars[0], fn=_BINARY.get(name) or _UNARY[name])
        elif name == "integer_pow":
            self.integer_pow(eqn, out)
        elif name == "convert_element_type":
            self.emit(out, "convert", [self.value(eqn.invars[0], out)], eqn.outvars[0])
        elif name == "select_n":
            if len(eqn.invars) != 3:
                raise self.error("select_n with more than two cases is not supported")
            self.emit(out, "select", [self.value(v, out) for v in eqn.invars], eqn.outvars[0])
        elif name == "clamp":
            lo, x, hi = (self.value(v, out) for v in eqn.invars)
            tmp = ir.Value(x.shape, x.dtype)
            out.append(ir.Op("elementwise", (x, lo), tmp, {"fn": "max"}, self.line))
            self.emit(out, "elementwise", [tmp, hi], eqn.outvars[0], fn="min")
        elif name == "broadcast_in_dim":
            self.emit(out, "broadcast", [self.value(eqn.invars[0], out)], eqn.outvars[0],
                      dims=tuple(p["broadcast_dimensions"]))
        elif name in ("reshape", "squeeze", "expand_dims"):
            self.emit(out, "reshape", [self.value(eqn.invars[0], out)], eqn.outvars[0])
        elif name == "transpose":
            self.emit(out, "transpose", [self.value(eqn.invars[0], out)], eqn.outvars[0],
                      perm=tuple(p["permutation"]))
        elif name == "iota":
            self.emit(out, "iota", [], eqn.outvars[0], dimension=p["dimension"])
        elif name in _REDUCE:
            self.emit(out, "reduce", [self.value(eqn.invars[0], out)], eqn.outvars[0],
                      fn=_REDUCE[name], axes=tuple(p["axes"]))
        elif name in _IDENTITY:
            self.env[eqn.outvars[0]] = self.read(eqn.invars[0], out)
        elif name in _INLINE:
            self.inline(eqn, p[_INLINE[name]], out)
        elif name == "get":
            ref, transforms = ji.ref_indexers(eqn)
            buf = self.buffer(ref)
            self.emit(out, "load", [], eqn.outvars[0], buffer=buf.name,
                      index=self.index(buf, transforms, out))
        elif name in ("swap", "addupdate"):
            self.store(eqn, out)
        elif name == "jt_copy":
            self.copy(eqn, out)
        elif name == "jt_gemm":
            a, b, c = (self.buffer(v) for v in eqn.invars)
            out.append(ir.Op("gemm", (), None, {"a": a.name, "b": b.name, "c": c.name,
                                                "transpose_a": p["transpose_a"],
                                                "transpose_b": p["transpose_b"]}, self.line))
        elif name == "scan":
            self.scan(eqn, out)
        elif name == "cond":
            self.cond(eqn, out)
        elif name == "while":
            raise self.error("loops with traced bounds are not supported yet; give "
                             "jt.loop/jt.pipelined static (Python int) bounds")
        else:
            raise self.error(f"the operation `{name}` is not supported in kernel bodies")

    def integer_pow(self, eqn: Any, out: list[ir.Stmt]) -> None:
        """``x ** y`` by binary exponentiation, multiplying in XLA's order (so that floats
        round the same way), then a reciprocal for negative ``y``."""
        x = self.value(eqn.invars[0], out)
        y = eqn.params["y"]

        def mul(a: ir.Value, b: ir.Value) -> ir.Value:
            res = ir.Value(x.shape, x.dtype)
            out.append(ir.Op("elementwise", (a, b), res, {"fn": "mul"}, self.line))
            return res

        acc, base, n = None, x, abs(y)
        while n > 0:
            if n & 1:
                acc = base if acc is None else mul(acc, base)
            n >>= 1
            if n > 0:
                base = mul(base, base)
        if acc is None:
            one = self.constant(1, x.dtype, out)
            self.emit(out, "broadcast", [one], eqn.outvars[0], dims=())
        elif y < 0:
            one = self.constant(1, x.dtype, out)
            self.emit(out, "elementwise", [one, acc], eqn.outvars[0], fn="div")
        else:
            self.env[eqn.outvars[0]] = acc

    def store(self, eqn: Any, out: list[ir.Stmt]) -> None:
        ref, transforms = ji.ref_indexers(eqn)
        buf = self.buffer(ref)
        if buf.role == "input":
            raise self.error(f"kernel inputs are read-only: the body writes to '{buf.name}'")
        index = self.index(buf, transforms, out)
        val = self.value(ji.value_operand(eqn), out)
        if eqn.primitive.name == "addupdate":
            old = ir.Value(val.shape, buf.dtype)
            out.append(ir.Op("load", (), old, {"buffer": buf.name, "index": index}, self.line))
            new = ir.Value(val.shape, buf.dtype)
            out.append(ir.Op("elementwise", (old, val), new, {"fn": "add"}, self.line))
            val = new
        else:
            # swap returns the old contents; dead-code elimination drops the load if unused.
            old = ir.Value(val.shape, buf.dtype)
            out.append(ir.Op("load", (), old, {"buffer": buf.name, "index": index}, self.line))
            self.env[eqn.outvars[0]] = old
        out.append(ir.Op("store", (val,), None, {"buffer": buf.name, "index": index},
                         self.line))

    def copy(self, eqn: Any, out: list[ir.Stmt]) -> None:
        p = eqn.params
        src, dst = self.buffer(eqn.invars[0]), self.buffer(eqn.invars[1])
        if dst.role == "input":
            raise self.error(f"kernel inputs are read-only: jt.copy writes to '{dst.name}'")
        starts = [self.scalar(v, out) for v in eqn.invars[2:]]
        n = len(p["src_sizes"])
        src_index = tuple(ir.Index(s, z) for s, z in zip(starts[:n], p["src_sizes"]))
        dst_index = tuple(ir.Index(s, z) for s, z in zip(starts[n:], p["dst_sizes"]))
        out.append(ir.Op("copy", (), None, {"src": src.name, "src_index": src_index,
                                            "dst": dst.name, "dst_index": dst_index,
                                            "pad": p["pad"]}, self.line))

    def inline(self, eqn: Any, sub: Any, out: list[ir.Stmt]) -> None:
        closed = sub if isinstance(sub, ji.ClosedJaxpr) else None
        jaxpr = closed.jaxpr if closed else sub
        if closed is not None:
            self.bind_consts(jaxpr, closed.consts, out)
        for var, atom in zip(jaxpr.invars, eqn.invars):
            self.env[var] = self.read(atom, out)
        line = self.line
        self.block(jaxpr, out)
        self.line = line
        for var, atom in zip(eqn.outvars, jaxpr.outvars):
            self.env[var] = self.read(atom, out)

    def scan(self, eqn: Any, out: list[ir.Stmt]) -> None:
        p = eqn.params
        closed = p["jaxpr"]
        body = closed.jaxpr
        n_consts, n_carry = p["num_consts"], p["num_carry"]
        if n_carry != 1 or len(eqn.invars) != n_consts + 1 or p["reverse"]:
            raise self.error("lax.scan / fori_loop with loop-carried values is not supported "
                             "in kernel bodies; use @jt.loop and keep state in refs")
        self.bind_consts(body, closed.consts, out)
        for var, atom in zip(body.invars[:n_consts], eqn.invars[:n_consts]):
            self.env[var] = self.read(atom, out)
        start = self.scalar(eqn.invars[n_consts], out)
        var = ir.Value((), np.int32)
        self.env[body.invars[n_consts]] = var
        kind, stages = "serial", 1
        for e in body.eqns:
            if e.primitive.name == "jt_loop_info" and e.invars[0] is body.invars[n_consts]:
                kind, stages = e.params["kind"], e.params["stages"]
        loop = ir.For(var, start, int(p["length"]), kind, stages, [], self.line)
        line = self.line
        self.block(body, loop.body)
        self.line = line
        out.append(loop)

    def cond(self, eqn: Any, out: list[ir.Stmt]) -> None:
        branches = eqn.params["branches"]
        if len(branches) != 2 or eqn.outvars:
            raise self.error("only two-way conditions without results are supported; "
                             "use @jt.when and write results to refs")
        index = self.value(eqn.invars[0], out)
        zero = ir.Value((), index.dtype)
        out.append(ir.Op("const", (), zero, {"value": 0}, self.line))
        pred = ir.Value((), np.bool_)
        out.append(ir.Op("elementwise", (index, zero), pred, {"fn": "ne"}, self.line))
        stmt = ir.If(pred, [], [], self.line)
        line = self.line
        for target, branch in ((stmt.otherwise, branches[0]), (stmt.then, branches[1])):
            self.bind_consts(branch.jaxpr, branch.consts, out)
            for var, atom in zip(branch.jaxpr.invars, eqn.invars[1:]):
                self.env[var] = self.read(atom, out)
            self.block(branch.jaxpr, target)
            self.line = line
        out.append(stmt)


def convert(name: str, closed: ji.ClosedJaxpr, buffers: Sequence[ir.Buffer],
            grid: tuple[int, ...], threads: int,
            index_axes: Sequence[int | None]) -> ir.Kernel:
    """Convert a traced kernel body into a Tile IR kernel (see the module docstring).

    ``index_axes[i]`` is the grid axis that the jaxpr's i-th block-index input reads, or
    None for an unused one (it reads as 0).
    """
    conv = _Converter(name, buffers)
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
    return ir.Kernel(name, tuple(grid), threads, tuple(buffers), block_indices, body)
