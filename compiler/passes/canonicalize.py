"""Canonicalisation: constant folding, simplification and CSE of pure ops.

Runs first in the neutral pipeline, so the printed IR is readable and later passes see
simple expressions (``jt.cdiv(i, 64)`` with a block index ``i`` becomes an add and a
division instead of the fifteen ops JAX's ``//`` expands into).

- **Folding.** An integer or bool scalar whose range (:mod:`..analysis.scalars`) is one
  point becomes a ``const``; where all operands are constants the op's definition evaluates
  it (:func:`..op_defs.evaluate`), else the ranges decide it (``i < 8`` for a block index of
  a grid of 4 is true).
- **Floor division.** JAX's ``x // y`` is ``select(sign(x) != sign(y) and x % y != 0,
  x / y, x / y - 1)``; where the ranges show ``x`` and ``y`` of one sign (``x >= 0 < y``, or
  ``x <= 0 > y``) the adjustment never applies and the select becomes the quotient.
- **Identities** on integer scalars and tiles: ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``,
  ``x % 0``, ``min``/``max`` of one value or of operands whose ranges are ordered,
  comparisons of an integer or bool value with itself, a select
  with a constant predicate or equal branches, a conversion to the same dtype, ``p and
  true``, ``p or false``; and
  ``(x + a) + b`` becomes ``x + (a + b)`` (wrap-around arithmetic is associative).
- **CSE.** A pure op that reads no buffer and has no pass notes, identical in kind,
  operands, attributes and result type to one already in scope, is replaced by it (tiles
  of constants, broadcasts and iotas excepted: see :data:`_REMATERIALISED`).
- Loop bounds that are constants become ints (passes such as the CPU's gemm panels need a
  static trip); conditionals on a constant become the branch taken; what the rewrites leave
  unused goes (:func:`.dce.eliminate_dead_code`).

Assumes a verified kernel. Guarantees the same results, bit for bit, with the same integer
semantics (wrap-around, division by zero as :func:`..semantics.int_div_by_zero` says);
float ops are only shared (CSE), never rewritten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .. import ir, op_defs
from ..analysis import scalars
from .dce import eliminate_dead_code

_Key = tuple
_REMATERIALISED = frozenset({"const", "broadcast", "iota"})
"""Tile ops left unshared: recomputing them costs nothing, while sharing one would keep a
whole tile alive (in registers, on a GPU) from its first use to its last."""


def canonicalize(kernel: ir.Kernel) -> ir.Kernel:
    """Fold, simplify and share the kernel's pure ops; see the module docstring."""
    canon = _Canonicalizer(scalars.block_ranges(kernel))
    body = canon.block(kernel.body, {})
    return eliminate_dead_code(dataclasses.replace(kernel, body=body))


def _is_int(v: ir.Value) -> bool:
    return np.issubdtype(v.dtype, np.integer)


class _Canonicalizer:
    def __init__(self, ranges: dict[ir.Value, scalars.Range]):
        self.ranges = ranges
        self.subst: dict[ir.Value, ir.Value] = {}
        self.defs: dict[ir.Value, ir.Op] = {}

    def sub(self, x):
        return self.subst.get(x, x) if isinstance(x, ir.Value) else x

    def _static(self, x: int | ir.Value) -> int | ir.Value:
        """A loop bound as an int where it is a constant (later passes need static trips)."""
        x = self.sub(x)
        r = self.bound(x)
        return r[0] if r is not None and r[0] == r[1] else x

    def bound(self, x: int | ir.Value) -> scalars.Range | None:
        return (x, x) if isinstance(x, int) else self.ranges.get(x)

    def block(self, body: Sequence[ir.Stmt], available: dict[_Key, ir.Value]) -> list[ir.Stmt]:
        """``body`` rewritten as a nested block: the values it makes shareable go with it."""
        return self.statements(body, dict(available))

    def statements(self, body: Sequence[ir.Stmt],
                   available: dict[_Key, ir.Value]) -> list[ir.Stmt]:
        """``body`` rewritten in the current scope; ``available`` holds the shareable
        values in scope, and gets those ``body`` defines."""
        out: list[ir.Stmt] = []
        for stmt in body:
            if isinstance(stmt, ir.Op):
                out += self.op(stmt, available)
            elif isinstance(stmt, ir.For):
                start, extent = self._static(stmt.start), self._static(stmt.extent)
                if isinstance(extent, int):
                    extent = max(extent, 0)                 # an extent below 1 runs none
                r = scalars.loop_range(stmt, self.bound(start), self.bound(extent))
                if r is not None:
                    self.ranges[stmt.var] = r
                out.append(dataclasses.replace(stmt, start=start, extent=extent,
                                               body=self.block(stmt.body, available)))
            elif isinstance(stmt, ir.If):
                cond = self.sub(stmt.cond)
                taken = self.ranges.get(cond)
                if taken is not None and taken[0] == taken[1]:
                    # The branch taken runs in this scope (its values are new, so they
                    # cannot clash with the ones here).
                    out += self.statements(stmt.then if taken[0] else stmt.otherwise,
                                           available)
                    continue
                out.append(dataclasses.replace(stmt, cond=cond,
                                               then=self.block(stmt.then, available),
                                               otherwise=self.block(stmt.otherwise,
                                                                    available)))
            else:
                cond = self.block(stmt.cond, available)
                out.append(dataclasses.replace(stmt, cond=cond, test=self.sub(stmt.test),
                                               body=self.block(stmt.body, available)))
        return out

    def op(self, op: ir.Op, available: dict[_Key, ir.Value]) -> list[ir.Stmt]:
        """The statements that replace ``op`` (none where its result is another value)."""
        op = self._substituted(op)
        res = op.result
        d = op_defs.get(op.kind)
        if res is None or not d.pure or d.reads:
            return [op]
        prologue: list[ir.Stmt] = []
        r = self._range(op)
        if r is not None and r[0] == r[1] and op.kind != "const":
            op = ir.Op("const", (), res, {"value": bool(r[0]) if res.dtype == np.bool_
                                          else r[0]}, op.line)
        elif (folded := self._self_comparison(op)) is not None:
            return folded
        else:
            same = self._identity(op)
            if same is not None:
                self.subst[res] = same
                return []
            op = self._reassociated(op, prologue, available)
        if r is not None:
            self.ranges[res] = r
        if not op.notes and (res.shape == () or op.kind not in _REMATERIALISED):
            key = (op.kind, tuple(v.id for v in op.operands),
                   tuple(sorted((k, type(v).__name__, v) for k, v in op.attrs.items())),
                   res.shape, res.dtype)
            if key in available:
                self.subst[res] = available[key]
                return prologue
            available[key] = res
        self.defs[res] = op
        return [*prologue, op]

    def _substituted(self, op: ir.Op) -> ir.Op:
        attrs = {k: ir.Region(v.buffer, tuple(ir.Index(self.sub(i.start), i.size)
                                              for i in v.index))
                 if isinstance(v, ir.Region) else v for k, v in op.attrs.items()}
        return dataclasses.replace(op, operands=tuple(self.sub(v) for v in op.operands),
                                   attrs=attrs)

    def _range(self, op: ir.Op) -> scalars.Range | None:
        if self._floor_adjustment_never_applies(op):
            return 0, 0
        return scalars.op_range(op, [self.ranges.get(v) for v in op.operands])

    def _fn(self, v: ir.Value, *fns: str) -> ir.Op | None:
        """The elementwise op defining ``v``, if its function is one of ``fns``."""
        d = self.defs.get(v)
        return d if d is not None and d.kind == "elementwise" and d.attrs["fn"] in fns \
            else None

    def _is_const(self, v: ir.Value, value: int) -> bool:
        return self.ranges.get(v) == (value, value)

    def _floor_adjustment_never_applies(self, op: ir.Op) -> bool:
        """Whether ``op`` is ``sign(x) != sign(y) and x % y != 0`` (JAX's floor-division
        adjustment) with ``x`` and ``y`` known to be of one sign, so always false."""
        if op.kind != "elementwise" or op.attrs["fn"] != "and":
            return False
        signs, rem = (self._fn(v, "ne") for v in op.operands)
        if signs is None or rem is None:
            return False
        if self._fn(rem.operands[0], "rem") is None:
            signs, rem = rem, signs
        r = self._fn(rem.operands[0], "rem")
        if r is None or not self._is_const(rem.operands[1], 0):
            return False
        x, y = r.operands
        rx, ry = self.ranges.get(x), self.ranges.get(y)
        if rx is None or ry is None:
            return False
        if rx[0] >= 0 and ry[0] > 0:
            sign_y = 1
        elif rx[1] <= 0 and ry[1] < 0:
            sign_y = -1
        else:
            return False
        # One side of the signs' comparison is sign(x); the other sign(y), which may
        # already be folded to its constant.
        for sx, sy in (signs.operands, signs.operands[::-1]):
            d = self._fn(sx, "sign")
            if d is not None and d.operands[0] is x:
                e = self._fn(sy, "sign")
                return (e is not None and e.operands[0] is y) or self._is_const(sy, sign_y)
        return False

    def _same(self, x: ir.Value, y: ir.Value, depth: int = 8) -> bool:
        """Whether ``x`` and ``y`` are the same value: one value, or the results of pure ops
        of one kind and attributes on the same operands (the tile ops CSE leaves unshared,
        such as two iotas, included)."""
        if x is y:
            return True
        dx, dy = self.defs.get(x), self.defs.get(y)
        if depth == 0 or dx is None or dy is None or dx.kind != dy.kind or \
                dx.attrs != dy.attrs or (x.shape, x.dtype) != (y.shape, y.dtype) or \
                len(dx.operands) != len(dy.operands):
            return False
        return all(self._same(a, b, depth - 1) for a, b in zip(dx.operands, dy.operands))

    def _self_comparison(self, op: ir.Op) -> list[ir.Stmt] | None:
        """``x == x``, ``x <= x``, ``x >= x`` (true) and ``x != x``, ``x < x``, ``x > x``
        (false) of an integer or bool value (not a float: NaN is unequal to itself), as a
        constant; for a tile, a broadcast constant. Besides the work saved: TVM folds such a
        comparison of vectors (two masks computed alike from iotas) into a vector constant
        it then cannot build, which stopped the CPU compiler."""
        if op.kind != "elementwise" or len(op.operands) != 2 or np.issubdtype(
                op.operands[0].dtype, np.floating) or \
                op.attrs["fn"] not in ("eq", "le", "ge", "ne", "lt", "gt") or \
                not self._same(*op.operands):
            return None
        value = op.attrs["fn"] in ("eq", "le", "ge")
        res = op.result
        if res.shape == ():
            return [ir.Op("const", (), res, {"value": value}, op.line)]
        scalar = ir.Value((), np.bool_)
        return [ir.Op("const", (), scalar, {"value": value}, op.line),
                ir.Op("broadcast", (scalar,), res, {"dims": ()}, op.line)]

    def _identity(self, op: ir.Op) -> ir.Value | None:
        """An existing value ``op``'s result always equals, or None."""
        res = op.result

        def fits(v: ir.Value) -> ir.Value | None:
            return v if v.shape == res.shape and v.dtype == res.dtype else None

        if op.kind == "convert":
            return fits(op.operands[0])
        if op.kind == "select":
            pred, on_false, on_true = op.operands
            p = self.ranges.get(pred)
            if on_false is on_true:
                return fits(on_true)
            if p is not None and p[0] == p[1]:
                return fits(on_true if p[0] else on_false)
            return None
        if op.kind != "elementwise" or len(op.operands) != 2:
            return None
        fn, (x, y) = op.attrs["fn"], op.operands
        if res.dtype == np.bool_:
            if fn == "and":
                return fits(x) if self._is_const(y, 1) else fits(y) if self._is_const(x, 1) \
                    else None
            if fn == "or":
                return fits(x) if self._is_const(y, 0) else fits(y) if self._is_const(x, 0) \
                    else None
            return None
        if not _is_int(res):
            return None
        neutral = {"add": 0, "sub": 0, "mul": 1, "div": 1}.get(fn)
        if neutral is not None and self._is_const(y, neutral):
            return fits(x)
        if fn in ("add", "mul") and self._is_const(x, neutral):
            return fits(y)
        if fn == "rem" and self._is_const(y, 0):                # x % 0 is x
            return fits(x)
        if fn in ("max", "min") and x is y:
            return fits(x)
        rx, ry = self.ranges.get(x), self.ranges.get(y)
        if fn in ("max", "min") and rx is not None and ry is not None:
            if rx[0] >= ry[1]:
                return fits(x if fn == "max" else y)
            if ry[0] >= rx[1]:
                return fits(y if fn == "max" else x)
        return None

    def _reassociated(self, op: ir.Op, prologue: list[ir.Stmt],
                      available: dict[_Key, ir.Value]) -> ir.Op:
        """``(x ± a) ± b`` as ``x + c`` with ``c = ±a ± b`` (wrapped to the dtype), for
        integer scalars; the new constant goes to ``prologue``."""
        res = op.result
        if op.kind != "elementwise" or res.shape != () or not _is_int(res) or \
                op.attrs["fn"] not in ("add", "sub"):
            return op
        x, y = op.operands
        b = self.ranges.get(y)
        if b is None or b[0] != b[1]:
            return op
        inner = self._fn(x, "add", "sub")
        a = None if inner is None else self.ranges.get(inner.operands[1])
        if inner is None or a is None or a[0] != a[1] or inner.result.dtype != res.dtype:
            return op
        sign = 1 if op.attrs["fn"] == "add" else -1
        inner_sign = 1 if inner.attrs["fn"] == "add" else -1
        lo, hi = scalars.dtype_range(res.dtype)
        c = (inner_sign * a[0] + sign * b[0] - lo) % (hi - lo + 1) + lo
        const = ir.Value((), res.dtype)
        prologue += self.op(ir.Op("const", (), const, {"value": c}, op.line), available)
        return dataclasses.replace(op, operands=(inner.operands[0], self.sub(const)),
                                   attrs={**op.attrs, "fn": "add"})
