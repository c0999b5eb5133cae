"""GPU lowering of ops whose result elements come from other threads' elements, through
shared memory: ``relayout`` (a layout conversion that inference inserted), ``reshape``,
``rev``, ``slice``, ``concatenate``, ``scan`` and ``argreduce``.

Each operand is written to a shared array in row-major order (one replica per element),
the block waits at a barrier, and each thread computes its result slots from the array:
one read for the index mappings, a loop along the axis for scans and arg-reductions. The
barrier pass orders the array's bytes against their other users (in a loop, the previous
iteration's reads), as for all scratch (:mod:`.scratch`).
"""

from __future__ import annotations

import itertools

import numpy as np

from ... import ir
from . import scalar_math as M
from . import types as T
from .context import Context, row_major
from .scratch import staged_operands


def _stage(cx: Context, op: ir.Op) -> list[str | None]:
    """Write each operand of ``op`` that has a layout to its recorded ``staged`` scratch
    array (row-major); None for a uniform operand."""
    staged = {v.id for v in staged_operands(cx, op)}
    return [_stage_one(cx, op, v) if v.id in staged else None for v in op.operands]


def _stage_one(cx: Context, op: ir.Op, v: ir.Value) -> str:
    lay = cx.layout(v)
    arr = cx.scratch(op, "staged")
    primary = cx.primary(lay)
    with cx.slots(lay, guard=True) as coords:
        stmt = f"{arr}[{row_major(coords, v.shape)}] = {cx.name(v)}[k];"
        cx.w(f"if ({primary}) {stmt}" if primary else stmt)
    return arr


def _read(arr: str | None, v: ir.Value, cx: Context, coords: list[str]) -> str:
    return cx.name(v) if arr is None else f"{arr}[{row_major(coords, v.shape)}]"


def lower_staged(cx: Context, op: ir.Op) -> None:
    res = op.result
    arrays = _stage(cx, op)
    cx.w("sync_threads();")
    name, lay = cx.result(res)
    with cx.slots(lay, guard=True) as c:
        cx.w(f"{name}[k] = {_element(cx, op, arrays, c)};")
    cx.finish(res, name)


def _element(cx: Context, op: ir.Op, arrays: list[str | None], c: list[str]) -> str:
    src, res = op.operands[0], op.result
    arr = arrays[0]
    k = op.kind
    if k in ("relayout",):
        return _read(arr, src, cx, c)
    if k == "reshape":
        flat = row_major(c, res.shape)
        return cx.name(src) if arr is None else f"{arr}[{flat}]"
    if k == "rev":
        dims = op.attrs["dims"]
        return _read(arr, src, cx, [f"{src.shape[d] - 1} - ({x})" if d in dims else x
                                    for d, x in enumerate(c)])
    if k == "slice":
        return _read(arr, src, cx, [f"{s} + ({x}) * {st}" if (s, st) != (0, 1) else x
                                    for x, s, st in zip(c, op.attrs["start"],
                                                        op.attrs["stride"])])
    if k == "concatenate":
        d = op.attrs["dimension"]
        offsets = list(itertools.accumulate([0] + [v.shape[d] for v in op.operands]))
        expr = None
        for v, a, off in reversed(list(zip(op.operands, arrays, offsets))):
            at = [f"({x}) - {off}" if i == d and off else x for i, x in enumerate(c)]
            read = _read(a, v, cx, at)
            expr = read if expr is None else f"(({c[d]}) < {off + v.shape[d]} ? {read} : {expr})"
        return expr
    raise AssertionError(k)


def lower_scan(cx: Context, op: ir.Op) -> None:
    """Inclusive scan along one axis: each element folds its prefix (or suffix) from the
    staged operand."""
    src, res = op.operands[0], op.result
    fn, axis, reverse = op.attrs["fn"], op.attrs["axis"], op.attrs["reverse"]
    dtype = np.dtype(res.dtype)
    (arr,) = _stage(cx, op)
    cx.w("sync_threads();")
    name, lay = cx.result(res)
    n = src.shape[axis]
    with cx.slots(lay, guard=True) as c:
        acc = cx.tmp("acc")
        cx.w(f"{T.reg(dtype)} {acc} = {M.reduce_identity(fn, dtype)};")
        rng = f"int i = {c[axis]}; i < {n}; ++i" if reverse else f"int i = 0; i <= {c[axis]}; ++i"
        at = [("i" if d == axis else x) for d, x in enumerate(c)]
        with cx.w.block(f"for ({rng})"):
            cx.w(f"{acc} = {M.reduce_combine(fn, acc, _read(arr, src, cx, at), dtype)};")
        cx.w(f"{name}[k] = {acc};")
    cx.finish(res, name)


def lower_argreduce(cx: Context, op: ir.Op) -> None:
    """Index of the first maximum (minimum) along one axis, NaN counting as the extreme."""
    src, res = op.operands[0], op.result
    fn, axis = op.attrs["fn"], op.attrs["axis"]
    (arr,) = _stage(cx, op)
    cx.w("sync_threads();")
    name, lay = cx.result(res)
    cmp = ">" if fn == "max" else "<"
    with cx.slots(lay, guard=True) as c:
        full = list(c[:axis]) + ["i"] + list(c[axis:])
        first = list(c[:axis]) + ["0"] + list(c[axis:])
        best, at = cx.tmp("best"), cx.tmp("at")
        cx.w(f"{T.reg(src.dtype)} {best} = {_read(arr, src, cx, first)};")
        cx.w(f"int {at} = 0;")
        with cx.w.block(f"for (int i = 1; i < {src.shape[axis]}; ++i)"):
            x = cx.tmp("x")
            cx.w(f"const {T.reg(src.dtype)} {x} = {_read(arr, src, cx, full)};")
            nan = f"{x} != {x} || " if T.is_float(src.dtype) else ""
            cx.w(f"if ({best} == {best} && ({nan}{x} {cmp} {best})) {{ {best} = {x}; "
                 f"{at} = i; }}")
        cx.w(f"{name}[k] = {T.reg(res.dtype)}({at});")
    cx.finish(res, name)
