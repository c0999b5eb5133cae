"""Atomic updates (``atomic`` ops) for the CPU.

Blocks of one call run on several threads, so an update of a global buffer goes through
the runtime's atomic functions (``jaxtile_atomic_<fn>_<type>`` in ``ffi/runtime_env.cc``,
bound when the library is loaded); positions past the buffer's edge are skipped. An
on-chip buffer belongs to one block, run by one thread, so it is updated in place.
"""

from __future__ import annotations

from tvm import tirx

from .. import ir
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
