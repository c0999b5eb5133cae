"""Shared by the row-wise kernels (softmax, norms): how wide a whole-row tile is, and the
prologue and epilogue every backward norm kernel has."""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

import jaxtile as jt

from . import _checks


def row_tile(n_cols: int, block_cols: int | None) -> int:
    """Columns of a tile holding a whole row: ``block_cols``, or the row length rounded up
    to a multiple of 128 (at least 128)."""
    cols = block_cols or max(1, jt.cdiv(n_cols, 128)) * 128
    if cols < n_cols:
        raise ValueError(f"block_cols={cols} is smaller than the row length {n_cols}")
    return cols


def mean_scale(n_cols: int) -> float:
    """The factor that turns a row's sum into its mean: ``1 / n_cols``, and NaN for rows of
    no features, whose mean ``jnp.mean`` gives as NaN (0 / 0)."""
    return 1.0 / n_cols if n_cols else math.nan


def check_norm(op: str, x: Any, **vectors: Any) -> None:
    """A norm's operands: 2-D ``x`` (rows, features) and feature vectors (weight, bias)."""
    _checks.rank(op, "x", x, 2)
    for name, v in vectors.items():
        _checks.vector(op, name, v, x.shape[1], "the number of features (x.shape[1])")


class NormBackward:
    """Kernel-body helper for a backward norm kernel: checks the operands, declares ``dx``
    and ``len(sums)`` outputs of float32 per-block partial sums over rows (each of shape
    (blocks, features)), the grid, and the tiles. A block handles ``groups`` tiles of
    ``rows`` rows in turn (:meth:`load`), which keeps the partial sums ``groups`` times
    smaller than one per tile; :meth:`finish` writes them.

    Per-row statistics (``rows_stats``: name -> (rows,) operand) are checked too.
    """

    def __init__(self, op: str, x: Any, w: Any, g: Any, row_stats: dict[str, Any], *,
                 rows: int, block_cols: int | None, groups: int, sums: int):
        check_norm(op, x, w=w)
        _checks.same_shape(op, x=x, g=g)
        for name, s in row_stats.items():
            _checks.vector(op, name, s, x.shape[0], "the number of rows (x.shape[0])")
        n_rows, self.n_cols = x.shape
        cols = row_tile(self.n_cols, block_cols)
        blocks = jt.cdiv(n_rows, rows * groups)
        self.x, self.g, self.rows, self.groups = x, g, rows, groups
        self.dx = jt.empty((n_rows, self.n_cols), x.dtype)
        self.parts = [jt.empty((blocks, self.n_cols), jnp.float32) for _ in range(sums)]
        self.r = jt.grid(blocks)
        self.x_t = jt.fragment((rows, cols), jnp.float32)
        self.g_t = jt.fragment((rows, cols), jnp.float32)
        self.w_t = jt.fragment((cols,), jnp.float32)
        self.sums = [jt.fragment((cols,), jnp.float32) for _ in range(sums)]
        jt.copy(w.at[0], self.w_t)
        for s in self.sums:
            s[...] = jnp.zeros((cols,), jnp.float32)

    def load(self, i: Any) -> Any:
        """Load group ``i``'s rows of ``x`` and ``g`` into ``x_t`` and ``g_t``; returns the
        index of its first row."""
        row = (self.r * self.groups + i) * self.rows
        jt.copy(self.x.at[row, 0], self.x_t)
        jt.copy(self.g.at[row, 0], self.g_t)
        return row

    def store_dx(self, row: Any) -> None:
        """Write ``x_t`` (holding this group's ``dx``) to ``dx``."""
        jt.copy(self.x_t, self.dx.at[row, 0])

    def finish(self) -> tuple[Any, ...]:
        """Write the partial sums; returns ``(dx, *partial sums)``, the kernel's outputs."""
        for s, part in zip(self.sums, self.parts):
            jt.copy(s, part.at[self.r, 0])
        return (self.dx, *self.parts)
