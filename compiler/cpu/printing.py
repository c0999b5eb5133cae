"""``print`` ops (``jt.print``) for the CPU.

A block runs on one CPU thread, and the blocks of a call run on several, so a line is built
piece by piece in a per-thread buffer of the runtime (``jaxtile_print_text``, ``_int``,
``_uint``, ``_float``, ``_bool`` in ``ffi/cpu/runtime_env.cc``) and written whole by
``jaxtile_print_end``, under stdout's lock and flushed: lines of different blocks never mix,
and a test reading the process's file descriptor 1 sees them when the call returns. The text
is :func:`..print_format.segments`' (the reference semantics render the same).
"""

from __future__ import annotations

from tvm import ir as tvm_ir
from tvm import tirx

from .. import ir, print_format
from . import elementwise as ew
from .context import Lowering

_WIDE = {"int": "int64", "uint": "uint64", "float": "float64", "bool": "int32"}
"""The C type each kind of value is passed to the runtime as."""


def lower_print(low: Lowering, op: ir.Op) -> None:
    """Emit a ``print`` op: the runtime calls, under the op's condition."""
    when, operands = op.operands[0], op.operands[1:]

    def call(fn: str, *args: tirx.PrimExpr) -> None:
        low.kb.emit(tirx.Evaluate(tirx.call_extern("int32", f"jaxtile_print_{fn}", *args)))

    with low.kb.if_(low.at(when, ())):
        for seg in print_format.segments(op.attrs["text"], op.attrs["tag"]):
            if isinstance(seg, str):
                call("text", tvm_ir.StringImm(seg))
                continue
            v = operands[seg]
            kind = print_format.kind(v.dtype)
            call(kind, ew.convert(low.at(v, ()), ew.tvm_dtype(v.dtype), _WIDE[kind], low.bind))
        call("end")
