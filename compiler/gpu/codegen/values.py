"""GPU lowering of value ops: constants, elementwise math, casts, selects, broadcasts,
iotas, transposes, and loads and stores of tile values."""

from __future__ import annotations

import numpy as np

from ... import ir
from ..layout import blocked
from . import scalar_math as M
from . import types as T
from .context import Context, row_major, size_c, size_minus
from .control import written_globals


def lower_const(cx: Context, op: ir.Op) -> None:
    res = op.result
    cx.w(f"const {T.reg(res.dtype)} {cx.define(res)} = "
         f"{T.literal(op.attrs['value'], res.dtype)};")


def lower_size(cx: Context, op: ir.Op) -> None:
    """A dynamic size used as a value: computed from the kernel's size parameters."""
    res = op.result
    cx.w(f"const {T.reg(res.dtype)} {cx.define(res)} = {T.reg(res.dtype)}"
         f"({size_c(op.attrs['expr'])});")


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
        index, _ = cx.address(region, [], clamp=True, checked=())
        if buf.scope == "fragment":
            # One element, held by some threads: every thread reads it from shared memory.
            value = f"{stage_fragment(cx, op, buf)}[{index}]"
        elif cx.loop_depth and buf.scope == "global" and buf.name in written_globals(cx.kernel):
            # Other blocks may change it between iterations (a while loop waiting on a
            # counter): read memory every time, never a copy kept in a register.
            value = T.from_memory(f"volatile_load({buf.name} + {index})", buf.dtype)
        else:
            value = _read(buf, index)
        cx.w(f"const {T.reg(res.dtype)} {cx.define(res)} = {value};")
        return
    lay = cx.layout(res)
    if buf.scope == "fragment" and not region.is_whole(buf.shape):
        _load_part(cx, op, buf)
        return
    name = cx.declare(res)
    if buf.scope == "fragment":
        with cx.slots(lay, need_coords=False):
            cx.w(f"{name}[k] = {buf.name}[k];")
        return
    with cx.slots(lay, guard=True) as coords:
        index, _ = cx.address(region, coords, clamp=True, checked=())
        cx.w(f"{name}[k] = {_read(buf, index)};")


def stage_fragment(cx: Context, op: ir.Op, buf: ir.Buffer) -> str:
    """Write a fragment buffer to ``op``'s next recorded ``staged`` scratch array
    (row-major over the buffer's shape) and wait for the block: its elements can then be
    read by any thread."""
    arr = cx.scratch(op, "staged")
    primary = cx.primary(buf.layout)
    with cx.slots(buf.layout, guard=True) as coords:
        stmt = f"{arr}[{row_major(coords, buf.shape)}] = {buf.name}[k];"
        cx.w(f"if ({primary}) {stmt}" if primary else stmt)
    cx.w("sync_threads();")
    return arr


def _load_part(cx: Context, op: ir.Op, buf: ir.Buffer) -> None:
    """Part of a fragment: its elements may sit in other threads, so through shared memory."""
    res, region = op.result, op.attrs["src"]
    arr = stage_fragment(cx, op, buf)
    name = cx.declare(res)
    with cx.slots(cx.layout(res), guard=True) as coords:
        index, _ = cx.address(region, coords, clamp=True, checked=())
        cx.w(f"{name}[k] = {arr}[{index}];")


def store_part(cx: Context, op: ir.Op, buf: ir.Buffer, combine: str | None = None) -> None:
    """Into (part of) a fragment, from a value in any layout: each thread takes the elements
    of its slots that the region covers from the value, staged in shared memory; with
    ``combine`` (an elementwise function) it folds them into the slots instead."""
    region, v = op.attrs["dst"], op.operands[0]
    lay = cx.layout(v)
    src = None
    if lay is not None:
        src = cx.scratch(op, "staged")
        primary = cx.primary(lay)
        with cx.slots(lay, guard=True) as coords:
            stmt = f"{src}[{row_major(coords, v.shape)}] = {cx.name(v)}[k];"
            cx.w(f"if ({primary}) {stmt}" if primary else stmt)
        cx.w("sync_threads();")
    starts = _clamped_starts(cx, region, buf)
    with cx.slots(buf.layout, guard=True) as coords:
        conds, tile = cx.in_region(region, coords, starts)
        value = cx.name(v) if src is None else f"{src}[{row_major(tile, v.shape)}]"
        value = M.convert(value, v.dtype, buf.dtype)
        if combine is not None:
            value = M.elementwise(combine, [f"{buf.name}[k]", value], buf.dtype)
        stmt = f"{buf.name}[k] = {value};"
        cx.w(f"if ({' && '.join(conds)}) {stmt}" if conds else stmt)


def _clamped_starts(cx: Context, region: ir.Region, buf: ir.Buffer) -> list[str]:
    """The region's starts as C text, dynamic ones clamped as JAX's swap does."""
    out = []
    for idx, n in zip(region.index, buf.shape):
        if isinstance(idx.start, ir.Value):
            hi = size_minus(n, idx.size or 1)
            s, name = cx.tmp("s"), cx.name(idx.start)
            cx.w(f"int {s} = {name} < 0 ? {name} + {size_c(n)} : {name};")
            cx.w(f"{s} = {s} < 0 ? 0 : ({s} > {hi} ? {hi} : {s});")
            out.append(s)
        else:
            out.append(str(idx.start))
    return out


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
        if not region.is_whole(buf.shape):
            store_part(cx, op, buf)
            return
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

