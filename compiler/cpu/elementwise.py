"""Per-element math of Tile IR as TIR expressions: the CPU's implementation of the rules
that :mod:`..semantics` states (XLA's per-element semantics), with its own math library
(:mod:`.vector_math`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np
from tvm import tirx
from tvm.ir import Expr

from .. import semantics
from . import float8 as f8
from . import tir_emit
from . import vector_math as vm

_LOW_FLOATS = tuple(sorted(d.name for d in semantics.LOW_FLOATS - semantics.FLOAT8))
_LN2 = math.log(2.0)


def tvm_dtype(dtype: np.dtype) -> str:
    """The TIR type that holds a numpy/ml_dtypes dtype (an 8-bit float as its bits)."""
    return f8.storage(np.dtype(dtype).name)


def name(dtype: np.dtype) -> str:
    """The dtype's name, which :func:`convert` and :func:`const` take (unlike
    :func:`tvm_dtype`, it tells an 8-bit float from ``uint8``)."""
    return np.dtype(dtype).name


def is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def const(value: float | int | bool, dtype: str) -> Expr:
    """``value`` as a constant of ``dtype`` (in its TIR type: bits for an 8-bit float)."""
    return f8.const(float(value), dtype) if dtype in f8.NAMES else tirx.const(value, dtype)


Bind = Callable[[Expr], Expr]


def _to(dtype: str, x: Expr, bind: Bind) -> Expr:
    """Cast float32 ``x`` to ``dtype``. bfloat16 is rounded explicitly first: TVM folds a
    later ``Cast(float32, Cast(bfloat16, x))`` back to ``x``, which would skip the rounding
    that every bfloat16 op must show. ``bind`` evaluates an expression once and returns an
    equivalent one free of bfloat16 and of Let nodes (see ``KernelBuilder.let``)."""
    if dtype == "bfloat16" and tir_emit.dtype_of(x) in ("float32", "float16"):
        # The cast is legalised into bit operations that repeat its operand, and TVM's
        # vectorizer rejects a repeated Let node, so the rounded value is bound too.
        x = bind(vm.round_to_bfloat16(bind(tirx.Cast("float32", x))))
    return tirx.Cast(dtype, x)


def _exp(x: Expr, dtype: str) -> Expr:
    return vm.exp_f32(x) if dtype == "float32" else tirx.exp(x)


def _sign(x: Expr, dtype: str) -> Expr:
    one, zero = const(1, dtype), const(0, dtype)
    if dtype.startswith("uint"):  # TVM has no -1 of an unsigned type
        return tirx.Select(x > zero, one, zero)
    return tirx.Select(x > zero, one, tirx.Select(x < zero, -one, x))


def _round_away(x: Expr, dtype: str) -> Expr:
    t = tirx.trunc(x)
    return tirx.Select(tirx.abs(x - t) >= const(0.5, dtype), t + _sign(x, dtype), t)


def is_nan(x: Expr, dtype: str) -> Expr:
    """NaN test from the bit pattern: TVM folds ``x != x`` to false, and ``tirx.isnan``
    keeps a loop from vectorising."""
    if dtype == "float64":
        return tirx.isnan(x)
    bits = tirx.reinterpret("uint32", x if dtype == "float32" else tirx.Cast("float32", x))
    return tirx.GT(tirx.bitwise_and(bits, tirx.const(0x7FFFFFFF, "uint32")),
                   tirx.const(0x7F800000, "uint32"))


def order_dtype(dtype: np.dtype) -> str:
    """The TVM type that values of ``dtype`` are ordered in (sorts, arg-reductions): the
    compute type, and int32 for bool, because LLVM's code generator has no ordered compare
    of ``i1`` values (TVM stops at an internal check)."""
    return "int32" if np.dtype(dtype) == np.bool_ else semantics.compute_dtype(dtype).name


def _is_finite(x: Expr, dtype: str) -> Expr:
    """Neither inf nor NaN: the exponent bits are not all ones."""
    if dtype == "float64":
        return tirx.Not(tirx.Or(tirx.isnan(x), tirx.isinf(x)))
    bits = tirx.reinterpret("uint32", x)
    exponent = tirx.const(0x7F800000, "uint32")
    return tirx.NE(tirx.bitwise_and(bits, exponent), exponent)


_LIBM = frozenset({"tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
                   "erfc"})
"""Functions TVM's CPU code generator lacks, called from the C math library."""


def _libm(dtype: str, name: str, *args: Expr) -> Expr:
    """A call of the C math library's ``name`` (``namef`` for float32)."""
    return tirx.call_pure_extern(dtype, name + ("f" if dtype == "float32" else ""), *args)


_ORDERED = {"lt": tirx.LT, "le": tirx.LE, "gt": tirx.GT, "ge": tirx.GE, "eq": tirx.EQ}


def _compare(fn: str, a: Expr, b: Expr, dtype: str) -> Expr:
    if dtype == "bool":
        # LLVM has no ordered compares of i1 vectors: compare as integers.
        a, b = tirx.Cast("int32", a), tirx.Cast("int32", b)
    if fn == "ne":
        ne = tirx.NE(a, b)
        return tirx.Or(ne, tirx.Or(is_nan(a, dtype), is_nan(b, dtype))) if is_float(dtype) \
            else ne
    cmp = _ORDERED[fn](a, b)
    if not is_float(dtype):
        return cmp
    # TVM folds x <= x and x == x to true; IEEE says false for NaN.
    return tirx.And(cmp, tirx.Not(tirx.Or(is_nan(a, dtype), is_nan(b, dtype))))


def _int_div(fn: str, a: Expr, b: Expr, dtype: str) -> Expr:
    """Integer ``div``/``rem`` with XLA's results where C has none (no SIGFPE): x / 0 is -1
    (all ones unsigned), x % 0 is x, INT_MIN / -1 is INT_MIN and INT_MIN % -1 is 0.

    Narrow types divide in 64 bits, where INT_MIN / -1 cannot overflow and wraps back on the
    cast; the divisor is made non-zero arithmetically (TVM turns a division by a select
    into a select of divisions, and LLVM drops guards around a trapping division).
    """
    zero = tirx.EQ(b, const(0, dtype))
    info = np.iinfo(np.dtype(dtype))
    wide = "int64" if info.bits < 64 else dtype
    a_w = tirx.Cast(wide, a)
    b_w = tirx.Add(tirx.Cast(wide, b), tirx.Cast(wide, zero))
    if wide == dtype and not dtype.startswith("uint"):
        overflow = tirx.And(tirx.EQ(a, const(int(info.min), dtype)),
                            tirx.EQ(b, const(-1, dtype)))
        b_w = tirx.Mul(b_w, tirx.Sub(const(1, dtype), tirx.Mul(const(2, dtype),
                                                               tirx.Cast(dtype, overflow))))
    if fn == "div":
        by_zero = const(semantics.int_div_by_zero(np.dtype(dtype)), dtype)
        return tirx.Select(zero, by_zero, tirx.Cast(dtype, tirx.truncdiv(a_w, b_w)))
    return tirx.Select(zero, a, tirx.Cast(dtype, tirx.truncmod(a_w, b_w)))


def _binary(fn: str, a: Expr, b: Expr, dtype: str) -> Expr:
    flt = is_float(dtype)
    # Node constructors, not Python operators: those fold x * 0.0 to 0.0 and x + 0.0 to x,
    # which is wrong for NaN, inf and -0.0.
    if fn == "add":
        return tirx.Add(a, b)
    if fn == "sub":
        return tirx.Sub(a, b)
    if fn == "mul":
        return tirx.Mul(a, b)
    if fn in ("div", "rem") and not flt:
        return _int_div(fn, a, b, dtype)
    if fn == "div":
        return tirx.Div(a, b)
    if fn == "rem":
        # C's fmod is exact, as XLA's rem; TVM has no CPU lowering of tirx.fmod.
        return _libm(dtype, "fmod", a, b)
    if fn == "atan2":
        return _libm(dtype, "atan2", a, b)
    if dtype == "bool" and fn in ("max", "min"):
        # The largest of bools is their or, the smallest their and (LLVM has no ordered
        # compare of i1 values to select with).
        return (tirx.Or if fn == "max" else tirx.And)(a, b)
    if fn == "max":
        return vm.maximum(a, b)
    if fn == "min":
        return vm.minimum(a, b)
    if fn == "pow":
        return tirx.pow(a, b)
    if fn in ("lt", "le", "gt", "ge", "eq", "ne"):
        return _compare(fn, a, b, dtype)
    if dtype == "bool":
        if fn == "xor":
            return tirx.NE(tirx.Cast("int32", a), tirx.Cast("int32", b))
        return {"and": tirx.And, "or": tirx.Or}[fn](a, b)
    return {"and": tirx.bitwise_and, "or": tirx.bitwise_or, "xor": tirx.bitwise_xor}[fn](a, b)


def _expm1(x: Expr, dtype: str, bind: Bind) -> Expr:
    """exp(x) - 1 without the cancellation near 0: Kahan's (u - 1) * x / log(u), u = exp(x),
    for |x| < 1 (a few ulp), plain exp(x) - 1 elsewhere."""
    x = bind(x)
    u = bind(_exp(x, dtype))
    one = const(1.0, dtype)
    um1 = tirx.Sub(u, one)
    kahan = tirx.Select(tirx.EQ(u, one), x, tirx.Div(tirx.Mul(um1, x), tirx.log(u)))
    return tirx.Select(tirx.abs(x) < one, kahan, um1)


def _unary(fn: str, x: Expr, dtype: str, bind: Bind) -> Expr:
    if fn == "neg":
        # Two's complement for unsigned types: TVM's -x would make a -1, and it simplifies
        # 0 - x to 0 (no unsigned value is below 0)
        return tirx.Add(tirx.bitwise_not(x), const(1, dtype)) if dtype.startswith("uint") \
            else -x
    if fn == "abs":
        return tirx.abs(x)
    if fn == "sign":
        return _sign(x, dtype)
    if fn == "not":
        return tirx.Not(x) if dtype == "bool" else tirx.bitwise_not(x)
    if fn == "square":
        return tirx.Mul(x, x)
    if fn == "exp":
        return _exp(x, dtype)
    if fn == "tanh" and dtype == "float32":
        return vm.tanh_f32(x)
    if fn == "erfc" and dtype == "float32":
        return vm.erfc_f32(x)
    if fn == "exp2":
        return _exp(x * const(_LN2, dtype), dtype) if dtype == "float32" else tirx.exp2(x)
    if fn == "expm1":
        return _expm1(x, dtype, bind)
    if fn == "logistic":
        return const(1.0, dtype) / (const(1.0, dtype) + _exp(-x, dtype))
    if fn == "rsqrt":
        return vm.rsqrt(x)
    if fn == "round_away":
        return _round_away(x, dtype)
    if fn in _LIBM:
        return _libm(dtype, fn, x)
    if fn == "is_finite":
        return _is_finite(x, dtype)
    simple = {"floor": tirx.floor, "ceil": tirx.ceil, "round": tirx.nearbyint, "log": tirx.log,
              "log1p": tirx.log1p, "tanh": tirx.tanh, "sqrt": tirx.sqrt, "sin": tirx.sin,
              "cos": tirx.cos, "erf": tirx.erf}
    return simple[fn](x)


def _widen(x: Expr, dtype: str, bind: Bind) -> Expr:
    # TVM's bfloat16 legalisation rebuilds the arithmetic around every bfloat16 load with
    # constant folding, which turns x * 0.0 into 0.0 and x + 0.0 into x (wrong for NaN, inf
    # and -0.0). A constant operand is therefore bound (stored and loaded, which LLVM
    # forwards): the legaliser then sees no constant to fold.
    if isinstance(x, tirx.FloatImm):
        return bind(tirx.FloatImm(dtype, x.value))
    return tirx.Cast(dtype, x)


def elementwise(fn: str, args: Sequence[Expr], in_dtype: str, out_dtype: str,
                bind: Bind) -> Expr:
    """``fn`` applied to ``args`` (all of ``in_dtype``), giving a value of ``out_dtype``;
    ``bind`` as in :func:`convert`."""
    compute = semantics.compute_dtype(_np_dtype(in_dtype)).name
    if compute != in_dtype:
        args = [_widen(a, compute, bind) for a in args]
    if len(args) == 2:
        result = _binary(fn, args[0], args[1], compute)
    else:
        result = _unary(fn, args[0], compute, bind)
    return result if out_dtype in ("bool", compute) else _to(out_dtype, result, bind)


def convert(x: Expr, src: str, dst: str, bind: Bind) -> Expr:
    """``x`` converted from ``src`` to ``dst`` with XLA's semantics. ``bind`` evaluates an
    expression once and returns an equivalent one free of bfloat16 (see ``_to``)."""
    if src == dst:
        return x
    if f8.NAMES & {src, dst}:
        return _convert_float8(x, src, dst, bind)
    if dst == "bool":
        if src in ("float16", "bfloat16"):
            # Like XLA: any bit set besides the sign (NaN and subnormals are true). For
            # float32 XLA compares with 0, so subnormals follow the CPU's denormal mode.
            bits = tirx.reinterpret("uint32", tirx.Cast("float32", x))
            return tirx.NE(tirx.bitwise_and(bits, tirx.const(0x7FFFFFFF, "uint32")),
                           tirx.const(0, "uint32"))
        return _compare("ne", x, const(0, src), src) if is_float(src) \
            else tirx.NE(x, const(0, src))
    if src == "bool":
        return tirx.Select(x, const(1, dst), const(0, dst))
    if src in _LOW_FLOATS:
        # Widening to float32 is exact; the rest of the conversion happens from there.
        return convert(tirx.Cast("float32", x), "float32", dst, bind)
    if is_float(src) and not is_float(dst):
        wide = tirx.Cast("float64", x)
        lo, hi = (const(b, "float64") for b in semantics.saturation_bounds(np.dtype(dst)))
        clamped = tirx.Select(wide < lo, lo, tirx.Select(wide > hi, hi, wide))
        return tirx.Select(is_nan(x, src), const(semantics.NAN_TO_INT, dst),
                           tirx.Cast(dst, clamped))
    return _to(dst, x, bind)


def _convert_float8(x: Expr, src: str, dst: str, bind: Bind) -> Expr:
    """A conversion from or to an 8-bit float: through float32, which holds every 8-bit
    float exactly; a float64 is narrowed to odd first, so that it is rounded once."""
    if src in f8.NAMES:
        wide = bind(f8.to_float32(x, src, bind))
        return convert(wide, "float32", dst, bind) if dst not in f8.NAMES \
            else f8.from_float32(wide, dst, bind)
    wide = f8.narrow_to_odd(x, bind) if src == "float64" else convert(x, src, "float32", bind)
    return f8.from_float32(bind(wide), dst, bind)


def reduce_init(fn: str, dtype: str) -> Expr:
    """The identity of reduction ``fn`` in ``dtype``."""
    return const(semantics.reduce_identity(fn, _np_dtype(dtype)), dtype)


def reduce_combine(fn: str, acc: Expr, x: Expr, dtype: str, bind: Bind) -> Expr:
    """One step of reduction ``fn``."""
    name = semantics.reduce_combiner(fn, _np_dtype(dtype))
    return elementwise(name, [acc, x], dtype, dtype, bind)


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)
