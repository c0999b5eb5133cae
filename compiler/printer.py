"""Text form of Tile IR, for people and for content keys.

Values are renumbered in order of definition, so two structurally equal kernels print the
same text; ``with_lines=False`` leaves out source lines (the content key must not change when
code merely moves).
"""

from __future__ import annotations

from typing import Any

from . import ir


class _Names:
    def __init__(self) -> None:
        self.ids: dict[int, int] = {}

    def define(self, v: ir.Value) -> str:
        self.ids[v.id] = len(self.ids)
        return self(v)

    def __call__(self, v: Any) -> str:
        if isinstance(v, ir.Value):
            return f"%{self.ids.get(v.id, '?' + str(v.id))}"
        return repr(v)


def _ty(v: ir.Value) -> str:
    return f"{v.dtype.name}{list(v.shape)}"


def _index(names: _Names, index: tuple[ir.Index, ...]) -> str:
    parts = []
    for i in index:
        start = names(i.start)
        parts.append(start if i.size is None else f"{start}:+{i.size}")
    return "[" + ", ".join(parts) + "]"


def _attrs(names: _Names, op: ir.Op) -> str:
    items = []
    for key in sorted(op.attrs):
        val = op.attrs[key]
        text = _index(names, val) if key.endswith("index") else repr(val)
        items.append(f"{key}={text}")
    return " {" + ", ".join(items) + "}" if items else ""


def _stmts(body: list[ir.Stmt], names: _Names, depth: int, lines: bool, out: list[str]):
    pad = "  " * depth
    for stmt in body:
        where = f"  # {stmt.line}" if lines and stmt.line else ""
        if isinstance(stmt, ir.Op):
            args = ", ".join(names(v) for v in stmt.operands)
            lhs = f"{names.define(stmt.result)}: {_ty(stmt.result)} = " if stmt.result else ""
            out.append(f"{pad}{lhs}{stmt.kind}({args}){_attrs(names, stmt)}{where}")
        elif isinstance(stmt, ir.For):
            var = names.define(stmt.var)
            stages = f", stages={stmt.stages}" if stmt.kind == "pipelined" else ""
            out.append(f"{pad}for {var} in {stmt.kind}({names(stmt.start)}, +{stmt.extent}"
                       f"{stages}):{where}")
            _stmts(stmt.body, names, depth + 1, lines, out)
        else:
            out.append(f"{pad}if {names(stmt.cond)}:{where}")
            _stmts(stmt.then, names, depth + 1, lines, out)
            if stmt.otherwise:
                out.append(f"{pad}else:")
                _stmts(stmt.otherwise, names, depth + 1, lines, out)


def format_kernel(kernel: ir.Kernel, *, with_lines: bool = True) -> str:
    """The kernel as text; see the module docstring."""
    names = _Names()
    blocks = ", ".join(names.define(v) for v in kernel.block_indices)
    out = [f"kernel {kernel.name}(grid={list(kernel.grid)}, threads={kernel.threads}) "
           f"blocks({blocks}):"]
    for b in kernel.buffers:
        where = f"  # {b.line}" if with_lines and b.line else ""
        out.append(f"  {b.role} {b.name}: {b.scope} {b.dtype.name}{list(b.shape)}{where}")
    _stmts(kernel.body, names, 1, with_lines, out)
    return "\n".join(out)
