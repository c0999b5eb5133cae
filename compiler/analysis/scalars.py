"""Ranges of integer and bool scalars: the one interval evaluator passes share.

A range is an inclusive ``(lo, hi)`` of Python ints; a bool is 0 or 1. Every rule keeps the
exact integer semantics of the IR (:mod:`..semantics`): arithmetic that can leave the
result dtype's bounds wraps around there, so its range is then the whole dtype; division
and remainder by zero give what :func:`..semantics.int_div_by_zero` says; quotients truncate
toward zero and remainders take the dividend's sign. A range that is one point is a
constant: where all operands are constants the op's own definition evaluates it
(:func:`..op_defs.evaluate`).

What has a range: block indices (over the grid), loop variables (over their trip),
constants, dynamic sizes that are one name (never negative), and what integer arithmetic,
comparisons, logic, conversions and selects make of those. Values read from memory and
anything derived from them have none (None): the analysis does not know them, which is not
the same as knowing they span the dtype.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from .. import ir, op_defs, semantics

Range = tuple[int, int]

_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def dtype_range(dtype: np.dtype) -> Range | None:
    """Every value ``dtype`` holds (``(0, 1)`` for bool), or None for a float."""
    if dtype == np.bool_:
        return 0, 1
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    return None


def fit(r: Range, dtype: np.dtype) -> Range:
    """``r`` as ``dtype`` holds it: unchanged inside its bounds, else (some value wraps
    around) the whole dtype."""
    full = dtype_range(dtype)
    return r if full[0] <= r[0] and r[1] <= full[1] else full


def _corners(fn, x: Range, y: Range) -> Range:
    values = [fn(a, b) for a in x for b in y]
    return min(values), max(values)


def truncdiv(a: int, b: int) -> int:
    """``a / b`` rounded toward zero, as XLA and C divide integers."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _nonzero_parts(y: Range) -> list[Range]:
    """``y`` without 0, as at most two ranges of one sign each."""
    parts = []
    if y[0] < 0:
        parts.append((y[0], min(y[1], -1)))
    if y[1] > 0:
        parts.append((max(y[0], 1), y[1]))
    return parts


def _union(ranges: Sequence[Range]) -> Range:
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


def _div(x: Range, y: Range, dtype: np.dtype) -> Range:
    # Truncated division is monotone in each operand while the divisor keeps one sign, so
    # each sign's extremes are at the corners.
    parts = [_corners(truncdiv, x, p) for p in _nonzero_parts(y)]
    if y[0] <= 0 <= y[1]:
        v = semantics.int_div_by_zero(dtype)
        parts.append((v, v))
    return _union(parts)


def _rem(x: Range, y: Range) -> Range:
    parts = []
    nonzero = _nonzero_parts(y)
    if nonzero:
        m = max(abs(v) for p in nonzero for v in p) - 1     # |x % y| < |y|
        parts.append((0 if x[0] >= 0 else max(x[0], -m), 0 if x[1] <= 0 else min(x[1], m)))
    if y[0] <= 0 <= y[1]:
        parts.append(x)                                     # x % 0 is x
    return _union(parts)


def _compare(fn: str, x: Range, y: Range) -> Range:
    """The bool range of ``x fn y``: a point where the ranges decide it."""
    if fn in ("gt", "ge"):
        fn, x, y = {"gt": "lt", "ge": "le"}[fn], y, x
    if fn == "lt":
        return (1, 1) if x[1] < y[0] else (0, 0) if x[0] >= y[1] else (0, 1)
    if fn == "le":
        return (1, 1) if x[1] <= y[0] else (0, 0) if x[0] > y[1] else (0, 1)
    same = x[0] == x[1] == y[0] == y[1]
    apart = x[1] < y[0] or y[1] < x[0]
    eq = (1, 1) if same else (0, 0) if apart else (0, 1)
    return eq if fn == "eq" else (1 - eq[1], 1 - eq[0])


def _elementwise(fn: str, xs: Sequence[Range], dtype: np.dtype) -> Range | None:
    if dtype == np.bool_:
        if fn in op_defs.COMPARISONS:
            return _compare(fn, *xs)
        if fn == "and":
            return xs[0][0] & xs[1][0], xs[0][1] & xs[1][1]
        if fn == "or":
            return xs[0][0] | xs[1][0], xs[0][1] | xs[1][1]
        if fn == "not":
            return 1 - xs[0][1], 1 - xs[0][0]
        return None
    if len(xs) == 1:
        (lo, hi), = xs
        least_abs = 0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
        exact = {"neg": (-hi, -lo), "abs": (least_abs, max(abs(lo), abs(hi))),
                 "square": (least_abs ** 2, max(lo * lo, hi * hi)),
                 "sign": ((lo > 0) - (lo < 0), (hi > 0) - (hi < 0))}.get(fn)
        return None if exact is None else fit(exact, dtype)
    x, y = xs
    if fn == "add":
        return fit((x[0] + y[0], x[1] + y[1]), dtype)
    if fn == "sub":
        return fit((x[0] - y[1], x[1] - y[0]), dtype)
    if fn == "mul":
        return fit(_corners(lambda a, b: a * b, x, y), dtype)
    if fn == "max":
        return max(x[0], y[0]), max(x[1], y[1])
    if fn == "min":
        return min(x[0], y[0]), min(x[1], y[1])
    if fn == "div":
        return fit(_div(x, y, dtype), dtype)
    if fn == "rem":
        return _rem(x, y)
    return None


def op_range(op: ir.Op, operands: Sequence[Range | None]) -> Range | None:
    """The range of ``op``'s scalar result given its operands' (None: unknown), or None
    where the analysis cannot bound it."""
    res = op.result
    if res is None or res.shape != () or dtype_range(res.dtype) is None:
        return None
    if op.kind == "const" and res.dtype == np.bool_:
        return (int(bool(op.attrs["value"])),) * 2
    if op.kind == "size":
        expr = op.attrs["expr"]
        return (0, dtype_range(res.dtype)[1]) if _NAME.fullmatch(expr) else None
    if None in operands or any(o.shape != () for o in op.operands):
        return None
    if all(r[0] == r[1] for r in operands):
        value = op_defs.evaluate(op, [r[0] for r in operands])
        if value is not None:
            return value, value
    if op.kind == "convert":
        (lo, hi), = operands
        if res.dtype == np.bool_:                           # x != 0
            return (1, 1) if lo > 0 or hi < 0 else (0, 0) if lo == hi == 0 else (0, 1)
        return fit((lo, hi), res.dtype)
    if op.kind == "select":
        pred, on_false, on_true = operands
        picked = [r for r, b in ((on_false, 0), (on_true, 1)) if pred[0] <= b <= pred[1]]
        return _union(picked)
    if op.kind == "elementwise":
        return _elementwise(op.attrs["fn"], operands, res.dtype)
    return None


def loop_range(loop: ir.For, start: Range | None, extent: Range | None) -> Range | None:
    """The range of ``loop``'s variable: from the least start to the greatest start plus
    the greatest extent less one (a loop that may not run still gets its start's range)."""
    if start is None or extent is None:
        return None
    return fit((start[0], start[1] + max(extent[1], 1) - 1), loop.var.dtype)


def block_ranges(kernel: ir.Kernel) -> dict[ir.Value, Range]:
    """Each block index's range: ``[0, blocks - 1]`` on a static axis, never negative on a
    dynamic one."""
    return {v: (0, n - 1) if isinstance(n, int) else (0, dtype_range(v.dtype)[1])
            for v, n in zip(kernel.block_indices, kernel.grid)}


def _bound(x: int | ir.Value, known: Mapping[ir.Value, Range]) -> Range | None:
    return (x, x) if isinstance(x, int) else known.get(x)


def scalar_ranges(kernel: ir.Kernel) -> dict[ir.Value, Range]:
    """The range of every scalar of ``kernel`` the analysis can bound, by value."""
    known = block_ranges(kernel)

    def visit(body: Sequence[ir.Stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ir.For):
                r = loop_range(stmt, _bound(stmt.start, known), _bound(stmt.extent, known))
                if r is not None:
                    known[stmt.var] = r
            elif isinstance(stmt, ir.Op):
                r = op_range(stmt, [known.get(v) for v in stmt.operands])
                if r is not None:
                    known[stmt.result] = r
            for block in ir.blocks(stmt):
                visit(block)

    visit(kernel.body)
    return known
