"""Operand checks of the library ops, made while tracing a kernel body: a mismatch that jnp
would reject must not become a silently wrong result (a kernel reads past a short operand,
or pads it with zeros). A failed check raises ValueError, which the trace reports as a
KernelError at the caller's line."""

from __future__ import annotations

from typing import Any


def rank(op: str, name: str, x: Any, n: int) -> None:
    """``x`` has ``n`` dimensions."""
    if len(x.shape) != n:
        raise ValueError(f"{op}: {name} must have rank {n}, got shape {tuple(x.shape)}")


def same_shape(op: str, **operands: Any) -> None:
    """All ``operands`` have one shape (the ops do not broadcast)."""
    (first, a), *rest = operands.items()
    for name, b in rest:
        if tuple(b.shape) != tuple(a.shape):
            raise ValueError(f"{op}: incompatible shapes: {first} has shape {tuple(a.shape)} "
                             f"but {name} has shape {tuple(b.shape)}; they must be equal")


def vector(op: str, name: str, v: Any, n: int, what: str) -> None:
    """``v`` has shape ``(n,)``, where ``n`` is ``what``."""
    if tuple(v.shape) != (n,):
        raise ValueError(f"{op}: {name} must have shape ({n},), {what}, got shape "
                         f"{tuple(v.shape)}")


def same_dtype(op: str, **operands: Any) -> None:
    """All ``operands`` have one dtype (the ops compute in and return that dtype)."""
    (first, a), *rest = operands.items()
    for name, b in rest:
        if b.dtype != a.dtype:
            raise TypeError(f"{op}: {first} is {a.dtype} but {name} is {b.dtype}; cast them "
                            "to one dtype")


def positive_int(op: str, name: str, value: Any) -> None:
    """``value`` is a Python int >= 1 (not a bool): a count of blocks or shares, where 0
    would launch no block and leave the output unwritten."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{op}: {name} must be a positive int, got {value!r}")
