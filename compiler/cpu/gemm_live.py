"""The part of a gemm that must be computed: the bounds that :mod:`..passes.gemm_edges`
notes on gemms at ragged edges (accumulator rows and columns, and the contraction), as TIR
expressions."""

from __future__ import annotations

import contextlib
import dataclasses
from contextlib import AbstractContextManager

from tvm import tirx
from tvm.ir import Expr

from .. import ir
from .context import Lowering


@dataclasses.dataclass(frozen=True)
class Live:
    """Only rows ``< rows`` and columns ``< cols`` of the accumulator reach an output
    (``None``: all of them); the rest may be left as they are."""

    rows: Expr | None = None
    cols: Expr | None = None
    k: Expr | None = None
    """Only contraction indices below this one multiply anything but zero pads in both
    operands (``None``: all of K); the products past it are ``+0`` and may be left out."""

    @classmethod
    def of(cls, low: Lowering, op: ir.Op) -> Live:
        """The bounds noted on gemm ``op`` (none if it has no note)."""
        bounds = (*op.notes.get("live", (None, None)), op.notes.get("live_k"))
        return cls(*(None if v is None else low.scalars[v.id] for v in bounds))

    def _bound(self, axis: int) -> Expr | None:
        return self.rows if axis == 0 else self.cols

    def tiles(self, axis: int, count: int, size: int, start: int = 0) -> int | Expr:
        """How many of ``count`` tiles of ``size`` rows (``axis`` 0) or columns (1), the
        first at ``start``, hold a live one."""
        bound = self._bound(axis)
        if bound is None:
            return count
        live = tirx.max(bound - start, tirx.const(0, "int32"))
        return tirx.min(tirx.const(count, "int32"), tirx.floordiv(live + (size - 1), size))

    def reaches(self, axis: int, start: int | Expr) -> Expr | None:
        """The condition that a row (column) at or after ``start`` is live; None: always."""
        bound = self._bound(axis)
        return None if bound is None else bound > start

    def end(self, axis: int, start: int, stop: int) -> int | Expr:
        """The end of the live part of rows (columns) ``start..stop``, at least ``start``."""
        bound = self._bound(axis)
        if bound is None:
            return stop
        return tirx.max(tirx.const(start, "int32"), tirx.min(tirx.const(stop, "int32"), bound))


def when(low: Lowering, cond: Expr | None) -> AbstractContextManager[None]:
    """``if cond:`` around what follows, or nothing if ``cond`` is None (all is live)."""
    return contextlib.nullcontext() if cond is None else low.kb.if_(cond)
