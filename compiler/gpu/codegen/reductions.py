"""GPU lowering of ``reduce``: in registers, then warp shuffles, then shared memory.

The operand's layout says where the reduced elements are. Each thread first folds its own
slots into the result's slots (the result's layout is the operand's with the reduced
dimensions dropped, so slot ``k`` folds into ``drop_slot(k)``). Thread factors of the reduced
dimensions that lie inside a warp (power-of-two sizes) are folded by ``shfl_xor`` butterflies,
after which every lane of the group holds the result. What remains (factors across warps)
goes through a shared array (the op's ``partials`` scratch, which the ``scratch`` pass
records from :func:`.scratch.reduce_folds`, the split this lowering uses): the threads
whose in-warp digits are 0 write their partials, a barrier, and every thread folds the
partials of its group in a fixed order. The barrier pass orders the partials' bytes against
their other users (the previous iteration's reads in a loop, other scratch on them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ... import ir
from ...errors import KernelError
from ..layout import Factor, digit_expr
from . import scalar_math as M
from . import types as T
from .context import Context, source_line
from .scratch import reduce_folds


def lower_reduce(cx: Context, op: ir.Op) -> None:
    src, res = op.operands[0], op.result
    fn, axes = op.attrs["fn"], op.attrs["axes"]
    dtype = np.dtype(res.dtype)
    folds = reduce_folds(cx, op)
    if folds is None:
        raise KernelError(f"a reduction of a constant tile is not lowered for {cx.dialect} "
                          f"yet (at {source_line(op.line)})")
    lay, in_warp, across = folds.source, folds.in_warp, folds.across
    name, out_lay = cx.result(res, lay.drop(axes))
    cx.w("#pragma unroll")
    cx.w(f"for (int k = 0; k < {out_lay.num_local}; ++k) "
         f"{name}[k] = {M.reduce_identity(fn, dtype)};")
    with cx.slots(lay, need_coords=bool(lay.padded_dims()), guard=True):
        slot = lay.drop_slot_expr("k", axes)
        folded = M.reduce_combine(fn, f"{name}[{slot}]", f"{cx.name(src)}[k]", dtype)
        cx.w(f"{name}[{slot}] = {folded};")
    for f in in_warp:
        cx.w(f"// fold {f.size} lanes {f.stride} apart")
        offsets = [f.stride << i for i in range(f.size.bit_length() - 1)]
        cx.w("#pragma unroll")
        with cx.w.block(f"for (int k = 0; k < {out_lay.num_local}; ++k)"):
            for off in offsets:
                # Every lane of the warp runs the fold: the device header's full mask (32
                # lanes, or 64 for AMD's waves; a 32-bit literal leaves half a wave out).
                other = f"shfl_xor(kFullMask, {name}[k], {off})"
                cx.w(f"{name}[k] = {M.reduce_combine(fn, f'{name}[k]', other, dtype)};")
    if across:
        _across_warps(cx, op, name, out_lay.num_local, in_warp, across, dtype)
    cx.finish(res, name)


def _across_warps(cx: Context, op: ir.Op, name: str, slots: int,
                  in_warp: Sequence[Factor], across: Sequence[Factor], dtype: np.dtype) -> None:
    fn = op.attrs["fn"]
    ctype = T.reg(dtype)
    part = cx.scratch(op, "partials")
    cx.w(f"// fold {math.prod(f.size for f in across)} partials across warps through shared "
         f"memory")
    writer = " && ".join(f"{digit_expr('tid', f.stride, f.size, cx.threads)} == 0"
                         for f in in_warp)
    store = f"for (int k = 0; k < {slots}; ++k) {part}[tid * {slots} + k] = {name}[k];"
    cx.w(f"if ({writer}) {store}" if writer else store)
    cx.w("sync_threads();")
    base = cx.tmp("base")
    zeroed = " - ".join(["tid"] + [f"{digit_expr('tid', f.stride, f.size, cx.threads)} * "
                                   f"{f.stride}" for f in across + in_warp])
    cx.w(f"const int {base} = {zeroed};")
    cx.w("#pragma unroll")
    with cx.w.block(f"for (int k = 0; k < {slots}; ++k)"):
        acc = cx.tmp("acc")
        cx.w(f"{ctype} {acc} = {M.reduce_identity(fn, dtype)};")
        # Every digit combination of the across-warp factors, in a fixed order.
        total = math.prod(f.size for f in across)
        with cx.w.block(f"for (int d = 0; d < {total}; ++d)"):
            offset, radix = [], 1
            for f in across:
                digit = "d" if radix == 1 else f"(d / {radix})"
                offset.append(f"({digit} % {f.size}) * {f.stride}")
                radix *= f.size
            src = f"{part}[({base} + {' + '.join(offset)}) * {slots} + k]"
            cx.w(f"{acc} = {M.reduce_combine(fn, acc, src, dtype)};")
        cx.w(f"{name}[k] = {acc};")
