"""Shared scratch arrays of the per-op GPU lowerings, as IR.

Some lowerings need shared memory beyond the kernel's buffers (a cross-warp reduction's
partials, a layout conversion's staging tile, a sort's buffers, a fragment others read).
What an op needs is answered here, once per op kind, from the op and its operands' layouts
(:data:`NEEDS`); the ``scratch`` pass (:func:`record_scratch`) writes the answer on each op
as the note ``scratch``, a tuple of ``(role, C type, elements)`` (printed and parsed back
with the IR), and the lowering takes its arrays from that note
(:meth:`.context.Context.scratch`), so code generation does not decide them. The
lowering's own structure comes from the same function (:func:`reduce_folds` for ``reduce``,
:func:`staged_operands` for the staged ops, :func:`copy_through_shared` for ``copy``), so the
conditions that make an op need scratch are written once.

Every scratch array is recorded: ``reduce`` (its partials across warps), the ops staged
through shared memory (``relayout``, ``reshape``, ``rev``, ``slice``, ``concatenate``,
``scan``, ``argreduce``: one ``staged`` array per operand with a layout), ``sort`` (its
keys, positions and values) and a fragment read or written in part by other threads
(``load``, ``store``, ``atomic``, ``copy``, a ``gemm`` without a tensor-core plan). The
``smem_plan`` pass then appends each request's byte offset, and the barrier pass orders the
bytes' reuse (:mod:`..barriers`) with ``barrier`` ops.

The contract the barrier pass relies on: the lowering of an op that carries scratch writes
all of it, synchronises the block (``sync_threads``, in every thread: ops stand in uniform
control flow), and only then reads it; it adds no barrier before its first write or after
its last read (those are the barrier pass's, where another use of the bytes needs them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from ... import ir
from ...target import GpuCaps
from ..gemm_plan import recorded
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
    ws = cx.warp_size
    shuffles = T.reg(np.dtype(op.result.dtype)) in SHUFFLE_TYPES and cx.threads % ws == 0
    factors = [part for d in axes for f in lay.dims[d] if f.kind == THREAD
               for part in (_at_warp_edge(f, ws) if shuffles else (f,))]
    in_warp = tuple(f for f in factors if shuffles and f.stride * f.size <= ws
                    and f.size & (f.size - 1) == 0)
    across = tuple(f for f in factors if f not in in_warp)
    return ReduceFolds(lay, out, in_warp, across)


def _at_warp_edge(f: Factor, ws: int) -> tuple[Factor, ...]:
    """``f`` split where it crosses from one warp into the next: a thread digit of stride
    ``s`` and size ``n`` with ``s < ws < s n`` (powers of two) is the digit of the lanes
    (size ``ws / s``) and that of the warps above it (stride ``ws``), so that the lanes fold
    by shuffles and only one partial per warp goes through shared memory (a row of 128
    threads: 2 or 4 partials instead of 128, which each thread read back)."""
    pow2 = f.size & (f.size - 1) == 0 and f.stride & (f.stride - 1) == 0
    if not pow2 or not f.stride < ws < f.stride * f.size:
        return (f,)
    return (Factor(ws // f.stride, THREAD, f.stride),
            Factor(f.stride * f.size // ws, THREAD, ws))


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


def copy_through_shared(cx: Context, op: ir.Op) -> bool:
    """Whether a ``copy`` goes from a fragment to another fragment's layout, or into every
    thread's local copy, through shared memory (the elements a thread needs sit in other
    threads); a copy between fragments of one layout, whole, is a register move."""
    src, dst = op.attrs["src"], op.attrs["dst"]
    sb, db = cx.bufs[src.buffer], cx.bufs[dst.buffer]
    if math.prod(src.shape) == 0 or sb.scope != "fragment" or db.scope not in ("fragment",
                                                                             "local"):
        return False
    return not (db.scope == "fragment" and sb.layout == db.layout and src.is_whole(sb.shape)
                and dst.is_whole(db.shape))


def _fragment(buf: ir.Buffer) -> Request:
    return Request("staged", T.reg(np.dtype(buf.dtype)), math.prod(buf.shape))


def _value(cx: Context, v: ir.Value) -> tuple[Request, ...]:
    """A value written into part of a fragment: staged unless it is uniform."""
    if cx.layout(v) is None:
        return ()
    return (Request("staged", T.reg(np.dtype(v.dtype)), math.prod(v.shape)),)


@_needs("load")
def _load(cx: Context, op: ir.Op) -> tuple[Request, ...]:
    """One element or a part of a fragment: read by threads that do not hold it."""
    region = op.attrs["src"]
    buf = cx.bufs[region.buffer]
    if buf.scope == "fragment" and (op.result.shape == () or not region.is_whole(buf.shape)):
        return (_fragment(buf),)
    return ()


@_needs("store")
def _store(cx: Context, op: ir.Op) -> tuple[Request, ...]:
    region = op.attrs["dst"]
    buf = cx.bufs[region.buffer]
    if buf.scope == "fragment" and not region.is_whole(buf.shape):
        return _value(cx, op.operands[0])
    return ()


@_needs("atomic")
def _atomic(cx: Context, op: ir.Op) -> tuple[Request, ...]:
    buf = cx.bufs[op.attrs["dst"].buffer]
    return _value(cx, op.operands[0]) if buf.scope == "fragment" else ()


@_needs("copy")
def _copy(cx: Context, op: ir.Op) -> tuple[Request, ...]:
    return (_fragment(cx.bufs[op.attrs["src"].buffer]),) if copy_through_shared(cx, op) else ()


@_needs("gemm")
def _gemm(cx: Context, op: ir.Op) -> tuple[Request, ...]:
    """A gemm without a tensor-core plan reads its fragment operands from shared memory."""
    if recorded(op, cx.kernel) is not None:
        return ()
    bufs = (cx.bufs[op.attrs[r].buffer] for r in ("a", "b"))
    return tuple(_fragment(b) for b in bufs if b.scope == "fragment")


def record_scratch(kernel: ir.Kernel, caps: GpuCaps) -> ir.Kernel:
    """The ``scratch`` pass: every op whose lowering needs shared scratch gets the note
    ``scratch`` (``((role, C type, elements), ...)``).

    Assumes: layout inference ran (the requests depend on the operands' layouts).
    Guarantees: an op of a kind in :data:`NEEDS` carries exactly the requests its lowering
    takes (:meth:`.context.Context.scratch`); ops that need none carry no note."""
    cx = Context(kernel, caps.warp_size, caps.dialect)

    def note(op: ir.Op) -> tuple[ir.Stmt, ...]:
        needs = NEEDS.get(op.kind)
        requests = needs(cx, op) if needs is not None else ()
        if not requests:
            return (op,)
        return (op.with_notes(scratch=tuple(r.note() for r in requests)),)

    return dataclasses.replace(kernel, body=ir.map_ops(kernel.body, note))
