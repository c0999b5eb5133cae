"""Text form of Tile IR, for people, for content keys and for golden pass tests.

Values are renumbered in order of definition, so two structurally equal kernels print the
same text. ``with_lines=False`` leaves out source lines and ``with_notes=False`` pass
annotations: the content key is the text without either, so it changes neither when code
merely moves nor when a later pass annotates the IR. :mod:`.parser` reads the text back.

::

    kernel k(grid=[3], threads=128) blocks(%0):
      input x: global float32[10, 16]
      scratch frag0: fragment float32[4, 16]  # user.py:7
      %1: int32[] = const() {value=4}
      %2: int32[] = elementwise(%0, %1) {fn='mul'}
      copy() {dst=frag0[0:+4, 0:+16], pad=None, src=x[%2:+4, 0:+16]}  # user.py:8
      %3: float32[4, 16] = load() {src=frag0[0:+4, 0:+16]} !{inline=True}
      %5: float32[4, 16]#blocked(vec 4, threads 4x4) = ...     (GPU layouts, as notes)
      for %4 in serial(0, +8):
        ...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import ir
from .sizes import Size


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


def type_text(shape: Sequence[Size], dtype: Any) -> str:
    """``float32[4, 16]``: how the IR text writes a tile type (a dynamic size is written as
    its expression, ``float32[x_0, 16]``)."""
    return f"{dtype.name}{_dims(shape)}"


def _dims(dims: Sequence[Size]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _layout_suffix(layout: Any) -> str:
    """A GPU layout annotation after a type: ``#mma(m16n8k16, warps 2x2)``."""
    return "" if layout is None else layout.text()


def _region(names: _Names, region: ir.Region) -> str:
    parts = []
    for i in region.index:
        start = names(i.start)
        parts.append(start if i.size is None else f"{start}:+{i.size}")
    return f"{region.buffer}[{', '.join(parts)}]"


def _value(names: _Names, val: Any) -> str:
    if isinstance(val, ir.Region):
        return _region(names, val)
    if isinstance(val, ir.Value):
        return names(val)
    if isinstance(val, tuple):
        inner = ", ".join(_value(names, v) for v in val)
        return f"({inner},)" if len(val) == 1 else f"({inner})"
    return repr(val)


def _mapping(names: _Names, attrs: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={_value(names, attrs[k])}" for k in sorted(attrs)) + "}"


class _Printer:
    def __init__(self, lines: bool, notes: bool):
        self.names = _Names()
        self.lines = lines
        self.notes = notes
        self.out: list[str] = []

    def where(self, line: str | None) -> str:
        return f"  # {line}" if self.lines and line else ""

    def stmts(self, body: Sequence[ir.Stmt], depth: int) -> None:
        pad = "  " * depth
        for stmt in body:
            where = self.where(stmt.line)
            if isinstance(stmt, ir.Op):
                self.out.append(f"{pad}{self.op(stmt)}{where}")
            elif isinstance(stmt, ir.For):
                start, extent = self.names(stmt.start), self.names(stmt.extent)
                var = self.names.define(stmt.var)
                stages = f", stages={stmt.stages}" if stmt.kind == "pipelined" else ""
                if stmt.warp_specialize is not None:
                    stages += f", warp_specialize={stmt.warp_specialize}"
                if stmt.pingpong is not None:
                    stages += f", pingpong={stmt.pingpong}"
                self.out.append(f"{pad}for {var} in {stmt.kind}({start}, +{extent}"
                                f"{stages}):{where}")
                self.stmts(stmt.body, depth + 1)
            elif isinstance(stmt, ir.While):
                self.out.append(f"{pad}while:{where}")
                self.stmts(stmt.cond, depth + 1)
                self.out.append(f"{pad}do {self.names(stmt.test)}:")
                self.stmts(stmt.body, depth + 1)
            else:
                self.out.append(f"{pad}if {self.names(stmt.cond)}:{where}")
                self.stmts(stmt.then, depth + 1)
                if stmt.otherwise:
                    self.out.append(f"{pad}else:")
                    self.stmts(stmt.otherwise, depth + 1)

    def op(self, op: ir.Op) -> str:
        args = ", ".join(self.names(v) for v in op.operands)
        attrs = f" {_mapping(self.names, op.attrs)}" if op.attrs else ""
        shown = {k: v for k, v in op.notes.items() if k != "layout"}
        notes = f" !{_mapping(self.names, shown)}" if self.notes and shown else ""
        lhs = ""
        if op.result is not None:
            res = op.result
            layout = _layout_suffix(op.notes.get("layout")) if self.notes else ""
            lhs = f"{self.names.define(res)}: {type_text(res.shape, res.dtype)}{layout} = "
        return f"{lhs}{op.kind}({args}){attrs}{notes}"


def format_kernel(kernel: ir.Kernel, *, with_lines: bool = True,
                  with_notes: bool = True) -> str:
    """The kernel as text; see the module docstring."""
    p = _Printer(with_lines, with_notes)
    blocks = ", ".join(p.names.define(v) for v in kernel.block_indices)
    p.out.append(f"kernel {kernel.name}(grid={_dims(kernel.grid)}, threads={kernel.threads}) "
                 f"blocks({blocks}):")
    for b in kernel.buffers:
        aliases = f" -> {b.aliases}" if b.aliases else ""
        # A buffer's layout is part of the key: before the GPU passes only a user's
        # annotation (jt.annotate_layout) can be there, and it changes the code.
        layout = _layout_suffix(b.layout)
        attrs = f" {_mapping(p.names, b.attrs)}" if b.attrs else ""
        p.out.append(f"  {b.role} {b.name}: {b.scope} {type_text(b.shape, b.dtype)}{layout}"
                     f"{aliases}{attrs}{p.where(b.line)}")
    p.stmts(kernel.body, 1)
    return "\n".join(p.out)


def key_text(kernel: ir.Kernel) -> str:
    """The text a content key hashes: no source lines, no pass annotations."""
    return format_kernel(kernel, with_lines=False, with_notes=False)
