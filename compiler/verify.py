"""Tile IR verifier: structural and type checks with errors at the user's source line."""

from __future__ import annotations

from . import ir
from .errors import kernel_error


class _Verifier:
    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.buffers = {b.name: b for b in kernel.buffers}

    def fail(self, stmt: ir.Stmt, message: str):
        raise kernel_error(self.kernel.name, message, getattr(stmt, "line", None))

    def body(self, body: list[ir.Stmt], scope: set[int]) -> None:
        scope = set(scope)
        for stmt in body:
            for v in ir.uses(stmt):
                if v.id not in scope:
                    self.fail(stmt, f"internal: value {v!r} used outside its scope")
            if isinstance(stmt, ir.Op):
                self.op(stmt)
                if stmt.result is not None:
                    scope.add(stmt.result.id)
            elif isinstance(stmt, ir.For):
                if stmt.kind not in ir.LOOP_KINDS or stmt.extent < 0:
                    self.fail(stmt, f"invalid loop ({stmt.kind}, extent {stmt.extent})")
                self.body(stmt.body, scope | {stmt.var.id})
            else:
                if stmt.cond.shape != ():
                    self.fail(stmt, "a condition must be a scalar")
                self.body(stmt.then, scope)
                self.body(stmt.otherwise, scope)

    def access(self, op: ir.Op, name: str, index: tuple[ir.Index, ...]) -> ir.Buffer:
        buf = self.buffers.get(name)
        if buf is None:
            self.fail(op, f"internal: unknown buffer '{name}'")
        if len(index) != len(buf.shape):
            self.fail(op, f"{op.kind} of '{name}' has {len(index)} indices for rank "
                      f"{len(buf.shape)}")
        for i, dim in zip(index, buf.shape):
            if i.size is not None and i.size > dim and buf.scope != "global":
                self.fail(op, f"{op.kind}: a tile of {i.size} does not fit dimension {dim} "
                          f"of {buf.scope} buffer '{name}'")
        return buf

    def op(self, op: ir.Op) -> None:
        a = op.attrs
        if op.kind in ("load", "store"):
            buf = self.access(op, a["buffer"], a["index"])
            if op.kind == "store" and buf.role == "input":
                self.fail(op, f"kernel inputs are read-only: the body writes to '{buf.name}'")
            val = op.result if op.kind == "load" else op.operands[0]
            if val.shape != ir.tile_shape(a["index"]):
                self.fail(op, f"{op.kind} of '{buf.name}': value shape {val.shape} does not "
                          f"match the indexed tile {ir.tile_shape(a['index'])}")
        elif op.kind == "copy":
            self.access(op, a["src"], a["src_index"])
            dst = self.access(op, a["dst"], a["dst_index"])
            if dst.role == "input":
                self.fail(op, f"kernel inputs are read-only: jt.copy writes to '{dst.name}'")
            if ir.tile_shape(a["src_index"]) != ir.tile_shape(a["dst_index"]):
                self.fail(op, "jt.copy: source and destination tiles differ in shape")
        elif op.kind == "gemm":
            for role in ("a", "b", "c"):
                if self.buffers[a[role]].scope == "global":
                    self.fail(op, f"jt.gemm: operand {role} must be an on-chip tile")
        elif op.kind == "elementwise":
            if a["fn"] not in ir.ELEMENTWISE:
                self.fail(op, f"internal: unknown elementwise function {a['fn']}")
            for v in op.operands:
                if v.shape != () and (len(v.shape) != len(op.result.shape) or any(
                        n not in (1, m) for n, m in zip(v.shape, op.result.shape))):
                    self.fail(op, f"{a['fn']}: operand shape {v.shape} does not match "
                              f"{op.result.shape}")
        elif op.kind == "reduce" and a["fn"] not in ir.REDUCTIONS:
            self.fail(op, f"unsupported reduction {a['fn']}")


def verify(kernel: ir.Kernel) -> ir.Kernel:
    """Check ``kernel`` and return it unchanged; raise KernelError at the first fault."""
    _Verifier(kernel).body(kernel.body, {v.id for v in kernel.block_indices})
    return kernel
