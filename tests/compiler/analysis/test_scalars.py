"""The scalar range analysis (compiler/analysis/scalars.py) is sound: every value an op can
produce from operands inside their ranges, as the op's definition evaluates it (wrap-around,
division by zero), lies inside the range the analysis gives, and a point range is the value."""

import itertools
import operator
import random

import numpy as np
import pytest

from jaxtile.compiler import ir, op_defs
from jaxtile.compiler.analysis import scalars

_COMPARE = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
            "eq": operator.eq, "ne": operator.ne}


def _ranges(rng: random.Random, dtype: np.dtype, n: int) -> list[tuple[int, int]]:
    lo, hi = scalars.dtype_range(dtype)
    out = [(0, 0), (lo, lo + 2), (hi - 2, hi), (-1, 1) if lo < 0 else (0, 1)]
    for _ in range(n):
        a = rng.randint(lo, hi)
        out.append((a, min(hi, a + rng.randint(0, 5))))
    return out


def _exact(op: ir.Op, values: list[int]) -> int:
    if op.kind == "select":                               # (pred, on_false, on_true)
        return values[2] if values[0] else values[1]
    if op.kind == "elementwise" and op.attrs["fn"] in _COMPARE:
        return int(_COMPARE[op.attrs["fn"]](*values))
    return op_defs.evaluate(op, values)


def _check(op: ir.Op, operand_ranges: list[tuple[int, int]]) -> None:
    r = scalars.op_range(op, operand_ranges)
    assert r is not None, op
    for values in itertools.product(*(range(lo, hi + 1) for lo, hi in operand_ranges)):
        v = _exact(op, list(values))
        assert r[0] <= v <= r[1], (op.kind, dict(op.attrs), operand_ranges, values, v, r)
    if r[0] == r[1]:
        assert all(_exact(op, list(vs)) == r[0] for vs in itertools.product(
            *(range(lo, hi + 1) for lo, hi in operand_ranges)))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32])
def test_binary_ranges_hold_every_value(dtype):
    dtype = np.dtype(dtype)
    rng = random.Random(0)
    x, y = ir.Value((), dtype), ir.Value((), dtype)
    cases = _ranges(rng, dtype, 6)
    for fn in ("add", "sub", "mul", "div", "rem", "max", "min", *_COMPARE):
        res = ir.Value((), np.bool_ if fn in _COMPARE else dtype)
        op = ir.Op("elementwise", (x, y), res, {"fn": fn})
        for rx, ry in itertools.product(cases, cases):
            _check(op, [rx, ry])


def test_unary_conversion_and_select_ranges_hold_every_value():
    rng = random.Random(1)
    i8, i16 = np.dtype(np.int8), np.dtype(np.int16)
    x = ir.Value((), i8)
    for fn in ("neg", "abs", "sign", "square"):
        op = ir.Op("elementwise", (x,), ir.Value((), i8), {"fn": fn})
        for r in _ranges(rng, i8, 10):
            _check(op, [r])
    wide = ir.Value((), i16)
    narrow = ir.Op("convert", (wide,), ir.Value((), i8))
    for r in [(100, 130), (-3, 3), (-200, -129), *_ranges(rng, i16, 10)]:
        if r[1] - r[0] < 600:
            _check(narrow, [r])
    p, a, b = ir.Value((), np.bool_), ir.Value((), i8), ir.Value((), i8)
    select = ir.Op("select", (p, a, b), ir.Value((), i8))
    for pr in [(0, 0), (1, 1), (0, 1)]:
        _check(select, [pr, (-5, -2), (7, 9)])


def test_unknown_operands_give_no_range_and_loops_range_over_their_trip():
    x = ir.Value((), np.int32)
    op = ir.Op("elementwise", (x, x), ir.Value((), np.int32), {"fn": "add"})
    assert scalars.op_range(op, [None, (0, 1)]) is None
    loop = ir.For(ir.Value((), np.int32), 0, 8, "serial", 1, ())
    assert scalars.loop_range(loop, (2, 3), (8, 8)) == (2, 10)
    assert scalars.loop_range(loop, (2, 2), (-1, 0)) == (2, 2)      # runs no iteration
