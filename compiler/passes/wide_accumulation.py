"""16-bit float sums, products and matrix products accumulate in float32.

The rule, on every target: a ``reduce`` or ``scan`` that adds or multiplies float16 or
bfloat16 values, and a ``gemm`` into a float16 or bfloat16 tile, keep their running value
in float32 and round it once, when it is stored, as the reference semantics do. Rounding at
every step loses the sum early: 512 bfloat16 ones would sum to 256, because 256 + 1 rounds
back to 256.

The pass states the rule in the IR, so that no backend has to know it:

- ``reduce``/``scan`` with ``fn`` sum or prod of a 16-bit float value become a ``convert``
  of the operand to float32, the same op in float32, and a ``convert`` back;
- ``gemm`` whose accumulator ``c`` is a 16-bit float tile accumulates into a float32 tile
  of ``c``'s shape and scope (a new scratch buffer): ``c`` is loaded and widened into it
  before the gemm and rounded back into ``c`` after it.

Max, min, and the other reductions and scans are exact in any type and are left alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import ir, semantics

_F32 = np.dtype(np.float32)
_ROUNDING = frozenset({"sum", "prod"})


def _widened(src: ir.Value, res: ir.Value, op: ir.Op) -> list[ir.Stmt]:
    """``op`` (a reduce or scan of ``src`` into ``res``) computed in float32."""
    wide_src = ir.Value(src.shape, _F32)
    wide_res = ir.Value(res.shape, _F32)
    return [ir.Op("convert", (src,), wide_src, {}, op.line),
            dataclasses.replace(op, operands=(wide_src,), result=wide_res),
            ir.Op("convert", (wide_res,), res, {}, op.line)]


class _Widen:
    def __init__(self, kernel: ir.Kernel):
        self.buffers = {b.name: b for b in kernel.buffers}
        self.added: list[ir.Buffer] = []
        self.changed = False

    def _scratch_name(self, base: str) -> str:
        name, n = f"{base}_f32", 0
        while name in self.buffers:
            n += 1
            name = f"{base}_f32_{n}"
        return name

    def _gemm(self, op: ir.Op) -> list[ir.Stmt]:
        """A gemm into a 16-bit float tile, accumulated in a float32 copy of that tile."""
        c = op.attrs["c"]
        buf = self.buffers[c.buffer]
        wide = ir.Buffer(self._scratch_name(c.buffer), c.shape, _F32, buf.scope, "scratch",
                         op.line)
        self.buffers[wide.name] = wide
        self.added.append(wide)
        whole = ir.whole(wide.name, wide.shape)
        narrow_in, wide_in = ir.Value(c.shape, buf.dtype), ir.Value(c.shape, _F32)
        wide_out, narrow_out = ir.Value(c.shape, _F32), ir.Value(c.shape, buf.dtype)
        return [ir.Op("load", (), narrow_in, {"src": c}, op.line),
                ir.Op("convert", (narrow_in,), wide_in, {}, op.line),
                ir.Op("store", (wide_in,), None, {"dst": whole}, op.line),
                dataclasses.replace(op, attrs={**op.attrs, "c": whole}),
                ir.Op("load", (), wide_out, {"src": whole}, op.line),
                ir.Op("convert", (wide_out,), narrow_out, {}, op.line),
                ir.Op("store", (narrow_out,), None, {"dst": c}, op.line)]

    def op(self, op: ir.Op) -> list[ir.Stmt]:
        if (op.kind in ("reduce", "scan") and op.attrs["fn"] in _ROUNDING
                and op.result.dtype in semantics.LOW_FLOATS):
            self.changed = True
            return _widened(op.operands[0], op.result, op)
        if op.kind == "gemm" and self.buffers[op.attrs["c"].buffer].dtype in semantics.LOW_FLOATS:
            self.changed = True
            return self._gemm(op)
        return [op]


def widen_half_accumulation(kernel: ir.Kernel) -> ir.Kernel:
    """Make 16-bit float sums, products and gemm accumulators float32 (module doc).

    Assumes a verified kernel. Guarantees that no ``reduce`` or ``scan`` with fn sum or prod
    has a float16/bfloat16 result and no ``gemm`` accumulates into a float16/bfloat16
    buffer; each such op's result is its float32 value rounded once. Added float32 buffers
    are scratch, wholly written before they are read.
    """
    widen = _Widen(kernel)
    body = ir.map_ops(kernel.body, widen.op)
    if not widen.changed:
        return kernel
    return dataclasses.replace(kernel, body=body, buffers=kernel.buffers + tuple(widen.added))
