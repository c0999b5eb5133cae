"""CUDA lowering of ``sort`` along one axis of a tile, in XLA's stable order.

XLA's order (``lax.sort``'s default comparator, as ``compiler/cpu/sorts.py``): a float is
less than another when it compares less, or when only the other is NaN, so NaNs go last;
elements neither less than the other (equal values, -0.0 and 0.0, two NaNs) keep their
order. The operand is staged in shared memory; every thread computes the *rank* of each of
its elements in its line -- how many elements are less, plus how many equal ones come
before it -- and writes the element to that position of a second shared array; after a
barrier each thread reads its result slots. That is ``n`` comparisons per element for a
line of ``n`` and two barriers, with no rounds: tiles are small, and the ranks of distinct
positions are distinct, so every position is written once. In a loop no third barrier is
needed: the last reads of each array in one iteration come before a barrier that precedes
its first write in the next (the staged array is read before the second barrier, the
sorted one before the next iteration's first).
"""

from __future__ import annotations

import math

from .. import ir
from ..errors import KernelError
from . import types as T
from .context import Context, row_major


def _less(a: str, b: str, floating: bool) -> str:
    if not floating:
        return f"({a} < {b})"
    return f"({a} < {b} || ({b} != {b} && {a} == {a}))"


def lower_sort(cx: Context, op: ir.Op) -> None:
    """Emit a ``sort`` (attribute ``axis``) of a tile value; see the module docstring."""
    src, res = op.operands[0], op.result
    if len(op.operands) > 1 or op.attrs["descending"] or op.attrs["total_order"]:
        raise KernelError("argsort, top_k and sorts of several operands are not lowered "
                          f"for CUDA yet (line {op.line})")
    axis, n = op.attrs["axis"], src.shape[op.attrs["axis"]]
    reg = T.reg(src.dtype)
    src_lay = cx.layout(src)
    name, lay = cx.result(res)
    if src_lay is None:
        # Every element is the same value: sorted already.
        with cx.slots(lay, need_coords=False):
            cx.w(f"{name}[k] = {cx.name(src)};")
        cx.finish(res, name)
        return
    floating = T.is_float(src.dtype)
    size = math.prod(src.shape)
    staged = cx.shared_array(reg, size, "staged")
    ordered = cx.shared_array(reg, size, "sorted")
    primary = cx.primary(src_lay)
    with cx.slots(src_lay, guard=True) as c:
        stmt = f"{staged}[{row_major(c, src.shape)}] = {cx.name(src)}[k];"
        cx.w(f"if ({primary}) {stmt}" if primary else stmt)
    cx.w("sync_threads();")
    with cx.slots(src_lay, guard=True) as c:
        x, rank, y = cx.tmp("x"), cx.tmp("r"), cx.tmp("x")
        cx.w(f"const {reg} {x} = {cx.name(src)}[k];")
        cx.w(f"int {rank} = 0;")
        at = [("i" if d == axis else e) for d, e in enumerate(c)]
        with cx.w.block(f"for (int i = 0; i < {n}; ++i)"):
            cx.w(f"const {reg} {y} = {staged}[{row_major(at, src.shape)}];")
            cx.w(f"{rank} += {_less(y, x, floating)} || "
                 f"(i < {c[axis]} && !{_less(x, y, floating)});")
        to = [(rank if d == axis else e) for d, e in enumerate(c)]
        stmt = f"{ordered}[{row_major(to, src.shape)}] = {x};"
        cx.w(f"if ({primary}) {stmt}" if primary else stmt)
    cx.w("sync_threads();")
    with cx.slots(lay, guard=True) as c:
        cx.w(f"{name}[k] = {ordered}[{row_major(c, res.shape)}];")
    cx.finish(res, name)
