"""Layer normalisation over the last axis, with a backward rule made of jaxtile kernels.

``layer_norm(x, w, b) = (x - mean) / sqrt(var + eps) * w + b`` per row. The rule saves each
row's mean and ``rstd = 1 / sqrt(var + eps)`` (from :func:`layer_norm_fwd`) and runs
:func:`layer_norm_bwd`, which returns ``dx`` and per-block partial sums of ``dw`` and ``db``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

import jaxtile as jt

from ._rows import NormBackward, check_norm, mean_scale, row_tile


def _normalise(x, w, b, eps, rows, block_cols):
    """Kernel-body helper: declare ``y`` and the grid, normalise this block's rows into
    ``y``; returns ``(y, mean tile, rstd tile, block index)``."""
    check_norm("layer_norm", x, w=w, b=b)
    n_rows, n_cols = x.shape
    cols = row_tile(n_cols, block_cols)
    y = jt.empty((n_rows, n_cols), x.dtype)
    r = jt.grid(jt.cdiv(n_rows, rows))
    x_t = jt.fragment((rows, cols), jnp.float32)
    w_t = jt.fragment((cols,), jnp.float32)
    b_t = jt.fragment((cols,), jnp.float32)
    mean_t = jt.fragment((rows,), jnp.float32)
    rstd_t = jt.fragment((rows,), jnp.float32)
    jt.copy(x.at[r * rows, 0], x_t)
    jt.copy(w.at[0], w_t)
    jt.copy(b.at[0], b_t)
    xv = x_t[...]
    mean_t[...] = jnp.sum(xv, axis=1) * mean_scale(n_cols)
    xc = xv - mean_t[...][:, None]
    if cols > n_cols:                     # padding columns read 0, not the mean
        col = lax.broadcasted_iota(jnp.int32, (rows, cols), 1)
        xc = jnp.where(col < n_cols, xc, 0.0)
    var = jnp.sum(xc * xc, axis=1) * mean_scale(n_cols)
    # A variance that overflowed makes every output NaN, as in jnp's formula (where the
    # mean overflows first): a zero rstd would make finite-looking zeros instead, and only
    # where the summation order happened to keep the mean finite.
    rstd_t[...] = jnp.where(var < jnp.inf, lax.rsqrt(var + eps), jnp.nan)
    x_t[...] = xc * rstd_t[...][:, None] * w_t[...][None, :] + b_t[...][None, :]
    jt.copy(x_t, y.at[r * rows, 0])
    return y, mean_t, rstd_t, r


@jt.kernel(threads=128, sharding=jt.ShardRule("r c, c, c -> r c", parallel="r"),
           dynamic={"x": 0})
def layer_norm(x, w, b, *, eps=1e-5, rows=4, block_cols=None):
    """``(x - mean) / sqrt(var + eps) * w + b`` over the last axis of ``x`` (rows, features)
    with ``w`` and ``b`` of shape (features,), computed in float32 and returned in
    ``x.dtype``. Blocks as in :func:`jaxtile.ops.rms_norm`. Differentiable in ``x``, ``w``
    and ``b`` with jaxtile backward kernels; batch it with ``jax.vmap``.
    """
    y, _, _, _ = _normalise(x, w, b, eps, rows, block_cols)
    return y


@jt.kernel(threads=128,
           sharding=jt.ShardRule("r c, c, c -> r c, r, r", parallel="r"), dynamic={"x": 0})
def layer_norm_fwd(x, w, b, *, eps=1e-5, rows=4, block_cols=None):
    """``(layer_norm(x, w, b), mean, rstd)``: also each row's mean and
    ``1 / sqrt(var + eps)`` in float32, shape (rows,), for the backward pass."""
    y, mean_t, rstd_t, r = _normalise(x, w, b, eps, rows, block_cols)
    mean = jt.empty((x.shape[0],), jnp.float32)
    rstd = jt.empty((x.shape[0],), jnp.float32)
    jt.copy(mean_t, mean.at[r * rows])
    jt.copy(rstd_t, rstd.at[r * rows])
    return y, mean, rstd


@jt.kernel(threads=128)
def layer_norm_bwd(x, w, mean, rstd, g, *, rows=4, block_cols=None, groups=8):
    """The backward pass of :func:`layer_norm` for the cotangent ``g`` of its output.

    With ``xhat = (x - mean) * rstd`` and ``gw = g * w``: ``dx = rstd * (gw - mean(gw) -
    xhat * mean(gw * xhat))`` (in ``x.dtype``), and the float32 partial sums over each
    block's rows of ``dw = sum(g * xhat, axis=0)`` and ``db = sum(g, axis=0)``, each of
    shape (blocks, features); blocks as in ``_rows.NormBackward``. Padding contributes
    nothing: ``g`` reads zero there.
    """
    nb = NormBackward("layer_norm_bwd", x, w, g, {"mean": mean, "rstd": rstd}, rows=rows,
                      block_cols=block_cols, groups=groups, sums=2)
    mean_t = jt.fragment((rows,), jnp.float32)
    rstd_t = jt.fragment((rows,), jnp.float32)
    dw_t, db_t = nb.sums

    @jt.loop(groups)
    def _(i):
        row = nb.load(i)
        jt.copy(mean.at[row], mean_t)
        jt.copy(rstd.at[row], rstd_t)
        s = rstd_t[...][:, None]
        xhat = (nb.x_t[...] - mean_t[...][:, None]) * s
        gv = nb.g_t[...]
        gw = gv * nb.w_t[...][None, :]
        scale = mean_scale(nb.n_cols)
        mean_gw = jnp.sum(gw, axis=1, keepdims=True) * scale
        mean_gwx = jnp.sum(gw * xhat, axis=1, keepdims=True) * scale
        dw_t[...] = dw_t[...] + jnp.sum(gv * xhat, axis=0)
        db_t[...] = db_t[...] + jnp.sum(gv, axis=0)
        nb.x_t[...] = s * (gw - mean_gw - xhat * mean_gwx)
        nb.store_dx(row)

    return nb.finish()


def _fwd(x, w, b, **params):
    y, mean, rstd = layer_norm_fwd(x, w, b, **params)
    return y, (x, w, b, mean, rstd)


def _bwd(res, g, *, eps, **params):
    del eps
    x, w, b, mean, rstd = res
    dx, dw_part, db_part = layer_norm_bwd(x, w, mean, rstd, g.astype(x.dtype), **params)
    return (dx, jnp.sum(dw_part, axis=0).astype(w.dtype),
            jnp.sum(db_part, axis=0).astype(b.dtype))


def _jvp(args, y, tangents, *, eps, **params):
    """The tangent as a jnp formula (XLA fuses it), in float32 like the kernel: with
    ``xc = x - mean(x)`` and its tangent ``tc``, ``(tc r + xc dr) w + xc r t_w + t_b`` where
    ``dr = -r**3 mean(xc tc)``."""
    del params
    x, w, b = (a.astype(jnp.float32) for a in args)
    tx, tw, tb = (t.astype(jnp.float32) for t in tangents)
    xc = x - jnp.mean(x, axis=-1, keepdims=True)
    tc = tx - jnp.mean(tx, axis=-1, keepdims=True)
    r = lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + eps)
    dr = -(r ** 3) * jnp.mean(xc * tc, axis=-1, keepdims=True)
    return ((tc * r + xc * dr) * w + xc * r * tw + tb).astype(y.dtype)


layer_norm.defvjp(_fwd, _bwd)
layer_norm.defjvp(_jvp)
