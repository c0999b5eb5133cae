"""Dynamic sizes: integer expressions over named sizes that are only known when a kernel runs.

A kernel declared with ``dynamic=`` is traced once more with JAX symbolic dimensions in place
of the dynamic sizes (``jax.export.symbolic_shape``), so every quantity the body derives from
them (the grid, an output's shape, a loop bound) comes out as an expression such as
``floordiv(x_0 + 3, 4)``. The Tile IR keeps such an expression as its canonical text, with no
spaces (``floordiv(x_0+3,4)``): a buffer dimension or a grid extent is an ``int`` or that text.
This module parses the text (JAX's own spelling is accepted too), prints it back and
evaluates it, either to an ``int`` or, through :func:`fold`, to a backend's expression type.

Grammar: sums and differences of products of atoms; an atom is an integer, a name, a
parenthesised expression, a unary minus, or ``floordiv``/``mod``/``max``/``min`` of two
expressions. ``floordiv`` and ``mod`` round towards negative infinity, as in Python and JAX.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Size = int | str
"""A buffer dimension or grid extent: static, or the text of a size expression."""

_FUNCTIONS = ("floordiv", "mod", "max", "min")
_TOKEN = re.compile(r"\s*(?:(?P<int>\d+)|(?P<name>[A-Za-z_][A-Za-z_0-9]*)|(?P<op>[-+*(),]))")

Expr = tuple
"""Parsed form: ``("int", v)``, ``("sym", name)``, ``("neg", e)``, or ``(op, a, b)`` with op
one of ``+ - *`` and the functions above."""


def parse(text: str) -> Expr:
    """Parse a size expression; ValueError if it is not one."""
    tokens = []
    pos = 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"bad size expression {text!r} at {text[pos:]!r}")
        tokens.append((m.lastgroup, m.group(m.lastgroup)))
        pos = m.end()
    parser = _Parser(tokens, text)
    expr = parser.sum()
    if parser.i != len(tokens):
        raise ValueError(f"bad size expression {text!r}")
    return expr


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]], text: str):
        self.tokens, self.text, self.i = tokens, text, 0

    def _peek(self) -> str | None:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.tokens) or (expected and self.tokens[self.i][1] != expected):
            raise ValueError(f"bad size expression {self.text!r}")
        self.i += 1
        return self.tokens[self.i - 1]

    def sum(self) -> Expr:
        expr = self.product()
        while self._peek() in ("+", "-"):
            op = self._take()[1]
            expr = (op, expr, self.product())
        return expr

    def product(self) -> Expr:
        expr = self.atom()
        while self._peek() == "*":
            self._take()
            expr = ("*", expr, self.atom())
        return expr

    def atom(self) -> Expr:
        kind, text = self._take()
        if kind == "int":
            return ("int", int(text))
        if text == "-":
            return ("neg", self.atom())
        if text == "(":
            expr = self.sum()
            self._take(")")
            return expr
        if kind == "name" and text in _FUNCTIONS:
            self._take("(")
            a = self.sum()
            self._take(",")
            b = self.sum()
            self._take(")")
            return (text, a, b)
        if kind == "name":
            return ("sym", text)
        raise ValueError(f"bad size expression {self.text!r}")


def _format(e: Expr, parent: int = 0) -> str:
    kind = e[0]
    if kind == "int":
        return str(e[1])
    if kind == "sym":
        return e[1]
    if kind == "neg":
        return f"-{_format(e[1], 3)}"
    if kind in _FUNCTIONS:
        return f"{kind}({_format(e[1])},{_format(e[2])})"
    level = 1 if kind in "+-" else 2
    text = f"{_format(e[1], level)}{kind}{_format(e[2], level + (kind == '-'))}"
    return f"({text})" if level < parent else text


def canonical(size: Any) -> Size:
    """An ``int`` for a static size, else the canonical text of the expression (``size`` may
    be a JAX symbolic dimension, its string, or an int)."""
    if isinstance(size, numbers.Integral):
        return int(size)
    return _format(parse(str(size)))


def symbols(size: Size) -> set[str]:
    """The names a size refers to."""
    if isinstance(size, int):
        return set()
    found: set[str] = set()

    def visit(e: Expr) -> None:
        if e[0] == "sym":
            found.add(e[1])
        elif e[0] != "int":
            for sub in e[1:]:
                visit(sub)

    visit(parse(size))
    return found


def fold(size: Size, leaf: Callable[[str], Any], ops: Mapping[str, Callable[..., Any]]) -> Any:
    """Evaluate ``size`` with ``leaf(name)`` for names and ``ops[op](a, b)`` (``ops["neg"](a)``)
    for operators; integers are passed to the ops as Python ints."""
    if isinstance(size, int):
        return size

    def go(e: Expr) -> Any:
        if e[0] == "int":
            return e[1]
        if e[0] == "sym":
            return leaf(e[1])
        return ops[e[0]](*(go(sub) for sub in e[1:]))

    return go(parse(size))


_INT_OPS: Mapping[str, Callable[..., int]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "neg": lambda a: -a, "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
    "max": max, "min": min,
}


def evaluate(size: Size, env: Mapping[str, int]) -> int:
    """The value of ``size`` for the named sizes in ``env``."""
    return int(fold(size, lambda name: env[name], _INT_OPS))


def is_static(shape: Sequence[Size]) -> bool:
    """Whether every dimension of ``shape`` is an int."""
    return all(isinstance(d, int) for d in shape)


def split_dims(text: str) -> list[str]:
    """Split ``"a, floordiv(b,4), 8"`` at its top-level commas."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        depth += (ch == "(") - (ch == ")")
        current += ch
    if current.strip():
        parts.append(current.strip())
    return parts


def parse_size(text: str) -> Size:
    """A dimension as printed in Tile IR text: an int or a size expression."""
    text = text.strip()
    return int(text) if re.fullmatch(r"-?\d+", text) else canonical(text)
