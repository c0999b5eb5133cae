"""Row softmax."""

from __future__ import annotations

import jax.numpy as jnp

import jaxtile as jt


@jt.kernel(threads=128)
def softmax(x, *, rows=4, block_cols=None):
    """Numerically stable softmax over the last axis of a 2-D array.

    Each block handles ``rows`` rows; a row is held whole in a tile of ``block_cols`` columns
    (default: the row length rounded up to a multiple of 128). Columns past the end are
    padded with ``-inf`` so they contribute nothing.
    """
    n_rows, n_cols = x.shape
    cols = block_cols or jt.cdiv(n_cols, 128) * 128
    if cols < n_cols:
        raise ValueError(f"block_cols={cols} is smaller than the row length {n_cols}")
    out = jt.empty((n_rows, n_cols), x.dtype)
    r = jt.grid(jt.cdiv(n_rows, rows))
    tile = jt.fragment((rows, cols), jnp.float32)
    jt.copy(x.at[r * rows, 0], tile, pad=-jnp.inf)
    v = tile[...]
    e = jnp.exp(v - jnp.max(v, axis=1, keepdims=True))
    tile[...] = e / jnp.sum(e, axis=1, keepdims=True)
    jt.copy(tile, out.at[r * rows, 0])
    return out
