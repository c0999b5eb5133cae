"""Gathers and scatters of consecutive positions become plain copies.

A copy dimension indexed by a 1-D tile of positions (``jt.gather``/``jt.scatter``, Pallas'
``x_ref.at[i * n + jnp.arange(n)]``) is lowered element by element, with a bounds check
each. Where the positions are ``s + iota`` (an iota along the tile, plus scalars broadcast
over it), they are the window ``[s, s + n)``, and a copy of that window has the same
meaning under the copy edge rules (positions out of range read pad, writes there are
dropped) while every backend lowers it as a (vectorised) block copy. The pass rewrites the
dimension to start at ``s``; the sum of the scalars is computed right before the copy.

Assumes a verified, canonicalized kernel. Guarantees the same results; the position tiles
it no longer uses are left for dead-code elimination.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .. import ir
from .dce import eliminate_dead_code

_Terms = tuple[tuple[int, ir.Value], ...]
"""``(sign, scalar)`` pairs whose signed sum is added to an iota."""


def contiguous_gathers(kernel: ir.Kernel) -> ir.Kernel:
    """Rewrite index-tile copy dimensions of the form ``iota + scalars``; see the module
    docstring."""
    forms: dict[int, tuple[str, _Terms]] = {}
    body = _block(kernel.body, forms)
    return eliminate_dead_code(dataclasses.replace(kernel, body=body))


def _form(op: ir.Op, forms: dict[int, tuple[str, _Terms]]) -> tuple[str, _Terms] | None:
    """``("iota", terms)`` for a 1-D integer tile ``iota + sum(terms)``, ``("splat",
    terms)`` for a tile holding ``sum(terms)`` everywhere; None otherwise."""
    res = op.result
    if res is None or len(res.shape) != 1 or not np.issubdtype(res.dtype, np.integer):
        return None
    if op.kind == "iota" and op.attrs["dimension"] == 0:
        return "iota", ()
    if op.kind == "broadcast" and op.operands[0].shape == () and \
            op.operands[0].dtype == res.dtype:
        return "splat", ((1, op.operands[0]),)
    if op.kind == "convert" and op.operands[0].dtype == res.dtype:
        return forms.get(op.operands[0].id)
    if op.kind == "elementwise" and op.attrs.get("fn") in ("add", "sub"):
        a, b = (_operand_form(v, forms) for v in op.operands)
        if a is None or b is None or b[0] == "iota" and (a[0] == "iota" or
                                                         op.attrs["fn"] == "sub"):
            return None
        if op.attrs["fn"] == "sub":
            b = (b[0], tuple((-sign, v) for sign, v in b[1]))
        kind = "iota" if "iota" in (a[0], b[0]) else "splat"
        return kind, a[1] + b[1]
    return None


def _operand_form(v: ir.Value, forms: dict[int, tuple[str, _Terms]]
                  ) -> tuple[str, _Terms] | None:
    """The form of an elementwise operand; a scalar broadcasts over the tile."""
    if v.shape == () and np.issubdtype(v.dtype, np.integer):
        return "splat", ((1, v),)
    return forms.get(v.id)


def _block(body: Sequence[ir.Stmt], forms: dict[int, tuple[str, _Terms]]) -> list[ir.Stmt]:
    out: list[ir.Stmt] = []
    for stmt in body:
        if isinstance(stmt, ir.For):
            out.append(dataclasses.replace(stmt, body=tuple(_block(stmt.body, forms))))
        elif isinstance(stmt, ir.If):
            out.append(dataclasses.replace(stmt, then=tuple(_block(stmt.then, forms)),
                                           otherwise=tuple(_block(stmt.otherwise, forms))))
        elif isinstance(stmt, ir.While):
            out.append(dataclasses.replace(stmt, cond=tuple(_block(stmt.cond, forms)),
                                           body=tuple(_block(stmt.body, forms))))
        else:
            form = _form(stmt, forms)
            if form is not None:
                forms[stmt.result.id] = form
            out.extend(_rewritten(stmt, forms) if stmt.kind == "copy" else (stmt,))
    return out


def _rewritten(op: ir.Op, forms: dict[int, tuple[str, _Terms]]) -> list[ir.Stmt]:
    """The copy with its ``iota + scalars`` dimensions made windows, after the scalar adds
    their starts need."""
    before: list[ir.Stmt] = []
    attrs = dict(op.attrs)
    for role in ("src", "dst"):
        region = attrs[role]
        index = list(region.index)
        for d, i in enumerate(index):
            if not (isinstance(i.start, ir.Value) and i.start.shape != ()):
                continue
            form = forms.get(i.start.id)
            if form is None or form[0] != "iota" or \
                    any(t.dtype != np.int32 for _, t in (*form[1], (1, i.start))):
                continue
            index[d] = ir.Index(_sum(form[1], before, op.line), i.size)
        attrs[role] = dataclasses.replace(region, index=tuple(index))
    return [*before, dataclasses.replace(op, attrs=attrs)]


def _sum(terms: _Terms, out: list[ir.Stmt], line: str | None) -> ir.Value | int:
    """The signed sum of ``terms`` (scalars of the index tile's dtype, int32: the language
    makes every index tile int32) as a copy start, the ops computing it emitted into
    ``out``."""
    total: ir.Value | int = 0
    for sign, t in terms:
        if isinstance(total, int) and sign > 0:
            total = t
            continue
        left = total if isinstance(total, ir.Value) else _const(total, out, line)
        res = ir.Value((), t.dtype)
        out.append(ir.Op("elementwise", (left, t), res, {"fn": "add" if sign > 0 else "sub"},
                         line))
        total = res
    return total


def _const(value: int, out: list[ir.Stmt], line: str | None) -> ir.Value:
    """An int32 constant (the only constant a start sum begins from is 0)."""
    res = ir.Value((), np.int32)
    out.append(ir.Op("const", (), res, {"value": int(value)}, line))
    return res
