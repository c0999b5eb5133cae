"""C types and literals of generated GPU code (CUDA, HIP, the emulator).

A tile element lives in a register as its *compute* type (float16, bfloat16 and the 8-bit
floats as a float already rounded to the storage type, bool as ``bool``) and in memory as
its *storage* type (``half``, ``bf16``, ``fp8e4m3``, ``fp8e5m2``, ``uint8_t`` for bool):
reads convert with :func:`from_memory`, writes with :func:`to_memory`.
"""

from __future__ import annotations

import math

import numpy as np

from ... import semantics

_REG = {
    "float32": "float", "float64": "double", "float16": "float", "bfloat16": "float",
    "bool": "bool", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t",
    "uint16": "uint16_t", "int32": "int", "uint32": "unsigned", "int64": "int64_t",
    "uint64": "uint64_t", "float8_e4m3fn": "float", "float8_e5m2": "float",
}
_MEM = {**_REG, "float16": "half", "bfloat16": "bf16", "bool": "uint8_t",
        "float8_e4m3fn": "fp8e4m3", "float8_e5m2": "fp8e5m2"}
# The device header's conversion into each narrow float, and its round trip through it.
_TO = {"float16": "to_half", "bfloat16": "to_bf16", "float8_e4m3fn": "to_fp8e4m3",
       "float8_e5m2": "to_fp8e5m2"}
_ROUND = {"float16": "round_f16", "bfloat16": "round_bf16", "float8_e4m3fn": "round_f8e4m3",
          "float8_e5m2": "round_f8e5m2"}


def reg(dtype: np.dtype) -> str:
    """The register (compute) type of ``dtype``."""
    return _REG[np.dtype(dtype).name]


def mem(dtype: np.dtype) -> str:
    """The memory (storage) type of ``dtype``."""
    return _MEM[np.dtype(dtype).name]


def memory_dtype(dtype: np.dtype) -> str:
    """The numpy name of the storage type (what the emulator's launch shim binds)."""
    name = np.dtype(dtype).name
    return "uint8" if name == "bool" else name


def is_low_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in semantics.LOW_FLOATS


def is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "f" or is_low_float(dtype)


def from_memory(expr: str, dtype: np.dtype) -> str:
    """A stored element as its compute type."""
    if is_low_float(dtype):
        return f"to_float({expr})"
    return f"({expr} != 0)" if np.dtype(dtype) == np.bool_ else expr


def to_memory(expr: str, dtype: np.dtype) -> str:
    """A compute value as its storage type."""
    name = np.dtype(dtype).name
    if name in _TO:
        return f"{_TO[name]}({expr})"
    return f"uint8_t({expr})" if name == "bool" else expr


def rounded(expr: str, dtype: np.dtype) -> str:
    """``expr`` (computed in float) rounded to ``dtype`` where that is a 16- or 8-bit float."""
    name = np.dtype(dtype).name
    return f"{_ROUND[name]}({expr})" if name in _ROUND else expr


def literal(value: bool | int | float, dtype: np.dtype) -> str:
    """``value`` as a C literal of ``dtype``'s compute type."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "true" if value else "false"
    if dtype.kind in "iu":
        v = int(value)
        if dtype.itemsize == 8 or not -(2**31) <= v < 2**31:
            return f"{reg(dtype)}({v}LL)" if dtype.kind == "i" else f"{v}ULL"
        return f"{v}u" if dtype.kind == "u" else str(v)
    if dtype == np.float64:
        v = float(value)
        if math.isfinite(v):
            return repr(v) if ("." in repr(v) or "e" in repr(v)) else f"{v!r}.0"
        return f"f64_bits({int(np.array(v, np.float64).view(np.uint64))}ull)"
    v32 = np.float32(value if not is_low_float(dtype) else float(np.array(value, dtype)))
    if np.isfinite(v32):
        text = str(v32)
        return f"{text}f" if ("." in text or "e" in text) else f"{text}.0f"
    return f"f32_bits({int(np.array(v32).view(np.uint32)):#x}u)"


_SIZES = {"float": 4, "double": 8, "half": 2, "bf16": 2, "bool": 1, "int8_t": 1,
          "uint8_t": 1, "fp8e4m3": 1, "fp8e5m2": 1, "int16_t": 2, "uint16_t": 2, "int": 4,
          "unsigned": 4, "int64_t": 8, "uint64_t": 8}


def sizeof(ctype: str) -> int:
    """Bytes of a C element type of shared arrays."""
    return _SIZES[ctype]
