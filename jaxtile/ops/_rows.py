"""Shared by the row-wise kernels (softmax, norms): how wide a whole-row tile is."""

from __future__ import annotations

import jaxtile as jt


def row_tile(n_cols: int, block_cols: int | None) -> int:
    """Columns of a tile holding a whole row: ``block_cols``, or the row length rounded up
    to a multiple of 128."""
    cols = block_cols or jt.cdiv(n_cols, 128) * 128
    if cols < n_cols:
        raise ValueError(f"block_cols={cols} is smaller than the row length {n_cols}")
    return cols
