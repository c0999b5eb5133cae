"""Atomic updates (``atomic`` ops) and memory ordering between blocks (``load_acquire``,
``store_release``, ``fence``) for the CPU.

Blocks of one call run on several threads, so an update of a global buffer goes through
the runtime's atomic functions (``jaxtile_atomic_<fn>_<type>`` in ``ffi/runtime_env.cc``,
bound when the library is loaded); positions past the buffer's edge are skipped. An
on-chip buffer belongs to one block, run by one thread, so it is updated in place.

A block runs on one CPU thread, so ordering between blocks is ordering between threads: the
runtime's ``jaxtile_load_acquire_<type>``, ``jaxtile_store_release_<type>`` (C11 acquire and
release atomics) and ``jaxtile_fence`` (a sequentially consistent fence). Being calls the
compiler cannot see into, they also keep LLVM from holding a flag in a register across a
waiting loop or moving other memory accesses across them; a plain scalar read of global
memory the kernel writes, inside a ``jt.while_``, is read through the acquire load for the
first reason (:func:`polled_load`), as CUDA reads it with ``ld.volatile``.
"""

from __future__ import annotations

from tvm import tirx

from .. import ir, op_defs
from . import elementwise as ew
from .context import Lowering, extent
from .copies import all_of

_SUFFIX = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64"}


def lower_atomic(low: Lowering, op: ir.Op) -> None:
    """Emit an ``atomic`` op."""
    region, fn, value = op.attrs["dst"], op.attrs["fn"], op.operands[0]
    buf = low.bufs[region.buffer]
    dtype = str(buf.dtype)
    on_chip = low.scopes[region.buffer] != "global"
    with low.nest(value.shape, vectorize=on_chip) as idx:
        coords = low.element(region, idx, clamp=False)
        v = low.at(value, idx)
        if on_chip:
            low.kb.store(buf, coords, ew.elementwise(fn, [buf[tuple(coords)], v], dtype, dtype,
                                                     low.bind))
            return
        cond = all_of([tirx.And(c >= 0, c < extent(n)) for c, n in zip(coords, buf.shape)])
        call = tirx.call_extern("int32", f"jaxtile_atomic_{fn}_{_SUFFIX[dtype]}",
                                tirx.address_of(tirx.BufferLoad(buf, coords)), v)
        with low.kb.if_(cond):
            low.kb.emit(tirx.Evaluate(call))


def _flag_address(low: Lowering, region: ir.Region) -> tuple[tirx.Buffer, tirx.PrimExpr]:
    buf = low.bufs[region.buffer]
    coords = low.element(region, [], clamp=True)
    return buf, tirx.address_of(tirx.BufferLoad(buf, coords))


def lower_load_acquire(low: Lowering, op: ir.Op) -> None:
    """Emit a ``load_acquire`` op: its scalar result becomes a bound variable."""
    buf, address = _flag_address(low, op.attrs["src"])
    dtype = str(buf.dtype)
    call = tirx.call_extern(dtype, f"jaxtile_load_acquire_{_SUFFIX[dtype]}", address)
    low.scalars[op.result.id] = low.kb.let(low.name("s"), call)


def lower_store_release(low: Lowering, op: ir.Op) -> None:
    """Emit a ``store_release`` op."""
    buf, address = _flag_address(low, op.attrs["dst"])
    dtype = str(buf.dtype)
    value = op.operands[0]
    v = ew.convert(low.at(value, ()), ew.tvm_dtype(value.dtype), dtype, low.bind)
    low.kb.emit(tirx.Evaluate(tirx.call_extern("int32", f"jaxtile_store_release_"
                                               f"{_SUFFIX[dtype]}", address, v)))


def lower_fence(low: Lowering, op: ir.Op) -> None:
    """Emit a ``fence`` op."""
    del op
    low.kb.emit(tirx.Evaluate(tirx.call_extern("int32", "jaxtile_fence")))


def written_globals(kernel: ir.Kernel) -> set[str]:
    """The global buffers some op of ``kernel`` writes."""
    scopes = {b.name: b.scope for b in kernel.buffers}
    return {r.buffer for s in ir.walk(kernel.body) if isinstance(s, ir.Op)
            for r in op_defs.writes(s) if scopes[r.buffer] == "global"}


def polled_load(buf: tirx.Buffer, coords: list) -> tirx.PrimExpr:
    """One element of a global buffer other blocks may change while a loop waits for it:
    through the runtime's acquire load, which LLVM can neither hoist out of the loop nor
    keep in a register (a plain load in a loop with no other memory effect may be read
    once). Types without one are read plainly."""
    dtype = str(buf.dtype)
    if dtype not in _SUFFIX:
        return buf[tuple(coords)]
    return tirx.call_extern(dtype, f"jaxtile_load_acquire_{_SUFFIX[dtype]}",
                            tirx.address_of(tirx.BufferLoad(buf, coords)))
