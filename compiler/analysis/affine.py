"""Integer scalars that are affine in one block index: ``scale * block_index[axis] + offset``.

The one affine evaluator of the passes that reason about which block touches what (output
coverage, shard inference). Block index ``a`` is ``(a, 1, 0)``; a constant is ``(-1, 0,
value)``, evaluated by the op's definition (:func:`..op_defs.evaluate`, with its dtype's
wrap-around); conversions keep the form, and ``add``/``sub`` of an affine value and a
constant, and ``mul`` by a constant, combine them. Values defined in loops and conditionals
are included (their scope limits where they are used).

Assumes what the index arithmetic of a kernel assumes elsewhere (``gpu/bounds.py``): an
affine combination of a block index does not overflow its dtype (grids and buffers have
fewer than 2^31 elements). Unlike the ranges of :mod:`.scalars`, which model the wrap-around,
these forms do not.
"""

from __future__ import annotations

from .. import ir, op_defs

Affine = tuple[int, int, int]
"""(block axis, or -1 for a constant; scale; offset)."""


def affine_values(kernel: ir.Kernel) -> dict[int, Affine]:
    """The affine form of every integer scalar that has one, by value id."""
    known: dict[int, Affine] = {v.id: (a, 1, 0) for a, v in enumerate(kernel.block_indices)}
    for stmt in ir.walk(kernel.body):
        if not isinstance(stmt, ir.Op) or stmt.result is None or stmt.result.shape != ():
            continue
        ops = [known.get(v.id) for v in stmt.operands]
        value = _constant(stmt, ops)
        if value is None and stmt.kind == "convert" and ops and ops[0] is not None:
            value = ops[0]
        elif value is None and stmt.kind == "elementwise" and len(ops) == 2 and None not in ops:
            value = _combine(stmt.attrs.get("fn"), ops[0], ops[1])
        if value is not None:
            known[stmt.result.id] = value
    return known


def _constant(op: ir.Op, operands: list[Affine | None]) -> Affine | None:
    consts = [o[2] for o in operands if o is not None and o[0] == -1]
    value = op_defs.evaluate(op, consts) if len(consts) == len(operands) else None
    return None if value is None else (-1, 0, value)


def _combine(fn: str | None, x: Affine, y: Affine) -> Affine | None:
    (ax, sx, ox), (ay, sy, oy) = x, y
    if fn in ("add", "sub") and -1 in (ax, ay):
        sign = 1 if fn == "add" else -1
        return max(ax, ay), sx + sign * sy, ox + sign * oy
    if fn == "mul" and ay == -1:
        return ax, sx * oy, ox * oy
    if fn == "mul" and ax == -1:
        return ay, sy * ox, oy * ox
    return None
