"""Sorting tile values along an axis, for the CPU.

XLA's order (``lax.sort``'s default comparator), stable: a float is less than another when
it compares less, or when only the other is NaN; so NaNs end up last and -0.0 and 0.0 keep
their order. Every line along the axis is sorted by odd-even transposition: ``n`` rounds of
compare-and-swap of neighbours, swapping only a strictly smaller right neighbour, which
keeps equal elements in order. Tiles are small, so the ``n**2 / 2`` comparisons are cheap
next to a branchy merge sort, and the loop has no data-dependent trip count.
"""

from __future__ import annotations

from tvm import tirx
from tvm.ir import Expr

from .. import ir
from . import elementwise as ew
from .context import Lowering


def _less(a: Expr, b: Expr, floating: bool) -> Expr:
    if not floating:
        return a < b
    return tirx.Or(a < b, tirx.And(tirx.isnan(b), tirx.Not(tirx.isnan(a))))


def lower_sort(low: Lowering, op: ir.Op) -> None:
    """Emit a ``sort`` into an array."""
    src, res, axis = op.operands[0], op.result, op.attrs["axis"]
    dtype = ew.tvm_dtype(res.dtype)
    compute = ew.order_dtype(res.dtype)
    floating = ew.is_float(dtype)
    n = src.shape[axis]
    work = low.kb.alloc_local(low.name("sort"), (n,), compute)
    arr = low.kb.alloc_local(low.name("t"), res.shape, dtype)
    others = [m for d, m in enumerate(src.shape) if d != axis]

    def at(idx: list[Expr], k: Expr) -> list[Expr]:
        return [*idx[:axis], k, *idx[axis:]]

    with low.nest(others, vectorize=False) as idx:
        with low.kb.loop(low.name("k"), n) as k:
            low.kb.store(work, [k], ew.convert(low.at(src, at(idx, k)), dtype, compute,
                                               low.bind))
        with low.kb.loop(low.name("round"), n) as r:
            with low.kb.loop(low.name("j"), n // 2) as j:
                i = 2 * j + tirx.floormod(r, 2)
                with low.kb.if_(i + 1 < n):
                    left, right = work[i], work[i + 1]
                    with low.kb.if_(_less(right, left, floating)):
                        keep = low.bind(left)
                        low.kb.store(work, [i], right)
                        low.kb.store(work, [i + 1], keep)
        with low.kb.loop(low.name("k"), n) as k:
            low.kb.store(arr, at(idx, k), ew.convert(work[k], compute, dtype, low.bind))
    low.arrays[res.id] = arr
