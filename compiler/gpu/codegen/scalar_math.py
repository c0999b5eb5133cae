"""Per-element math as C expressions: the GPU implementation of :mod:`..semantics`.

Operands are C expressions of their compute type (:func:`.types.reg`); the helpers with an
``xla_`` prefix live in ``jaxtile/xla_math.h``. float16 and bfloat16 are computed in float
and rounded after every op.
"""

from __future__ import annotations

import numpy as np

from ... import semantics
from ...op_defs import BOOL_RESULTS
from . import types as T

_F32_NAMES = {"exp": "expf", "exp2": "exp2f", "log": "logf", "log1p": "log1pf",
              "expm1": "expm1f", "tanh": "tanhf", "sqrt": "sqrtf", "sin": "sinf",
              "cos": "cosf", "tan": "tanf", "asin": "asinf", "acos": "acosf",
              "atan": "atanf", "sinh": "sinhf", "cosh": "coshf", "asinh": "asinhf",
              "acosh": "acoshf", "atanh": "atanhf", "erf": "erff", "erfc": "erfcf",
              "floor": "floorf", "ceil": "ceilf", "round": "rintf", "round_away": "roundf",
              "abs": "fabsf"}
_BINARY_OPS = {"add": "+", "sub": "-", "mul": "*", "lt": "<", "le": "<=", "gt": ">",
               "ge": ">=", "eq": "==", "ne": "!="}
_BIT_OPS = {"and": "&", "or": "|", "xor": "^"}


def _fname(fn: str, compute: np.dtype) -> str:
    name = _F32_NAMES[fn]
    return name if compute == np.float32 else name.removesuffix("f")


def _unary(fn: str, x: str, dt: np.dtype) -> str:
    flt = T.is_float(dt)
    if fn == "neg":
        return f"(-{x})"
    if fn == "not":
        return f"(!{x})" if dt == np.bool_ else f"{T.reg(dt)}(~{x})"
    if fn == "abs" and not flt:
        return f"({x} < 0 ? {T.reg(dt)}(-{x}) : {x})"
    if fn == "sign":
        return f"xla_sign({x})"
    if fn == "square":
        return f"({x} * {x})"
    if fn == "logistic":
        return f"xla_logistic({x})"
    if fn == "rsqrt":
        one = "1.0f" if dt == np.float32 else "1.0"
        return f"({one} / {_fname('sqrt', dt)}({x}))"
    if fn == "is_finite":
        return f"xla_is_finite({x})"
    if not flt:
        raise NotImplementedError(f"{fn} of {dt}")
    return f"{_fname(fn, dt)}({x})"


def _binary(fn: str, a: str, b: str, dt: np.dtype) -> str:
    flt = T.is_float(dt)
    if fn in _BINARY_OPS:
        if fn in ("add", "sub", "mul") and dt != np.bool_:
            return f"{T.reg(dt)}({a} {_BINARY_OPS[fn]} {b})"
        return f"({a} {_BINARY_OPS[fn]} {b})"
    if fn == "div":
        return f"({a} / {b})" if flt else f"xla_div<{T.reg(dt)}>({a}, {b})"
    if fn == "rem":
        return f"{_fname_pair('fmod', dt)}({a}, {b})" if flt else \
            f"xla_rem<{T.reg(dt)}>({a}, {b})"
    if fn in ("max", "min"):
        return f"xla_{fn}<{T.reg(dt)}>({a}, {b})"
    if fn == "pow":
        return f"{_fname_pair('pow', dt)}({a}, {b})" if flt else \
            f"xla_ipow<{T.reg(dt)}>({a}, {b})"
    if fn == "atan2":
        return f"{_fname_pair('atan2', dt)}({a}, {b})"
    if fn in _BIT_OPS:
        if dt == np.bool_:
            return f"bool({a} {_BIT_OPS[fn]} {b})"
        return f"{T.reg(dt)}({a} {_BIT_OPS[fn]} {b})"
    raise NotImplementedError(fn)


def _fname_pair(name: str, dt: np.dtype) -> str:
    return name + "f" if dt == np.float32 else name


def elementwise(fn: str, args: list[str], dtype: np.dtype) -> str:
    """``fn`` of ``args`` (compute values of ``dtype``), as XLA computes it."""
    compute = semantics.compute_dtype(dtype)
    expr = _binary(fn, *args, compute) if len(args) == 2 else _unary(fn, args[0], compute)
    return expr if fn in BOOL_RESULTS else T.rounded(expr, dtype)


def convert(x: str, src: np.dtype, dst: np.dtype) -> str:
    """``x`` (compute value of ``src``) converted to ``dst`` with XLA's semantics."""
    src, dst = np.dtype(src), np.dtype(dst)
    if src == dst:
        return x
    if dst == np.bool_:
        return f"({x} != 0)"
    if src == np.bool_:
        return f"{T.reg(dst)}({x} ? 1 : 0)"
    if T.is_float(src) and not T.is_float(dst):
        lo, hi = semantics.saturation_bounds(dst)
        info = np.iinfo(dst)
        return (f"xla_f2i<{T.reg(dst)}>(double({x}), {lo!r}, {hi!r}, "
                f"{T.literal(int(info.min), dst)}, {T.literal(int(info.max), dst)})")
    if T.is_low_float(dst) and src == np.float64:
        # From the double itself: rounded once, as XLA does (through float32 a value that
        # lands halfway between two float16s would round a second time).
        return T.rounded(x, dst)
    if T.is_float(dst):
        return T.rounded(f"{T.reg(dst)}({x})", dst)
    return f"{T.reg(dst)}({x})"


def reduce_identity(fn: str, dtype: np.dtype) -> str:
    return T.literal(semantics.reduce_identity(fn, dtype), dtype)


def reduce_combine(fn: str, acc: str, x: str, dtype: np.dtype) -> str:
    return elementwise(semantics.reduce_combiner(fn, dtype), [acc, x], dtype)
