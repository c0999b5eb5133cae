"""Sorting tile values along an axis, for the CPU (``sort``, ``op_defs`` states its meaning).

Every line along the axis is sorted by a bitonic network: ``log2(N) * (log2(N) + 1) / 2``
rounds of ``N / 2`` compare-and-swaps for the power of two ``N >= n``, so
``O(n log^2 n)`` comparisons with no data-dependent trip count (an odd-even transposition
sort took ``n**2 / 2``: 4.1 s for one 65536-element tile). The first step of each merge
compares mirrored positions (``i`` with ``2w - 1 - i`` in a block of ``2w``), so every
comparator puts the smaller element first. Positions ``n..N`` hold padding that sorts after
every element (the last key in the sort's order, and positions from ``n`` up), so every
comparator runs, with no test of its positions. A compare-and-swap is written as
selects and unconditional stores: whether a pair swaps depends on the data, and as a
branch it was mispredicted often enough to cost 8-10% of a 65536-element sort. Each step
runs as blocks, then a run of positions in a block, whose pairs are contiguous (ascending
``lo``, ``hi`` ascending or, in a merge's first step, descending): LLVM vectorises that
inner loop (unconditional stores, which AVX2, with no masked integer stores, needs), which
halves the sort's time on AVX-512 and takes 40% off on AVX2.

A network is not stable, so each element carries its position and ties go to the lower one:
the order is then total, and the network's result is the stable sort. Keys are compared as
integers (:func:`_key`), the result operand is gathered through the sorted positions at the
end, so the values themselves (NaN payloads, -0.0 next to 0.0) are never recomputed.
"""

from __future__ import annotations

from tvm import tirx
from tvm.ir import Expr

from .. import ir, semantics
from . import elementwise as ew
from .context import Lowering


def _key(x: Expr, dtype: str, total_order: bool) -> Expr:
    """An integer whose order is ``x``'s sort order. Floats (``float32``/``float64``, the
    compute types) by their bits with the magnitude flipped under a set sign bit, which
    orders -NaN < -inf < ... < -0.0 < 0.0 < ... < inf < NaN; in XLA's order
    (``total_order`` False) -0.0 is 0.0 and every NaN the largest key instead."""
    if not ew.is_float(dtype):
        return tirx.Cast("int32", x) if dtype == "bool" else x
    itype = "int64" if dtype == "float64" else "int32"
    bits = tirx.reinterpret(itype, x)
    key = tirx.Select(bits < 0, tirx.bitwise_xor(bits, tirx.max_value(itype)), bits)
    if total_order:
        return key
    return tirx.Select(tirx.isnan(x), tirx.max_value(itype),
                       tirx.Select(x == tirx.const(0, dtype), tirx.const(0, itype), key))


def lower_sort(low: Lowering, op: ir.Op) -> None:
    """Emit a ``sort`` into an array; see the module docstring."""
    axis, res = op.attrs["axis"], op.result
    keys_in = op.operands[:op.attrs["num_keys"]]
    descending = op.attrs["descending"]
    n = res.shape[axis]
    stages = max(n - 1, 0).bit_length()          # N = 2**stages >= n
    others = [m for d, m in enumerate(res.shape) if d != axis]
    keys = []
    for v in keys_in:
        compute = ew.tvm_dtype(semantics.compute_dtype(v.dtype))
        kdtype = "int32" if compute == "bool" else (
            "int64" if compute == "float64" else "int32" if ew.is_float(compute) else compute)
        keys.append((v, compute, low.kb.alloc_local(low.name("key"), (1 << stages,),
                                                     kdtype)))
    pos = low.kb.alloc_local(low.name("pos"), (1 << stages,), "int32")
    arr = low.kb.alloc_local(low.name("t"), res.shape, ew.tvm_dtype(res.dtype))

    def at(idx: list[Expr], k: Expr) -> list[Expr]:
        return [*idx[:axis], k, *idx[axis:]]

    def precedes(i: Expr, j: Expr) -> Expr:
        """Whether the element at ``i`` goes before the one at ``j``."""
        out = pos[i] < pos[j]
        for _, _, key in reversed(keys):
            a, b = (key[j], key[i]) if descending else (key[i], key[j])
            out = tirx.Or(a < b, tirx.And(a == b, out))
        return out

    with low.nest(others, vectorize=False) as idx:
        with low.kb.loop(low.name("k"), n) as k:
            low.kb.store(pos, [k], k)
            for v, compute, key in keys:
                x = low.bind(ew.convert(low.at(v, at(idx, k)), ew.tvm_dtype(v.dtype),
                                        compute, low.bind))
                low.kb.store(key, [k], _key(x, compute, op.attrs["total_order"]))
        if n < 1 << stages:
            # The padding: a key no element's precedes (the largest, or the smallest when
            # descending; an element with that key too goes first by its lower position).
            with low.kb.loop(low.name("k"), (1 << stages) - n, start=n) as k:
                low.kb.store(pos, [k], k)
                for _, _, key in keys:
                    last = tirx.min_value if descending else tirx.max_value
                    low.kb.store(key, [k], last(key.dtype))

        def compare_and_swap(lo: Expr, hi: Expr) -> None:
            # Selects, not a branch (see the module docstring).
            swap = low.bind(precedes(hi, lo))
            for buf in (pos, *(key for _, _, key in keys)):
                a, b = low.bind(buf[lo]), low.bind(buf[hi])
                low.kb.store(buf, [lo], tirx.Select(swap, b, a))
                low.kb.store(buf, [hi], tirx.Select(swap, a, b))

        with low.kb.loop(low.name("stage"), stages) as s:
            # The first step of a merge compares mirrored positions in blocks of 2**(s+1);
            # the others positions 2**d apart.
            with low.kb.loop(low.name("block"), (1 << stages) >> (s + 1)) as blk:
                with low.kb.loop(low.name("r"), tirx.shift_left(1, s)) as r:
                    base = tirx.shift_left(blk, s + 1)
                    compare_and_swap(low.bind(base + r),
                                     low.bind(base + tirx.shift_left(2, s) - 1 - r))
            with low.kb.loop(low.name("step"), s, start=1) as t:
                d = s - t                        # compare elements 2**d apart
                with low.kb.loop(low.name("block"), (1 << stages) >> (d + 1)) as blk:
                    with low.kb.loop(low.name("r"), tirx.shift_left(1, d)) as r:
                        lo = low.bind(tirx.shift_left(blk, d + 1) + r)
                        compare_and_swap(lo, low.bind(lo + tirx.shift_left(1, d)))
        src = op.operands[op.attrs["take"]]
        with low.kb.loop(low.name("k"), n) as k:
            low.kb.store(arr, at(idx, k), low.at(src, at(idx, pos[k])))
    low.arrays[res.id] = arr
