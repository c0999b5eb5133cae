"""Read Tile IR text (as :mod:`.printer` writes it) back into a kernel.

``format_kernel(parse_kernel(text)) == text`` for any printed kernel, so pass tests can be
golden before/after texts. Malformed text raises ``ValueError`` naming the line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from . import ir, sizes

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<value>%\d+)
    | (?P<number>-?(?:\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+|\d+))
    | (?P<name>-?[A-Za-z_][A-Za-z_0-9]*)
    | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    | (?P<punct>[\[\](){},:+=!])
    )""", re.VERBOSE)
_CONSTANTS = {"True": True, "False": False, "None": None, "inf": float("inf"),
              "-inf": float("-inf"), "nan": float("nan")}
_TYPE = re.compile(r"([A-Za-z_0-9]+)\[([^\]]*)\]$")


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name)) if name == "bfloat16" else np.dtype(name)


parse_layout: Callable[[str, tuple[int, ...], int], Any] | None = None
"""The reader of layout annotations (``#mma(...)``; text, tile shape, threads per block):
the GPU tier's ``layout.parse``, set by ``compiler/__init__.py`` so that this core module
imports no backend."""


def _layout(text: str | None, shape: tuple[int, ...], threads: int) -> Any:
    """A GPU layout annotation (``#mma(...)``), read by the layout module itself."""
    if not text:
        return None
    if parse_layout is None:
        raise ValueError(f"layout {text!r}: no reader of GPU layouts is registered")
    return parse_layout(text, shape, threads)


def _type(text: str) -> tuple[tuple[int, ...], np.dtype]:
    m = _TYPE.match(text.strip())
    if m is None:
        raise ValueError(f"bad type {text!r}")
    return tuple(sizes.parse_size(d) for d in sizes.split_dims(m.group(2))), _dtype(m.group(1))


class _Tokens:
    def __init__(self, text: str, values: dict[str, ir.Value]):
        self.toks: list[tuple[str, str]] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise ValueError(f"unexpected text at {text[pos:]!r}")
            self.toks.append((m.lastgroup, m.group(m.lastgroup)))
            pos = m.end()
        self.i = 0
        self.values = values

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise ValueError("unexpected end of line")
        tok = self.toks[self.i]
        if expected is not None and tok[1] != expected:
            raise ValueError(f"expected {expected!r}, got {tok[1]!r}")
        self.i += 1
        return tok

    def done(self) -> bool:
        return self.i >= len(self.toks)

    def value_ref(self, text: str) -> ir.Value:
        if text not in self.values:
            raise ValueError(f"{text} is used before it is defined")
        return self.values[text]

    def start(self) -> int | ir.Value:
        kind, text = self.take()
        if kind == "value":
            return self.value_ref(text)
        if kind == "number":
            return int(text)
        raise ValueError(f"bad index start {text!r}")

    def region(self, buffer: str) -> ir.Region:
        self.take("[")
        index = []
        while self.peek() != "]":
            start = self.start()
            size = None
            if self.peek() == ":":
                self.take(":")
                self.take("+")
                size = int(self.take()[1])
            index.append(ir.Index(start, size))
            if self.peek() == ",":
                self.take(",")
        self.take("]")
        return ir.Region(buffer, tuple(index))

    def literal(self) -> Any:
        kind, text = self.take()
        if kind == "value":
            return self.value_ref(text)
        if kind == "number":
            return ast.literal_eval(text)
        if kind == "string":
            return ast.literal_eval(text)
        if kind == "name":
            if self.peek() == "[":
                return self.region(text)
            if text in _CONSTANTS:
                return _CONSTANTS[text]
            raise ValueError(f"unknown name {text!r}")
        if text == "(":
            items = []
            while self.peek() != ")":
                items.append(self.literal())
                if self.peek() == ",":
                    self.take(",")
            self.take(")")
            return tuple(items)
        raise ValueError(f"unexpected {text!r}")

    def mapping(self) -> dict[str, Any]:
        self.take("{")
        out = {}
        while self.peek() != "}":
            key = self.take()[1]
            self.take("=")
            out[key] = self.literal()
            if self.peek() == ",":
                self.take(",")
        self.take("}")
        return out

    def operands(self) -> list[ir.Value]:
        self.take("(")
        vals = []
        while self.peek() != ")":
            vals.append(self.value_ref(self.take()[1]))
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return vals


def _split_line(raw: str) -> tuple[int, str, str | None]:
    """Indentation depth, code, and the source-line comment of one line."""
    stripped = raw.lstrip(" ")
    depth = (len(raw) - len(stripped)) // 2
    code, sep, where = stripped.partition("  # ")
    return depth, code, (where if sep else None)


class _Parser:
    def __init__(self, text: str):
        self.lines = [ln for ln in text.splitlines() if ln.strip()]
        self.pos = 0
        self.values: dict[str, ir.Value] = {}

    def error(self, message: str) -> ValueError:
        return ValueError(f"Tile IR line {self.pos + 1}: {message}: {self.lines[self.pos]!r}")

    def define(self, name: str, shape: tuple[int, ...], dtype: Any) -> ir.Value:
        v = ir.Value(shape, dtype)
        self.values[name] = v
        return v

    def kernel(self) -> ir.Kernel:
        m = re.match(r"kernel (\S+)\(grid=\[([^\]]*)\], threads=(\d+)\) blocks\(([^)]*)\):$",
                     self.lines[0])
        if m is None:
            raise self.error("expected a kernel header")
        name, threads = m.group(1), int(m.group(3))
        grid = tuple(sizes.parse_size(g) for g in sizes.split_dims(m.group(2)))
        blocks = tuple(self.define(b.strip(), (), np.int32)
                       for b in m.group(4).split(",") if b.strip())
        self.pos = 1
        self.threads = threads
        buffers = []
        while self.pos < len(self.lines):
            _, code, where = _split_line(self.lines[self.pos])
            m = re.match(r"(\w+) (\w+): (\w+) (\w+\[[^\]]*\])(#.*?)?(?: -> (\w+))?"
                         r"(?: (\{.*\}))?$", code)
            if m is None or code.startswith(("%", "for ", "if ")):
                break
            shape, dtype = _type(m.group(4))
            try:
                attrs = _Tokens(m.group(7), self.values).mapping() if m.group(7) else {}
            except ValueError as e:
                raise self.error(str(e)) from None
            buffers.append(ir.Buffer(m.group(2), shape, dtype, m.group(3), m.group(1), where,
                                     m.group(6), _layout(m.group(5), shape, threads), attrs))
            self.pos += 1
        body = self.body(1)
        if self.pos != len(self.lines):
            raise self.error("unexpected indentation")
        return ir.Kernel(name, grid, threads, tuple(buffers), blocks, body)

    def body(self, depth: int) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        while self.pos < len(self.lines):
            d, code, where = _split_line(self.lines[self.pos])
            if d < depth or code == "else:" or code.startswith("do %"):
                break
            if d > depth:
                raise self.error("unexpected indentation")
            try:
                out.append(self.stmt(code, where, depth))
            except ValueError as e:
                if str(e).startswith("Tile IR line"):
                    raise
                raise self.error(str(e)) from None
        return out

    def stmt(self, code: str, where: str | None, depth: int) -> ir.Stmt:
        m = re.match(r"for (%\d+) in (\w+)\((\S+), \+(\S+?)(?:, stages=(\d+))?"
                     r"(?:, warp_specialize=(True|False))?(?:, pingpong=(True|False))?\):$", code)
        if m is not None:
            start = _Tokens(m.group(3), self.values).start()
            extent = _Tokens(m.group(4), self.values).start()
            var = self.define(m.group(1), (), np.int32)
            self.pos += 1
            body = self.body(depth + 1)
            ws, pp = (None if g is None else g == "True" for g in m.group(6, 7))
            return ir.For(var, start, extent, m.group(2), int(m.group(5) or 1), body, where,
                          ws, pp)
        if code == "while:":
            self.pos += 1
            cond = self.body(depth + 1)
            m = re.match(r"do (%\d+):$", _split_line(self.lines[self.pos])[1]) \
                if self.pos < len(self.lines) else None
            if m is None:
                raise self.error("expected `do %<test>:` after a while condition")
            test = _Tokens(m.group(1), self.values).start()
            self.pos += 1
            return ir.While(cond, test, self.body(depth + 1), where)
        m = re.match(r"if (%\d+):$", code)
        if m is not None:
            cond = _Tokens(m.group(1), self.values).start()
            self.pos += 1
            then = self.body(depth + 1)
            otherwise: list[ir.Stmt] = []
            if self.pos < len(self.lines) and _split_line(self.lines[self.pos])[1] == "else:":
                self.pos += 1
                otherwise = self.body(depth + 1)
            return ir.If(cond, then, otherwise, where)
        result_name = None
        layout_text = None
        m = re.match(r"(%\d+): (\S+\[[0-9, ]*\])(#.*?)? = (.*)$", code)
        if m is not None:
            result_name, result_type, layout_text, code = m.groups()
        kind, _, rest = code.partition("(")
        toks = _Tokens("(" + rest, self.values)
        operands = toks.operands()
        attrs = toks.mapping() if toks.peek() == "{" else {}
        notes = {}
        if toks.peek() == "!":
            toks.take("!")
            notes = toks.mapping()
        if not toks.done():
            raise ValueError("trailing text")
        result = None
        if result_name is not None:
            shape, dtype = _type(result_type)
            result = self.define(result_name, shape, dtype)
            if layout_text:
                notes["layout"] = _layout(layout_text, shape, self.threads)
        self.pos += 1
        return ir.Op(kind.strip(), tuple(operands), result, attrs, where, notes)


def parse_kernel(text: str) -> ir.Kernel:
    """The kernel that ``text`` (as printed by ``format_kernel``) describes."""
    return _Parser(text).kernel()
