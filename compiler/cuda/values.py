"""CUDA lowering of value ops: constants, elementwise math, casts, selects, broadcasts,
iotas, transposes, and loads and stores of tile values."""

from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import KernelError
from . import scalar_math as M
from . import types as T
from .context import Context
from .layout import blocked


def lower_const(cx: Context, op: ir.Op) -> None:
    res = op.result
    cx.w(f"const {T.reg(res.dtype)} {cx.define(res)} = "
         f"{T.literal(op.attrs['value'], res.dtype)};")


def _math(op: ir.Op, args: list[str]) -> str:
    if op.kind == "elementwise":
        return M.elementwise(op.attrs["fn"], args, op.operands[0].dtype)
    if op.kind == "convert":
        return M.convert(args[0], op.operands[0].dtype, op.result.dtype)
    pred, on_false, on_true = args
    return f"({pred} ? {on_true} : {on_false})"


def lower_pointwise(cx: Context, op: ir.Op) -> None:
    """elementwise, convert, select."""
    res = op.result
    lay = cx.layout(res)
    if lay is None:
        args = [cx.name(v) for v in op.operands]
        cx.w(f"const {T.reg(res.dtype)} {cx.define(res)} = {_math(op, args)};")
        return
    name = cx.declare(res)
    with cx.slots(lay, need_coords=False):
        cx.w(f"{name}[k] = {_math(op, [cx.elem(v, lay) for v in op.operands])};")


def lower_broadcast(cx: Context, op: ir.Op) -> None:
    res, src = op.result, op.operands[0]
    lay = cx.layout(res)
    if lay is None:
        cx.w(f"const {T.reg(res.dtype)} {cx.define(res)} = {cx.name(src)};")
        return
    name = cx.declare(res)
    dims = op.attrs["dims"]
    if src.id in cx.uniform:
        slot = None
    else:
        gone = [d for d in range(len(res.shape)) if d not in dims]
        gone += [dims[i] for i, n in enumerate(src.shape) if n == 1 and res.shape[dims[i]] != 1]
        slot = lay.drop_slot_expr("k", gone)
    with cx.slots(lay, need_coords=False):
        cx.w(f"{name}[k] = {cx.name(src)}{'' if slot is None else f'[{slot}]'};")


def lower_iota(cx: Context, op: ir.Op) -> None:
    res = op.result
    lay = cx.layout(res)
    name = cx.declare(res)
    with cx.slots(lay) as coords:
        cx.w(f"{name}[k] = {T.reg(res.dtype)}({coords[op.attrs['dimension']]});")


def lower_transpose(cx: Context, op: ir.Op) -> None:
    # The result's layout is the operand's, permuted: the same slots hold the same elements.
    res, src = op.result, op.operands[0]
    name = cx.declare(res)
    with cx.slots(cx.layout(res), need_coords=False):
        cx.w(f"{name}[k] = {cx.name(src)}[k];")


def lower_load(cx: Context, op: ir.Op) -> None:
    res, region = op.result, op.attrs["src"]
    buf = cx.bufs[region.buffer]
    if res.shape == ():
        if buf.scope == "fragment":
            raise KernelError(f"a scalar read of fragment '{buf.name}' is not lowered for "
                              f"CUDA yet (at {op.line})")
        index, _ = cx.address(region, [], clamp=True, checked=())
        cx.w(f"const {T.reg(res.dtype)} {cx.define(res)} = {_read(buf, index)};")
        return
    lay = cx.layout(res)
    name = cx.declare(res)
    if buf.scope == "fragment":
        with cx.slots(lay, need_coords=False):
            cx.w(f"{name}[k] = {buf.name}[k];")
        return
    with cx.slots(lay, guard=True) as coords:
        index, _ = cx.address(region, coords, clamp=True, checked=())
        cx.w(f"{name}[k] = {_read(buf, index)};")


def _read(buf: ir.Buffer, index: str) -> str:
    if buf.scope == "local":
        return f"{buf.name}[{index}]"
    return T.from_memory(f"{buf.name}[{index}]", buf.dtype)


def write(buf: ir.Buffer, index: str, value: str, value_dtype: np.dtype) -> str:
    """C statement storing compute value ``value`` (of ``value_dtype``) into ``buf``."""
    value = M.convert(value, value_dtype, buf.dtype)
    if buf.scope == "local":
        return f"{buf.name}[{index}] = {value};"
    return f"{buf.name}[{index}] = {T.to_memory(value, buf.dtype)};"


def lower_store(cx: Context, op: ir.Op) -> None:
    region, v = op.attrs["dst"], op.operands[0]
    buf = cx.bufs[region.buffer]
    if buf.scope == "fragment":
        with cx.slots(buf.layout, need_coords=False):
            cx.w(f"{buf.name}[k] = {cx.elem(v, buf.layout)};")
        return
    if v.shape == ():
        index, _ = cx.address(region, [], clamp=True, checked=())
        stmt = write(buf, index, cx.name(v), v.dtype)
        cx.w(stmt if buf.scope == "local" else f"if (tid == 0) {stmt}")
        return
    lay = cx.layout(v)
    if buf.scope == "local":
        # Every thread holds the whole (replicated or uniform) tile: it writes all of it.
        shape = v.shape
        with cx.w.block(f"for (int i = 0; i < {int(np.prod(shape))}; ++i)"):
            coords = unflatten("i", shape)
            index, _ = cx.address(region, coords, clamp=True, checked=())
            src = cx.name(v) if lay is None else f"{cx.name(v)}[i]"
            cx.w(write(buf, index, src, v.dtype))
        return
    if lay is None:
        lay = blocked(v.shape, cx.threads)
    primary = cx.primary(lay)
    with cx.slots(lay, guard=True) as coords:
        index, _ = cx.address(region, coords, clamp=True, checked=())
        stmt = write(buf, index, cx.elem(v, lay), v.dtype)
        cx.w(f"if ({primary}) {stmt}" if primary else stmt)


def unflatten(var: str, shape: tuple[int, ...]) -> list[str]:
    """C expressions of the coordinates of row-major flat index ``var`` in ``shape``."""
    out = []
    for d in range(len(shape)):
        stride = int(np.prod(shape[d + 1:]))
        e = var if stride == 1 else f"{var} / {stride}"
        out.append(e if d == 0 else f"({e}) % {shape[d]}")
    return out

