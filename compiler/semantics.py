"""XLA's per-element semantics, stated once, for every target.

jaxtile's compiled kernels compute what XLA computes for the same jnp program, element by
element, including where C, CUDA or LLVM would leave the result undefined or trap. These
are the rules; each target implements them with its own math library (the CPU's
vectorisable polynomials in ``cpu/``, later the CUDA device header's functions), and
``tests/compiler/test_semantics.py`` checks each rule against XLA itself.

- **Half precision.** float16 and bfloat16 math is done in float32 and rounded to the
  storage type (to nearest, ties to even) after *every* op (:func:`compute_dtype`). Running
  sums and products (reductions and scans with sum or prod, gemm accumulators) are the
  exception: they accumulate in float32 and are rounded once, when stored
  (``passes/wide_accumulation.py`` states this in the IR).
- **8-bit floats.** float8_e4m3fn and float8_e5m2 are storage types: kernels load, store,
  copy and move them, convert them to and from every other type, and take them as gemm
  operands (exact in float32, accumulated in float32); arithmetic on them is a KernelError
  that says to convert first (:data:`FLOAT8`). Converting to them rounds to nearest, ties to
  even, once, from the float32 (or wider) value, as ``ml_dtypes`` and XLA do: float8_e5m2
  overflows to inf, float8_e4m3fn (no inf) overflows to NaN, and inf becomes NaN there;
  subnormals are kept, NaN stays NaN (``tests/compiler/test_float8.py`` checks XLA against
  ``ml_dtypes`` and every backend against both).
- **Integer division** never traps: ``x / 0`` is -1 (all ones for unsigned types), ``x % 0``
  is ``x``, ``INT_MIN / -1`` is ``INT_MIN`` and ``INT_MIN % -1`` is 0
  (:func:`int_div_by_zero`, :func:`int_overflow_quotient`). Quotients truncate toward zero
  and remainders take the dividend's sign.
- **Float to integer** conversion saturates at the integer type's bounds and maps NaN to 0
  (:func:`saturation_bounds`, :data:`NAN_TO_INT`).
- **Float to bool** is ``x != 0``, so NaN is true.
- **Comparisons** with a NaN operand are false, except ``ne`` (:data:`UNORDERED_RESULT`).
- **min/max** propagate NaN (either operand NaN gives NaN); ``max(-0.0, 0.0)`` may be either
  zero.
- **Reductions** start from their identity (:func:`reduce_identity`) and combine with an
  elementwise op (:func:`reduce_combiner`); a sum of bools is their ``or``.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

FLOAT8 = frozenset({np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)})
"""8-bit floats: values in float32 (exactly), stored as bytes; no arithmetic."""
LOW_FLOATS = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}) | FLOAT8
"""Storage-only float types: computed in float32, rounded after every op (for the 8-bit
floats, which take no arithmetic, only conversions round)."""
NAN_TO_INT = 0
UNORDERED_RESULT = {"lt": False, "le": False, "gt": False, "ge": False, "eq": False,
                    "ne": True}
"""The result of each comparison when an operand is NaN."""
_COMBINERS = {"sum": "add", "prod": "mul", "max": "max", "min": "min", "and": "and",
              "or": "or"}


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The type elementwise math on ``dtype`` is computed in."""
    return np.dtype(np.float32) if np.dtype(dtype) in LOW_FLOATS else np.dtype(dtype)


def int_div_by_zero(dtype: np.dtype) -> int:
    """``x / 0`` for integer ``dtype``: -1, or all ones for an unsigned type."""
    info = np.iinfo(dtype)
    return int(info.max) if info.min == 0 else -1


def int_overflow_quotient(dtype: np.dtype) -> tuple[int, int] | None:
    """``(INT_MIN, INT_MIN)``: the quotient of ``INT_MIN / -1`` for a signed ``dtype``
    (the remainder being 0), or None for an unsigned one."""
    info = np.iinfo(dtype)
    return None if info.min == 0 else (int(info.min), int(info.min))


def saturation_bounds(dtype: np.dtype) -> tuple[float, float]:
    """The float range that a float -> ``dtype`` conversion clamps to."""
    info = np.iinfo(dtype)
    return float(info.min), float(info.max)


def reduce_identity(fn: str, dtype: np.dtype) -> bool | int | float:
    """The value reduction ``fn`` starts from in ``dtype``."""
    dtype = np.dtype(dtype)
    if fn in ("sum", "or"):
        return False if dtype == np.bool_ else 0
    if fn in ("prod", "and"):
        if dtype == np.bool_:
            return True
        # "and" starts from all ones: -1, or the maximum of an unsigned type
        return 1 if fn == "prod" else int(np.iinfo(dtype).max) if dtype.kind == "u" else -1
    if dtype == np.bool_:
        return fn == "min"
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return int(info.min if fn == "max" else info.max)
    return -math.inf if fn == "max" else math.inf


def reduce_combiner(fn: str, dtype: np.dtype) -> str:
    """The elementwise function that folds one more element into reduction ``fn``."""
    if np.dtype(dtype) == np.bool_ and fn == "sum":
        return "or"
    return _COMBINERS[fn]
