"""Known factors of integer scalars: a number each value is always a multiple of.

A constant ``c`` is a multiple of ``|c|`` (0: of every number, written 0); a conversion
keeps its operand's factor; a product multiplies its operands' factors and a sum or
difference takes their greatest common divisor; anything else (block indices, loop
variables, values read from memory) is only known to be a multiple of 1. The GPU code
generator asks it whether a row starts on a multiple of a vector's length (aligned vector
accesses).

Assumes what the index arithmetic of a kernel assumes elsewhere (``gpu/bounds.py``,
:mod:`.affine`): integer index arithmetic does not overflow its dtype, so a wrapped product
or sum is not modelled. Values defined in loops and conditionals are included (their scope
limits where they are used).
"""

from __future__ import annotations

import math

from .. import ir


def known_factors(kernel: ir.Kernel) -> dict[int, int]:
    """Value id -> a number the integer scalar is always a multiple of, for the scalars
    where that is more than 1 (or 0: the value is 0)."""
    out: dict[int, int] = {}

    def of(x: int | ir.Value) -> int:
        return abs(x) if isinstance(x, int) else out.get(x.id, 1)

    for s in ir.walk(kernel.body):
        if not isinstance(s, ir.Op) or s.result is None or s.result.shape != ():
            continue
        if s.kind == "const" and isinstance(s.attrs["value"], int):
            out[s.result.id] = abs(s.attrs["value"])
        elif s.kind == "convert":
            out[s.result.id] = of(s.operands[0])
        elif s.kind == "elementwise" and s.attrs["fn"] == "mul":
            out[s.result.id] = of(s.operands[0]) * of(s.operands[1])
        elif s.kind == "elementwise" and s.attrs["fn"] in ("add", "sub"):
            out[s.result.id] = math.gcd(of(s.operands[0]), of(s.operands[1]))
    return out
