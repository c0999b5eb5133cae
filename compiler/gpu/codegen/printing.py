"""GPU lowering of ``print`` ops (``jt.print``): one ``device_printf`` from the block's thread
0 (``printf`` on the GPU; ``std::printf`` under stdout's lock, flushed, in the emulator).

Every thread of a block holds the same scalars, so thread 0 alone prints the block's line
(the others would repeat it). The format is :func:`..print_format.segments`' text with each
value's printf conversion; a GPU's ``printf`` buffer is written out when the kernel
completes, in no particular order across blocks.
"""

from __future__ import annotations

from ... import ir, print_format
from .context import Context

_CONVERSION = {"int": ("%lld", "(long long)({})"),
               "uint": ("%llu", "(unsigned long long)({})"),
               # every NaN as "nan" (print_format)
               "float": ("%g", "({0} != {0} ? fabs(double({0})) : double({0}))"),
               "bool": ("%s", '(({}) ? "True" : "False")')}
"""How each kind of value is passed to printf: its conversion and argument expression."""


def lower_print(cx: Context, op: ir.Op) -> None:
    when, operands = op.operands[0], op.operands[1:]
    fmt, args = "", []
    for seg in print_format.segments(op.attrs["text"], op.attrs["tag"]):
        if isinstance(seg, str):
            fmt += print_format.printf_text(seg)
            continue
        v = operands[seg]
        conversion, arg = _CONVERSION[print_format.kind(v.dtype)]
        fmt += conversion
        args.append(arg.format(cx.name(v)))
    call = ", ".join([print_format.c_string(fmt + "\n"), *args])
    cx.w(f"if (tid == 0 && {cx.name(when)}) device_printf({call});")
