"""Shared scratch arrays of the per-op GPU lowerings, as IR.

Some lowerings need shared memory beyond the kernel's buffers (a cross-warp reduction's
partials, a layout conversion's staging tile, a sort's buffers). What an op needs is
answered here, once per op kind, from the op and its operands' layouts (:data:`NEEDS`); the
``scratch`` pass (:func:`record_scratch`) writes the answer on each op as the note
``scratch``, a tuple of ``(role, C type, elements)`` (printed and parsed back with the IR),
and the lowering takes its arrays from that note (:meth:`.context.Context.scratch`), so code
generation does not decide them. The lowering's own structure comes from the same function
(:func:`reduce_folds` for ``reduce``, :func:`staged_operands` for the staged ops), so the
conditions that make an op need scratch are written once.

Scratch recorded so far: ``reduce`` (its partials across warps), the ops staged through
shared memory (``relayout``, ``reshape``, ``rev``, ``slice``, ``concatenate``, ``scan``,
``argreduce``: one ``staged`` array per operand with a layout) and ``sort`` (its keys,
positions and values). A fragment read or written in part by other threads (``load``,
``store``, ``copy``, ``atomic``, ``gemm`` of a fragment) is still staged by its lowering
directly (:meth:`.context.Context.shared_array`), and every scratch array is still placed
by code generation (:func:`.smem_plan.place_scratch`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from ... import ir
from ...target import GpuCaps
from ..layout import THREAD, Factor, Layout
from . import types as T
from .context import Context
from .sorts import key_type

SHUFFLE_TYPES = frozenset({"float", "int", "unsigned"})
"""Register types ``shfl_xor`` moves between lanes."""


@dataclasses.dataclass(frozen=True)
class Request:
    """One shared scratch array an op's lowering needs: what it is for, its C element type
    and its number of elements."""

    role: str
    ctype: str
    count: int

    def note(self) -> tuple[str, str, int]:
        return (self.role, self.ctype, self.count)


NEEDS: dict[str, Callable[[Context, ir.Op], tuple[Request, ...]]] = {}
"""Op kind -> the scratch its lowering needs, from the op and its operands' layouts."""


def _needs(*kinds: str):
    def register(fn: Callable[[Context, ir.Op], tuple[Request, ...]]):
        for kind in kinds:
            NEEDS[kind] = fn
        return fn
    return register


@dataclasses.dataclass(frozen=True)
class ReduceFolds:
    """How a reduction folds across threads: the result's layout, the thread factors of the
    reduced dimensions folded by warp shuffles, and those folded through shared memory."""

    source: Layout
    result: Layout
    in_warp: tuple[Factor, ...]
    across: tuple[Factor, ...]


def reduce_folds(cx: Context, op: ir.Op) -> ReduceFolds | None:
    """The folds of a ``reduce`` op; None when its operand is uniform (not lowered)."""
    src, axes = op.operands[0], op.attrs["axes"]
    lay = cx.layout(src)
    if lay is None:
        return None
    out = cx.result_layout(op.result, lay.drop(axes))
    factors = [f for d in axes for f in lay.dims[d] if f.kind == THREAD]
    ws = cx.warp_size
    shuffles = T.reg(np.dtype(op.result.dtype)) in SHUFFLE_TYPES and cx.threads % ws == 0
    in_warp = tuple(f for f in factors if shuffles and f.stride * f.size <= ws
                    and f.size & (f.size - 1) == 0)
    across = tuple(f for f in factors if f not in in_warp)
    return ReduceFolds(lay, out, in_warp, across)


@_needs("reduce")
def _reduce(cx: Context, op: ir.Op) -> tuple[Request, ...]:
    folds = reduce_folds(cx, op)
    if folds is None or not folds.across:
        return ()
    ctype = T.reg(np.dtype(op.result.dtype))
    return (Request("partials", ctype, cx.threads * folds.result.num_local),)


def staged_operands(cx: Context, op: ir.Op) -> list[ir.Value]:
    """The operands an op lowered through shared memory (:mod:`.staging`) writes to a
    ``staged`` array: those with a layout (a uniform one is read as its scalar)."""
    return [v for v in op.operands if cx.layout(v) is not None]


@_needs("relayout", "reshape", "rev", "slice", "concatenate", "scan", "argreduce")
def _staged(cx: Context, op: ir.Op) -> tuple[Request, ...]:
    return tuple(Request("staged", T.reg(np.dtype(v.dtype)), math.prod(v.shape))
                 for v in staged_operands(cx, op))


@_needs("sort")
def _sort(cx: Context, op: ir.Op) -> tuple[Request, ...]:
    """One array of sort keys per key operand, the positions, the values taken."""
    size = math.prod(op.result.shape)
    keys = op.operands[:op.attrs["num_keys"]]
    taken = op.operands[op.attrs["take"]]
    return (*(Request("key", key_type(v.dtype), size) for v in keys),
            Request("pos", "int", size), Request("vals", T.reg(np.dtype(taken.dtype)), size))


def record_scratch(kernel: ir.Kernel, caps: GpuCaps) -> ir.Kernel:
    """The ``scratch`` pass: every op whose lowering needs shared scratch gets the note
    ``scratch`` (``((role, C type, elements), ...)``).

    Assumes: layout inference ran (the requests depend on the operands' layouts).
    Guarantees: an op of a kind in :data:`NEEDS` carries exactly the requests its lowering
    takes (:meth:`.context.Context.scratch`); ops that need none carry no note."""
    cx = Context(kernel, caps.warp_size)

    def note(op: ir.Op) -> tuple[ir.Stmt, ...]:
        needs = NEEDS.get(op.kind)
        requests = needs(cx, op) if needs is not None else ()
        if not requests:
            return (op,)
        return (op.with_notes(scratch=tuple(r.note() for r in requests)),)

    return dataclasses.replace(kernel, body=ir.map_ops(kernel.body, note))
