"""Per-element math of Tile IR as TIR expressions, with JAX's semantics on the CPU.

Half-precision floats (float16, bfloat16) are computed in float32 and rounded back after
every op, as XLA:CPU does. Float-to-int conversion saturates and maps NaN to 0, like XLA.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from tvm import tirx
from tvm.ir import Expr

from . import tir_emit as te

_LOW_FLOATS = ("float16", "bfloat16")
_LN2 = math.log(2.0)


def tvm_dtype(dtype: np.dtype) -> str:
    """TVM's name for a numpy/ml_dtypes dtype."""
    return np.dtype(dtype).name


def is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _const(value: float | int | bool, dtype: str) -> Expr:
    return tirx.const(value, dtype)


Bind = Callable[[Expr], Expr]


def _to(dtype: str, x: Expr, bind: Bind) -> Expr:
    """Cast float32 ``x`` to ``dtype``. bfloat16 is rounded explicitly first: TVM folds a
    later ``Cast(float32, Cast(bfloat16, x))`` back to ``x``, which would skip the rounding
    that every bfloat16 op must show. ``bind`` evaluates an expression once and returns an
    equivalent one free of bfloat16 and of Let nodes (see ``KernelBuilder.let``)."""
    if dtype == "bfloat16" and te.dtype_of(x) == "float32":
        # The cast is legalised into bit operations that repeat its operand, and TVM's
        # vectorizer rejects a repeated Let node, so the rounded value is bound too.
        x = bind(te.round_to_bfloat16(bind(x)))
    return tirx.Cast(dtype, x)


def _exp(x: Expr, dtype: str) -> Expr:
    return te.exp_f32(x) if dtype == "float32" else tirx.exp(x)


def _sign(x: Expr, dtype: str) -> Expr:
    one, zero = _const(1, dtype), _const(0, dtype)
    return tirx.Select(x > zero, one, tirx.Select(x < zero, -one, x))


def _round_away(x: Expr, dtype: str) -> Expr:
    t = tirx.trunc(x)
    return tirx.Select(tirx.abs(x - t) >= _const(0.5, dtype), t + _sign(x, dtype), t)


def _binary(fn: str, a: Expr, b: Expr, dtype: str) -> Expr:
    flt = is_float(dtype)
    if fn == "add":
        return a + b
    if fn == "sub":
        return a - b
    if fn == "mul":
        return a * b
    if fn == "div":
        return a / b if flt else tirx.truncdiv(a, b)
    if fn == "rem":
        return tirx.fmod(a, b) if flt else tirx.truncmod(a, b)
    if fn == "max":
        return te.maximum(a, b)
    if fn == "min":
        return te.minimum(a, b)
    if fn == "pow":
        return tirx.pow(a, b)
    if fn in ("lt", "le", "gt", "ge"):
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[fn]
    if fn == "eq":
        return tirx.EQ(a, b)
    if fn == "ne":
        return tirx.NE(a, b)
    if dtype == "bool":
        return {"and": tirx.And, "or": tirx.Or, "xor": tirx.NE}[fn](a, b)
    return {"and": tirx.bitwise_and, "or": tirx.bitwise_or, "xor": tirx.bitwise_xor}[fn](a, b)


def _unary(fn: str, x: Expr, dtype: str) -> Expr:
    if fn == "neg":
        return -x
    if fn == "abs":
        return tirx.abs(x)
    if fn == "sign":
        return _sign(x, dtype)
    if fn == "not":
        return tirx.Not(x) if dtype == "bool" else tirx.bitwise_not(x)
    if fn == "square":
        return x * x
    if fn == "exp":
        return _exp(x, dtype)
    if fn == "tanh" and dtype == "float32":
        return te.tanh_f32(x)
    if fn == "exp2":
        return _exp(x * _const(_LN2, dtype), dtype) if dtype == "float32" else tirx.exp2(x)
    if fn == "expm1":
        # exp(x) - 1 cancels badly near 0; there the Taylor series is exact to rounding.
        small = x * (_const(1.0, dtype) + x * (_const(0.5, dtype) + x / _const(6.0, dtype)))
        return tirx.Select(tirx.abs(x) < _const(1e-3, dtype), small,
                           _exp(x, dtype) - _const(1.0, dtype))
    if fn == "logistic":
        return _const(1.0, dtype) / (_const(1.0, dtype) + _exp(-x, dtype))
    if fn == "rsqrt":
        return te.rsqrt(x)
    if fn == "round_away":
        return _round_away(x, dtype)
    simple = {"floor": tirx.floor, "ceil": tirx.ceil, "round": tirx.nearbyint, "log": tirx.log,
              "log1p": tirx.log1p, "tanh": tirx.tanh, "sqrt": tirx.sqrt, "sin": tirx.sin,
              "cos": tirx.cos, "erf": tirx.erf}
    return simple[fn](x)


def elementwise(fn: str, args: Sequence[Expr], in_dtype: str, out_dtype: str,
                bind: Bind) -> Expr:
    """``fn`` applied to ``args`` (all of ``in_dtype``), giving a value of ``out_dtype``;
    ``bind`` as in :func:`convert`."""
    compute = "float32" if in_dtype in _LOW_FLOATS else in_dtype
    if compute != in_dtype:
        args = [tirx.Cast(compute, a) for a in args]
    if len(args) == 2:
        result = _binary(fn, args[0], args[1], compute)
    else:
        result = _unary(fn, args[0], compute)
    return result if out_dtype in ("bool", compute) else _to(out_dtype, result, bind)


def convert(x: Expr, src: str, dst: str, bind: Bind) -> Expr:
    """``x`` converted from ``src`` to ``dst`` with XLA's semantics. ``bind`` evaluates an
    expression once and returns an equivalent one free of bfloat16 (see ``_to``)."""
    if src == dst:
        return x
    if dst == "bool":
        return tirx.NE(x, _const(0, src))
    if src == "bool":
        return tirx.Select(x, _const(1, dst), _const(0, dst))
    if is_float(src) and not is_float(dst):
        info = np.iinfo(np.dtype(dst))
        wide = tirx.Cast("float64", x)
        lo, hi = _const(float(info.min), "float64"), _const(float(info.max), "float64")
        clamped = tirx.Select(wide < lo, lo, tirx.Select(wide > hi, hi, wide))
        return tirx.Select(tirx.isnan(x), _const(0, dst), tirx.Cast(dst, clamped))
    return _to(dst, x, bind)


def reduce_init(fn: str, dtype: str) -> Expr:
    """The identity of reduction ``fn`` in ``dtype``."""
    if fn in ("sum", "or"):
        return _const(False if dtype == "bool" else 0, dtype)
    if fn in ("prod", "and"):
        return _const(True if dtype == "bool" else (1 if fn == "prod" else -1), dtype)
    if is_float(dtype):
        return _const(-math.inf if fn == "max" else math.inf, dtype)
    info = np.iinfo(np.dtype(dtype))
    return _const(int(info.min if fn == "max" else info.max), dtype)


def reduce_combine(fn: str, acc: Expr, x: Expr, dtype: str, bind: Bind) -> Expr:
    """One step of reduction ``fn``."""
    name = {"sum": "add", "prod": "mul", "max": "max", "min": "min", "and": "and",
            "or": "or"}[fn]
    if dtype == "bool" and fn == "sum":
        name = "or"
    return elementwise(name, [acc, x], dtype, dtype, bind)
