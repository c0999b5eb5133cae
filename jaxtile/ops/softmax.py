"""Row softmax and its backward pass."""

from __future__ import annotations

import jax.numpy as jnp

import jaxtile as jt

from . import _checks
from ._rows import row_tile


@jt.kernel(threads=128, sharding=jt.ShardRule("r c -> r c", parallel="r"),
           dynamic={"x": 0})
def softmax(x, *, rows=4, block_cols=None):
    """Numerically stable softmax over the last axis of a 2-D array.

    Each block handles ``rows`` rows; a row is held whole in a tile of ``block_cols`` columns
    (default: the row length rounded up to a multiple of 128). Columns past the end are
    padded with ``-inf`` so they contribute nothing.
    """
    _checks.rank("softmax", "x", x, 2)
    n_rows, n_cols = x.shape
    cols = row_tile(n_cols, block_cols)
    out = jt.empty((n_rows, n_cols), x.dtype)
    r = jt.grid(jt.cdiv(n_rows, rows))
    tile = jt.fragment((rows, cols), jnp.float32)
    jt.copy(x.at[r * rows, 0], tile, pad=-jnp.inf)
    v = tile[...]
    e = jnp.exp(v - jnp.max(v, axis=1, keepdims=True))
    tile[...] = e / jnp.sum(e, axis=1, keepdims=True)
    jt.copy(tile, out.at[r * rows, 0])
    return out


@jt.kernel(threads=128, sharding=jt.ShardRule("r c, r c -> r c", parallel="r"))
def softmax_bwd(y, g, *, rows=4, block_cols=None):
    """The softmax's vector-Jacobian product: ``y * (g - sum(g * y, axis=-1))`` for its
    output ``y`` and the output cotangent ``g`` (2-D, one shape), in float32, returned in
    ``g.dtype``. Blocks and padding as in :func:`softmax` (padding reads zero, which adds
    nothing to the row sums)."""
    _checks.rank("softmax_bwd", "y", y, 2)
    _checks.same_shape("softmax_bwd", y=y, g=g)
    n_rows, n_cols = y.shape
    cols = row_tile(n_cols, block_cols)
    dx = jt.empty((n_rows, n_cols), g.dtype)
    r = jt.grid(jt.cdiv(n_rows, rows))
    y_t = jt.fragment((rows, cols), jnp.float32)
    g_t = jt.fragment((rows, cols), jnp.float32)
    jt.copy(y.at[r * rows, 0], y_t)
    jt.copy(g.at[r * rows, 0], g_t)
    yv, gv = y_t[...], g_t[...]
    g_t[...] = yv * (gv - jnp.sum(gv * yv, axis=1, keepdims=True))
    jt.copy(g_t, dx.at[r * rows, 0])
    return dx


def _softmax_fwd(x, **params):
    y = softmax(x, **params)
    return y, y


def _softmax_bwd(y, g, **params):
    return (softmax_bwd(y, g.astype(y.dtype), **params),)


def _softmax_jvp(args, y, tangents, **params):
    # The softmax's Jacobian is symmetric: its JVP is the backward kernel applied to the
    # tangent.
    return softmax_bwd(y, tangents[0].astype(y.dtype), **params)


softmax.defvjp(_softmax_fwd, _softmax_bwd)
softmax.defjvp(_softmax_jvp)
