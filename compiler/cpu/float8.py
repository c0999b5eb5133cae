"""float8_e4m3fn and float8_e5m2 on the CPU: conversions as integer TIR expressions.

TVM 0.27's own float8 legalisation fails on vectors (a ``Cast`` to float8 inside a
vectorised loop builds an ``if_then_else`` with a vector condition), so kernels hold 8-bit
floats as their bits (``uint8``: :func:`storage`) and convert with the bit manipulation
below, which vectorises. The rules are :mod:`..semantics`' (those of ``ml_dtypes`` and
XLA): round to nearest even, once; float8_e5m2 overflows to inf, float8_e4m3fn (no inf) to
NaN; subnormals kept; NaN stays NaN with its sign.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
from tvm import tirx
from tvm.ir import Expr

from .tir_emit import dtype_of

# name -> (exponent bits, mantissa bits, no inf: the all-ones pattern is NaN)
_FORMATS = {"float8_e4m3fn": (4, 3, True), "float8_e5m2": (5, 2, False)}
NAMES = frozenset(_FORMATS)

Bind = Callable[[Expr], Expr]


def storage(dtype: str) -> str:
    """The TIR type that holds ``dtype`` (its bits, for an 8-bit float)."""
    return "uint8" if dtype in _FORMATS else dtype


def const(value: float, dtype: str) -> Expr:
    """The bits of ``value`` rounded to 8-bit float ``dtype``, as a ``uint8`` constant."""
    bits = np.asarray(value, np.float64).astype(getattr(ml_dtypes, dtype)).view(np.uint8)
    return tirx.const(int(bits), "uint8")


def _u32(value: int) -> Expr:
    return tirx.const(value, "uint32")


def to_float32(bits: Expr, dtype: str, bind: Bind) -> Expr:
    """The float32 value (exact) of 8-bit float ``dtype`` with ``bits`` (``uint8``)."""
    e, m, fn = _FORMATS[dtype]
    bias = (1 << (e - 1)) - 1
    b = bind(tirx.Cast("uint32", bits))
    sign = (b & _u32(0x80)) << _u32(24)
    field = (b >> _u32(m)) & _u32((1 << e) - 1)
    man = b & _u32((1 << m) - 1)
    normal = sign | ((field + _u32(127 - bias)) << _u32(23)) | (man << _u32(23 - m))
    # subnormal: man * 2^(1 - bias - m), exact in float32
    tiny = tirx.Cast("float32", man) * tirx.const(2.0 ** (1 - bias - m), "float32")
    sub = sign | tirx.reinterpret("uint32", tiny)
    if fn:
        special = tirx.EQ(b & _u32(0x7F), _u32(0x7F))
        nan_or_inf = sign | _u32(0x7FC00000)
    else:
        special = tirx.EQ(field, _u32((1 << e) - 1))
        nan_or_inf = sign | _u32(0x7F800000) | (man << _u32(23 - m))
    out = tirx.Select(special, nan_or_inf,
                      tirx.Select(tirx.EQ(field, _u32(0)), sub, normal))
    return tirx.reinterpret("float32", out)


def from_float32(x: Expr, dtype: str, bind: Bind) -> Expr:
    """Float32 ``x`` rounded to 8-bit float ``dtype``: its bits (``uint8``)."""
    if dtype_of(x) != "float32":
        raise TypeError(f"float8 rounding needs a float32 operand, got {dtype_of(x)}")
    e, m, fn = _FORMATS[dtype]
    bias = (1 << (e - 1)) - 1
    nan = 0x7F if fn else (((1 << e) - 1) << m) | (1 << (m - 1))
    overflow = 0x7F if fn else ((1 << e) - 1) << m
    max_finite = 0x7E if fn else overflow - 1
    bits = bind(tirx.reinterpret("uint32", x))
    a = bind(bits & _u32(0x7FFFFFFF))
    sign = (bits >> _u32(24)) & _u32(0x80)
    # A normal result (or overflow): round away the low 23 - m bits, then rebias.
    shift = 23 - m
    wide = bind((a + _u32((1 << (shift - 1)) - 1) + ((a >> _u32(shift)) & _u32(1)))
                >> _u32(shift))
    rebias = (127 - bias) << m
    normal = tirx.Select(wide > _u32(rebias + max_finite), _u32(overflow), wide - _u32(rebias))
    # Subnormal (or zero): the significand in units of the smallest subnormal,
    # 2^(1 - bias - m), rounded to nearest even. The shift is clamped to [1, 25] so that
    # both branches stay defined; past 24 everything rounds to 0 (float32 subnormals too).
    exponent = tirx.Cast("int32", a >> _u32(23))
    sh = tirx.Cast("uint32", tirx.max(tirx.min(tirx.const(151 - bias - m, "int32") - exponent,
                                               tirx.const(25, "int32")),
                                      tirx.const(1, "int32")))
    sh = bind(sh)
    sig = (a & _u32(0x7FFFFF)) | _u32(0x800000)
    q = bind(sig >> sh)
    rest = sig & ((_u32(1) << sh) - _u32(1))
    half = _u32(1) << (sh - _u32(1))
    up = tirx.Or(rest > half, tirx.And(tirx.EQ(rest, half), tirx.EQ(q & _u32(1), _u32(1))))
    sub = q + tirx.Select(up, _u32(1), _u32(0))
    mag = tirx.Select(a > _u32(0x7F800000), _u32(nan),
                      tirx.Select(a >= _u32((128 - bias) << 23), normal, sub))
    return tirx.Cast("uint8", sign | mag)


def narrow_to_odd(x: Expr, bind: Bind) -> Expr:
    """Float64 ``x`` as float32, rounded to odd (truncated, last bit set if anything was
    lost): rounding that to 8 bits gives what rounding ``x`` directly would."""
    x = bind(x)
    f = bind(tirx.Cast("float32", x))
    back = tirx.Cast("float64", f)
    bits = tirx.reinterpret("uint32", f)
    down = tirx.Select(tirx.abs(back) > tirx.abs(x), _u32(1), _u32(0))
    odd = (bits - down) | _u32(1)
    return tirx.reinterpret("float32", tirx.Select(tirx.NE(back, x), odd, bits))
