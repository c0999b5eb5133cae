"""Scans (running reductions) and arg-reductions of tile values, for the CPU.

Both walk one axis in order, for every position of the other axes: a scan keeps the running
value and stores it at each step; an arg-reduction keeps the best value and its index,
replacing them only for a strictly better element (or the first NaN), so the first
extreme wins as in XLA.
"""

from __future__ import annotations

from tvm import tirx
from tvm.ir import Expr

from .. import ir
from . import elementwise as ew
from .context import Lowering


def _others(shape: tuple[int, ...], axis: int) -> list[int]:
    return [n for d, n in enumerate(shape) if d != axis]


def _with_axis(idx: list[Expr], axis: int, at: Expr) -> list[Expr]:
    return [*idx[:axis], at, *idx[axis:]]


def lower_scan(low: Lowering, op: ir.Op) -> None:
    """Emit a ``scan`` into an array."""
    src, res = op.operands[0], op.result
    fn, axis, reverse = op.attrs["fn"], op.attrs["axis"], op.attrs["reverse"]
    dtype = ew.tvm_dtype(res.dtype)
    n = src.shape[axis]
    arr = low.kb.alloc_local(low.name("t"), res.shape, dtype)
    acc = low.kb.alloc_local(low.name("acc"), (1,), dtype)
    with low.nest(_others(src.shape, axis), vectorize=False) as idx:
        low.kb.store(acc, [0], ew.reduce_init(fn, dtype))
        with low.kb.loop(low.name("s"), n) as k:
            at = _with_axis(idx, axis, (n - 1 - k) if reverse else k)
            low.kb.store(acc, [0], ew.reduce_combine(fn, acc[0], low.at(src, at), dtype,
                                                     low.bind))
            low.kb.store(arr, at, acc[0])
    low.arrays[res.id] = arr


def lower_argreduce(low: Lowering, op: ir.Op) -> None:
    """Emit an ``argreduce`` into an array (or a scalar)."""
    src, res = op.operands[0], op.result
    fn, axis = op.attrs["fn"], op.attrs["axis"]
    dtype, index_dtype = ew.tvm_dtype(src.dtype), ew.tvm_dtype(res.dtype)
    floating = ew.is_float(dtype)
    compute = ew.order_dtype(src.dtype)
    n = src.shape[axis]
    best = low.kb.alloc_local(low.name("best"), (1,), compute)
    where = low.kb.alloc_local(low.name("arg"), (1,), index_dtype)
    arr = low.kb.alloc_local(low.name("t"), res.shape, index_dtype) if res.shape else None
    with low.nest(res.shape, vectorize=False) as idx:
        first = ew.convert(low.at(src, _with_axis(idx, axis, tirx.const(0, "int32"))), dtype,
                           compute, low.bind)
        low.kb.store(best, [0], first)
        low.kb.store(where, [0], tirx.const(0, index_dtype))
        with low.kb.loop(low.name("a"), n - 1, start=1) as k:
            x = low.bind(ew.convert(low.at(src, _with_axis(idx, axis, k)), dtype, compute,
                                    low.bind))
            better = tirx.GT(x, best[0]) if fn == "max" else tirx.LT(x, best[0])
            if floating:
                better = tirx.Or(better, tirx.And(ew.is_nan(x, compute),
                                                  tirx.Not(ew.is_nan(best[0], compute))))
            better = low.bind(better)
            low.kb.store(best, [0], tirx.Select(better, x, best[0]))
            low.kb.store(where, [0], tirx.Select(better, tirx.Cast(index_dtype, k), where[0]))
        if arr is not None:
            low.kb.store(arr, idx, where[0])
    if arr is None:
        low.scalars[res.id] = low.kb.let(low.name("s"), where[0])
    else:
        low.arrays[res.id] = arr
