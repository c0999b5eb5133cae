"""Tile IR verifier: everything the op definitions state, with errors at the user's line.

Checks buffers (scope and role from closed sets, positive static shapes), SSA scoping,
loops and conditions, and every op against its :mod:`.op_defs` definition: operand count,
attribute names and types, regions (known buffer, one index per dimension, on-chip tiles
that fit), read-only inputs, and the kind's own rule (result shape and dtype, reduce axes,
broadcast dimensions, gemm shapes...).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from . import ir, op_defs, sizes
from .errors import KernelError, kernel_error


class _Verifier:
    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.buffers = {b.name: b for b in kernel.buffers}

    def fail(self, where: ir.Stmt | ir.Buffer, message: str) -> KernelError:
        return kernel_error(self.kernel.name, message, getattr(where, "line", None))

    def check_buffers(self) -> None:
        if len(self.buffers) != len(self.kernel.buffers):
            raise self.fail(self.kernel.buffers[0], "internal: two buffers share a name")
        for b in self.kernel.buffers:
            if b.scope not in ir.SCOPES:
                raise self.fail(b, f"buffer '{b.name}' has unknown scope {b.scope!r} "
                                f"(expected one of {list(ir.SCOPES)})")
            if b.role not in ir.ROLES:
                raise self.fail(b, f"buffer '{b.name}' has unknown role {b.role!r} "
                                f"(expected one of {list(ir.ROLES)})")
            if b.role == "init" and not any(o.name == b.aliases and o.role == "output"
                                            and o.shape == b.shape and o.dtype == b.dtype
                                            for o in self.kernel.buffers):
                raise self.fail(b, f"init buffer '{b.name}' must alias an output of its type")
            if (b.role == "scratch") == (b.scope == "global"):
                raise self.fail(b, f"buffer '{b.name}': a {b.role} cannot live in {b.scope} "
                                "memory")
            if any(not _valid_size(n) or (isinstance(n, str) and b.scope != "global")
                   for n in b.shape):
                raise self.fail(b, f"buffer '{b.name}' has invalid shape {b.shape}")

    def body(self, body: Sequence[ir.Stmt], scope: set[int]) -> set[int]:
        """Check ``body`` given the values in ``scope``; the values visible after it."""
        scope = set(scope)
        for stmt in body:
            for v in ([] if isinstance(stmt, ir.While) else ir.uses(stmt)):
                if v.id not in scope:
                    raise self.fail(stmt, f"internal: value {v!r} used outside its scope")
            if isinstance(stmt, ir.Op):
                self.op(stmt)
                if stmt.result is not None:
                    scope.add(stmt.result.id)
            elif isinstance(stmt, ir.For):
                static_extent = not isinstance(stmt.extent, ir.Value)
                if (stmt.kind not in ir.LOOP_KINDS or stmt.stages < 1
                        or (static_extent and stmt.extent < 0)
                        or (stmt.kind == "unrolled" and not static_extent)):
                    raise self.fail(stmt, f"invalid loop ({stmt.kind}, extent {stmt.extent}, "
                                    f"stages {stmt.stages})")
                if any(isinstance(v, ir.Value) and v.shape != ()
                       for v in (stmt.var, stmt.start, stmt.extent)):
                    raise self.fail(stmt, "a loop index, start and extent must be scalars")
                self.body(stmt.body, scope | {stmt.var.id})
            elif isinstance(stmt, ir.While):
                inner = self.body(stmt.cond, scope)
                if (stmt.test.id not in inner or stmt.test.shape != ()
                        or stmt.test.dtype != np.bool_):
                    raise self.fail(stmt, "a while loop's test must be a scalar bool computed "
                                    "by its condition block")
                self.body(stmt.body, scope)
            else:
                if stmt.cond.shape != ():
                    raise self.fail(stmt, "a condition must be a scalar")
                self.body(stmt.then, scope)
                self.body(stmt.otherwise, scope)
        return scope

    def region(self, op: ir.Op, name: str, region: ir.Region) -> None:
        buf = self.buffers.get(region.buffer)
        if buf is None:
            raise self.fail(op, f"{op.kind}: unknown buffer '{region.buffer}'")
        if len(region.index) != len(buf.shape):
            raise self.fail(op, f"{op.kind} of '{buf.name}' has {len(region.index)} indices "
                            f"for rank {len(buf.shape)}")
        for i, dim in zip(region.index, buf.shape):
            if i.size is not None and i.size < 1:
                raise self.fail(op, f"{op.kind}: empty tile of '{buf.name}'")
            if isinstance(i.start, ir.Value) and i.start.shape != ():
                if not (op_defs.get(op.kind).indexed and i.start.shape == (i.size,)
                        and np.issubdtype(i.start.dtype, np.integer)):
                    raise self.fail(op, f"{op.kind}: a start into '{buf.name}' must be a "
                                    "scalar" + (f" or {i.size} integer positions"
                                                if op_defs.get(op.kind).indexed else ""))
                continue
            if buf.scope == "global":
                continue
            size = 1 if i.size is None else i.size
            if isinstance(dim, int) and size > dim:
                raise self.fail(op, f"{op.kind}: a tile of {size} does not fit dimension "
                                f"{dim} of {buf.scope} buffer '{buf.name}'")
        if name in op_defs.get(op.kind).writes and buf.role in ("input", "init"):
            what = "jt.copy writes" if op.kind == "copy" else "the body writes"
            raise self.fail(op, f"kernel inputs are read-only: {what} to '{buf.name}'")

    def op(self, op: ir.Op) -> None:
        try:
            d = op_defs.get(op.kind)
        except KeyError:
            raise self.fail(op, f"unknown op kind {op.kind!r}") from None
        if len(op.operands) not in (d.arity or range(1, len(op.operands) + 1)):
            arity = " or ".join(map(str, d.arity)) if d.arity else "one or more"
            raise self.fail(op, f"{op.kind} takes {arity} operand(s), got {len(op.operands)}")
        if (op.result is not None) != d.has_result:
            raise self.fail(op, f"{op.kind} {'must' if d.has_result else 'cannot'} have a "
                            "result")
        if set(op.attrs) != set(d.attrs):
            raise self.fail(op, f"{op.kind} has attributes {sorted(op.attrs)}, expected "
                            f"{sorted(d.attrs)}")
        for name, type_name in d.attrs.items():
            test, expected = op_defs.ATTR_TYPES[type_name]
            if not test(op.attrs[name]):
                raise self.fail(op, f"{op.kind}: attribute {name}={op.attrs[name]!r} must be "
                                f"{expected}")
            if type_name == "region":
                self.region(op, name, op.attrs[name])
        self.storage_types(op, d)
        message = d.check(op, self.buffers) if d.check is not None else None
        if message is not None:
            raise self.fail(op, message)

    def storage_types(self, op: ir.Op, d: op_defs.OpDef) -> None:
        """An 8-bit float only in an op that takes it: the others would compute in it."""
        values = [*op.operands, *([op.result] if op.result is not None else [])]
        dtypes = {v.dtype for v in values} | {self.buffers[r.buffer].dtype
                                             for r in d.read_regions(op) + d.write_regions(op)
                                             if r.buffer in self.buffers}
        fn = op.attrs.get("fn")
        accepted = d.accepts(fn if isinstance(fn, str) else None)
        for dtype in sorted(dtypes & op_defs.FLOAT8 - accepted, key=str):
            what = f"{op.kind} {fn}" if isinstance(fn, str) else op.kind
            raise self.fail(op, f"{what} on {dtype}: 8-bit floats are storage types (load, "
                            "store, copy, convert, jt.gemm operands); convert to float32 "
                            "first, e.g. x.astype(jnp.float32), and back when storing")


def _valid_size(n: object) -> bool:
    """A non-negative int, or a size expression (whose value is only known at run time)."""
    if isinstance(n, str):
        try:
            sizes.parse(n)
        except ValueError:
            return False
        return True
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def requested() -> bool:
    """Whether ``JAXTILE_VERIFY_IR`` asks for the checks after every pass (and code
    generation's round trip, :mod:`.gpu.codegen.lower`); the test suite sets it."""
    return os.environ.get("JAXTILE_VERIFY_IR", "") not in ("", "0")


def verify(kernel: ir.Kernel) -> ir.Kernel:
    """Check ``kernel`` and return it unchanged; raise KernelError at the first fault."""
    v = _Verifier(kernel)
    v.check_buffers()
    if (any(not _valid_size(n) or (isinstance(n, int) and n < 1) for n in kernel.grid)
            or kernel.threads < 1):
        raise kernel_error(kernel.name, f"invalid launch: grid {list(kernel.grid)}, "
                           f"{kernel.threads} threads", None)
    v.body(kernel.body, {b.id for b in kernel.block_indices})
    return kernel
