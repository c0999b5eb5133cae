"""GPU lowering of ``sort`` along one axis of a tile (``op_defs`` states its meaning).

The same bitonic network as ``compiler/cpu/sorts.py``, run by the whole block in shared
memory: ``O(n log^2 n)`` comparisons spread over the threads, in ``log2(N) * (log2(N) + 1)
/ 2`` rounds for the power of two ``N >= n``, each followed by a barrier (the comparators
of one round touch distinct elements, so a round has no races). The first step of each
merge compares mirrored positions, so positions past ``n`` act as +infinity and their
comparators are skipped. Each element carries its position in its line and ties go to the
lower one, which makes the order total and the result the stable sort.

Keys are staged as integers whose order is the sort order (:func:`_key_lines`), with the
positions and the operand the result takes; after the network each thread gathers its
result slots through the sorted positions, so values (NaN payloads, -0.0 next to 0.0) are
copied, never recomputed. The barrier pass keeps the next user of the buffers' bytes (in a
loop, the next iteration's staging) from overwriting what slower threads still gather.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ... import ir
from . import types as T
from .context import Context, row_major


def key_type(dtype: np.dtype) -> str:
    """The C type of a staged key: the float's bits as a signed integer, a bool as int."""
    reg = T.reg(dtype)
    if T.is_float(dtype):
        return "int64_t" if reg == "double" else "int"
    return "int" if reg == "bool" else reg


def _key_lines(x: str, dtype: np.dtype, total_order: bool, key: str) -> list[str]:
    """C statements defining ``key``, an integer whose order is ``x``'s sort order. A
    float's bits with the magnitude flipped under a set sign bit order -NaN < -inf < ...
    < -0.0 < 0.0 < ... < inf < NaN (``total_order``); XLA's order makes -0.0 0.0 and
    every NaN the largest key."""
    ktype = key_type(dtype)
    if not T.is_float(dtype):
        return [f"const {ktype} {key} = {ktype}({x});"]
    reg = T.reg(dtype)
    top = "0x7fffffffffffffffLL" if ktype == "int64_t" else "0x7fffffff"
    bits = f"{key}_bits"
    lines = [f"union {{ {reg} f; {ktype} i; }} {bits}{{{x}}};",
             f"{ktype} {key} = {bits}.i < 0 ? ({bits}.i ^ {top}) : {bits}.i;"]
    if not total_order:
        lines.append(f"{key} = {x} != {x} ? {top} : ({x} == 0 ? 0 : {key});")
    return lines


def lower_sort(cx: Context, op: ir.Op) -> None:
    """Emit a ``sort`` of tile values; see the module docstring."""
    res, axis = op.result, op.attrs["axis"]
    shape, n = res.shape, res.shape[op.attrs["axis"]]
    size, inner = math.prod(shape), math.prod(shape[axis + 1:])
    stages = max(n - 1, 0).bit_length()          # N = 2**stages >= n
    half = (1 << stages) // 2
    descending, total = op.attrs["descending"], op.attrs["total_order"]
    src = op.operands[op.attrs["take"]]
    keys = [(v, cx.scratch(op, "key")) for v in op.operands[:op.attrs["num_keys"]]]
    pos = cx.scratch(op, "pos")
    vals = cx.scratch(op, "vals")

    def stage(v: ir.Value, body: Callable[[str], list[str]], dst: str) -> None:
        """Write ``body(x)``'s last variable for each element ``x`` of ``v`` to ``dst``."""
        lay = cx.layout(v)
        if lay is None:                          # one value: every element
            with cx.w.block(f"for (int e = tid; e < {size}; e += {cx.threads})"):
                for line in body(cx.name(v)):
                    cx.w(line)
                cx.w(f"{dst}[e] = staged;")
            return
        primary = cx.primary(lay)
        with cx.slots(lay, guard=True) as c:
            for line in body(f"{cx.name(v)}[k]"):
                cx.w(line)
            stmt = f"{dst}[{row_major(c, shape)}] = staged;"
            cx.w(f"if ({primary}) {stmt}" if primary else stmt)

    for v, key in keys:
        stage(v, lambda x, v=v: _key_lines(x, v.dtype, total, "staged"), key)
    stage(src, lambda x: [f"const {T.reg(src.dtype)} staged = {x};"], vals)
    with cx.w.block(f"for (int e = tid; e < {size}; e += {cx.threads})"):
        cx.w(f"{pos}[e] = e / {inner} % {n};")
    cx.w("sync_threads();")

    def precedes(i: str, j: str) -> str:
        out = f"{pos}[{i}] < {pos}[{j}]"
        for _, key in reversed(keys):
            a, b = (f"{key}[{j}]", f"{key}[{i}]") if descending else (f"{key}[{i}]",
                                                                       f"{key}[{j}]")
            out = f"{a} < {b} || ({a} == {b} && ({out}))"
        return out

    if stages:
        with cx.w.block(f"for (int s = 0; s < {stages}; ++s)"), \
                cx.w.block("for (int t = 0; t <= s; ++t)"):
            with cx.w.block(f"for (int e = tid; e < {size // n * half}; e += {cx.threads})"):
                cx.w(f"const int line = e / {half}, m = e % {half}, d = s - t;")
                cx.w("const int block = (m >> d) << (d + 1), r = m & ((1 << d) - 1);")
                cx.w("const int lo = block + r;")
                cx.w("const int hi = t == 0 ? block + (2 << d) - 1 - r : lo + (1 << d);")
                with cx.w.block(f"if (hi < {n})"):
                    cx.w(f"const int base = line / {inner} * {n * inner} + line % {inner};")
                    cx.w(f"const int a = base + lo * {inner}, b = base + hi * {inner};")
                    with cx.w.block(f"if ({precedes('b', 'a')})"):
                        # (a named type: in the emulator a shared element is a proxy)
                        for arr, ctype in ((pos, "int"), *((key, key_type(v.dtype))
                                                           for v, key in keys)):
                            cx.w(f"const {ctype} {arr}_a = {arr}[a];")
                            cx.w(f"{arr}[a] = {arr}[b];")
                            cx.w(f"{arr}[b] = {arr}_a;")
            cx.w("sync_threads();")
    name, lay = cx.result(res)
    with cx.slots(lay, guard=True) as c:
        at = row_major(c, shape)
        cx.w(f"{name}[k] = {vals}[{at} + ({pos}[{at}] - ({c[axis]})) * {inner}];")
    cx.finish(res, name)
