"""Integer scalars as symbolic expressions, for the passes that prove facts about indices.

Every integer scalar of a kernel is turned into an expression (:data:`Expr`) over symbols:
block indices, loop variables and dynamic sizes (symbols of ``compiler.sizes``
expressions, ``>= 0``), and a fresh symbol for what is not modelled (values read from
memory, unsigned and narrowing arithmetic); the integer ``elementwise`` ops (``add sub mul
div rem max min neg``; ``div`` and ``rem`` truncate, as in XLA), ``const``, ``convert`` and
``size`` combine them, and comparisons with their ``and``/``or``/``not`` become conditions.
:class:`Facts` holds the expressions and the conditions known at a point of the kernel; a
prover (``gpu/bounds.py``: TVM's analyzer, z3) decides goals under them. :func:`interval`
bounds an expression from constant bounds of its symbols (no prover needed), :func:`value`
evaluates one at given symbol values.

Assumes what the index arithmetic of a kernel assumes elsewhere: signed index arithmetic
does not overflow (buffers and grids have fewer than 2^31 elements), so expressions are
over the integers. Unlike the ranges of :mod:`.scalars`, which model the wrap-around,
these do not; a value whose dtype could wrap (unsigned, narrowed) is a fresh symbol.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

from .. import ir, sizes
from .scalars import truncdiv

Expr = tuple
"""``("int", v)``, ``("sym", name)``, ``("neg", e)``, ``(op, a, b)`` with op in ``+ - *
floordiv mod max min div rem`` (the last two truncate), conditions ``(cmp, a, b)`` with cmp
in ``< <= == !=`` and ``("and"|"or", c, d)``, ``("not", c)``."""

_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "div", "rem": "rem", "max": "max",
          "min": "min"}
_CMP = {"lt": ("<", False), "le": ("<=", False), "gt": ("<", True), "ge": ("<=", True),
        "eq": ("==", False), "ne": ("!=", False)}


@dataclasses.dataclass
class Facts:
    """What is known at a point of the kernel: variables with their constraints."""

    exprs: dict[int, Expr]
    conds: list[Expr]
    syms: set[str]
    ranges: dict[str, tuple[int, int]]
    """Constant bounds of some variables (block indices of a static grid, loops with
    bounded ends), for :func:`interval`."""
    fresh: int = 0

    def of(self, x: int | ir.Value) -> Expr | None:
        return ("int", x) if isinstance(x, int) else self.exprs.get(x.id)

    def unknown(self) -> Expr:
        self.fresh += 1
        return ("sym", f"_u{self.fresh}")

    def size(self, size: sizes.Size) -> Expr:
        if isinstance(size, int):
            return ("int", size)
        for s in sizes.symbols(size) - self.syms:   # only the kernel's own sizes, at the top
            self.syms.add(s)
            self.conds.append(("<=", ("int", 0), ("sym", s)))
        return sizes.parse(size)


def _ints(op: ir.Op) -> bool:
    """Whether every operand is a signed integer scalar."""
    return bool(op.operands) and all(v.dtype.kind == "i" and v.shape == () for v in op.operands)


def define(op: ir.Op, facts: Facts) -> None:
    """Record ``op``'s integer or bool scalar result in ``facts``: its expression, or a fresh
    symbol for an integer the expressions do not model (a bool then has none)."""
    res = op.result
    # Unsigned values wrap at zero, which integer arithmetic does not model: left undefined,
    # so whatever depends on them keeps its mask.
    if res is None or res.shape != () or res.dtype.kind not in "ib":
        return
    args = [facts.of(v) for v in op.operands]
    expr: Expr | None = None
    if op.kind == "const":
        v = int(op.attrs["value"])
        expr = ("int", v) if res.dtype.kind == "i" else ("==", ("int", 0), ("int", 1 - v))
    elif op.kind == "size":
        expr = facts.size(op.attrs["expr"])
    elif op.kind == "convert" and _ints(op) and res.dtype.kind == "i" \
            and res.dtype.itemsize >= op.operands[0].dtype.itemsize:   # no narrowing wrap
        expr = args[0]
    elif op.kind == "elementwise" and None not in args:
        fn, kind = op.attrs["fn"], res.dtype.kind
        if fn in _ARITH and kind == "i" and _ints(op):
            expr = (_ARITH[fn], *args)
        elif fn == "neg" and kind == "i" and _ints(op):
            expr = ("neg", args[0])
        elif fn in _CMP and _ints(op):
            cmp, swap = _CMP[fn]
            expr = (cmp, *(args[::-1] if swap else args))
        elif fn in ("and", "or", "not") and kind == "b" and \
                all(v.dtype.kind == "b" for v in op.operands):
            expr = (fn, *args)
    if expr is None and res.dtype.kind != "b":
        expr = facts.unknown()
    if expr is not None:
        facts.exprs[res.id] = expr


def interval(e: Expr, ranges: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    """Constant bounds of ``e`` (sound, not tight), or None."""
    if e[0] == "int":
        return e[1], e[1]
    if e[0] == "sym":
        return ranges.get(e[1])
    if e[0] not in ("+", "-", "*", "max", "min", "floordiv"):
        return None
    a, b = interval(e[1], ranges), interval(e[2], ranges)
    if a is None or b is None:
        return None
    if e[0] == "+":
        return a[0] + b[0], a[1] + b[1]
    if e[0] == "-":
        return a[0] - b[1], a[1] - b[0]
    if e[0] == "max":
        return max(a[0], b[0]), max(a[1], b[1])
    if e[0] == "min":
        return min(a[0], b[0]), min(a[1], b[1])
    if e[0] == "floordiv" and b[0] <= 0:
        return None
    f = (lambda x, y: x * y) if e[0] == "*" else (lambda x, y: x // y)
    corners = [f(x, y) for x in a for y in b]
    return min(corners), max(corners)


Bound = tuple[int | None, int | None]
"""A lower and an upper bound, either None where there is none."""

_INF = float("inf")


def _ends(b: Bound) -> tuple[Any, Any]:
    return (-_INF if b[0] is None else b[0]), (_INF if b[1] is None else b[1])


def _bound(lo: Any, hi: Any) -> Bound:
    return (None if lo == -_INF else lo), (None if hi == _INF else hi)


def _times(x: Any, y: Any) -> Any:
    # An infinite end is not a value: 0 times it is 0, which keeps [0, inf) * [2, 2] at
    # [0, inf).
    return 0 if x == 0 or y == 0 else x * y


def half_interval(e: Expr, ranges: dict[str, Bound]) -> Bound:
    """Bounds of ``e`` (sound, not tight) where each may be missing: what :func:`interval`
    gives, also for symbols known only from one side (a loop variable ``>= 0`` whose end is
    read from memory). Finite ends stay Python ints."""
    if e[0] == "int":
        return e[1], e[1]
    if e[0] == "sym":
        return ranges.get(e[1], (None, None))
    if e[0] == "neg":
        lo, hi = _ends(half_interval(e[1], ranges))
        return _bound(-hi, -lo)
    if e[0] not in ("+", "-", "*", "max", "min", "floordiv"):
        return None, None
    (a0, a1), (b0, b1) = (_ends(half_interval(x, ranges)) for x in e[1:])
    if e[0] == "+":
        return _bound(a0 + b0, a1 + b1)
    if e[0] == "-":
        return _bound(a0 - b1, a1 - b0)
    if e[0] == "max":
        return _bound(max(a0, b0), max(a1, b1))
    if e[0] == "min":
        return _bound(min(a0, b0), min(a1, b1))
    if e[0] == "*":
        corners = [_times(x, y) for x in (a0, a1) for y in (b0, b1)]
        return _bound(min(corners), max(corners))
    # floordiv by a positive divisor with finite bounds: monotone in the dividend, and an
    # infinite end stays infinite.
    if b0 <= 0 or b1 == _INF:
        return None, None
    lo = a0 if a0 == -_INF else min(a0 // b0, a0 // b1)
    hi = a1 if a1 == _INF else max(a1 // b0, a1 // b1)
    return _bound(lo, hi)


def known_bounds(conds: list[Expr], ranges: dict[str, tuple[int, int]]) -> dict[str, Bound]:
    """``ranges`` tightened, and extended to more symbols, by the conditions that bound a
    symbol directly (``e <= s``, ``e < s``, ``s <= e``, ``s < e`` with ``e`` bounded on the
    side that matters); other conditions are left to the provers. Sound: every condition
    holds where ``conds`` are known."""
    out: dict[str, Bound] = dict(ranges)
    for c in conds:
        if c[0] not in ("<", "<=") or (c[1][0] != "sym" and c[2][0] != "sym"):
            continue
        strict = 1 if c[0] == "<" else 0
        if c[2][0] == "sym":             # e <= s: s's lower bound
            lo = half_interval(c[1], out)[0]
            old = out.get(c[2][1], (None, None))
            if lo is not None and (old[0] is None or lo + strict > old[0]):
                out[c[2][1]] = (lo + strict, old[1])
        if c[1][0] == "sym":             # s <= e: s's upper bound
            hi = half_interval(c[2], out)[1]
            old = out.get(c[1][1], (None, None))
            if hi is not None and (old[1] is None or hi - strict < old[1]):
                out[c[1][1]] = (old[0], hi - strict)
    return out


def symbols(e: Expr) -> set[str]:
    """The symbols ``e`` names."""
    if e[0] == "sym":
        return {e[1]}
    return set().union(*(symbols(x) for x in e[1:] if isinstance(x, tuple)))


_EVAL = {"+": operator.add, "-": operator.sub, "*": operator.mul, "floordiv": operator.floordiv,
         "mod": operator.mod, "div": truncdiv, "rem": lambda a, b: a - b * truncdiv(a, b),
         "max": max, "min": min, "<": operator.lt, "<=": operator.le, "==": operator.eq,
         "!=": operator.ne, "and": lambda a, b: a and b, "or": lambda a, b: a or b}


def value(e: Expr, env: dict[str, int]) -> Any:
    """``e`` evaluated with its symbols at ``env``'s values (ZeroDivisionError for a zero
    divisor)."""
    if e[0] == "int":
        return e[1]
    if e[0] == "sym":
        return env[e[1]]
    if e[0] == "neg":
        return -value(e[1], env)
    if e[0] == "not":
        return not value(e[1], env)
    return _EVAL[e[0]](value(e[1], env), value(e[2], env))
