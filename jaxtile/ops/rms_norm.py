"""RMS normalisation over the last axis, with a backward rule made of jaxtile kernels.

``rms_norm(x, w) = x / sqrt(mean(x**2, axis=-1) + eps) * w``. Its rule saves each row's
``rstd = 1 / sqrt(mean(x**2) + eps)`` (from :func:`rms_norm_fwd`, the same kernel with one
more output) and runs :func:`rms_norm_bwd`, which returns ``dx`` and per-block partial sums
of ``dw``; ``dw`` is their ``jnp.sum``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

import jaxtile as jt

from ._rows import NormBackward, check_norm, mean_scale, row_tile


def _normalise(x, w, eps, rows, block_cols):
    """Kernel-body helper: declare ``y`` and the grid, normalise this block's rows into
    ``y``; returns ``(y, rstd tile, block index)``."""
    check_norm("rms_norm", x, w=w)
    n_rows, n_cols = x.shape
    cols = row_tile(n_cols, block_cols)
    y = jt.empty((n_rows, n_cols), x.dtype)
    r = jt.grid(jt.cdiv(n_rows, rows))
    x_t = jt.fragment((rows, cols), jnp.float32)
    w_t = jt.fragment((cols,), jnp.float32)
    s_t = jt.fragment((rows,), jnp.float32)
    jt.copy(x.at[r * rows, 0], x_t)
    jt.copy(w.at[0], w_t)
    xv = x_t[...]
    s_t[...] = lax.rsqrt(jnp.sum(xv * xv, axis=1) * mean_scale(n_cols) + eps)
    x_t[...] = xv * s_t[...][:, None] * w_t[...][None, :]
    jt.copy(x_t, y.at[r * rows, 0])
    return y, s_t, r


@jt.kernel(threads=128, sharding=jt.ShardRule("r c, c -> r c", parallel="r"),
           dynamic={"x": 0})
def rms_norm(x, w, *, eps=1e-6, rows=4, block_cols=None):
    """``x / sqrt(mean(x**2, axis=-1, keepdims=True) + eps) * w`` for ``x`` of shape
    (rows, features) and ``w`` of shape (features,), computed in float32 and returned in
    ``x.dtype``. Each block normalises ``rows`` rows held whole in a tile of ``block_cols``
    columns (default: the row length rounded up to a multiple of 128). Differentiable in
    ``x`` and ``w`` with jaxtile backward kernels; batch it with ``jax.vmap``.

    >>> jt.ops.rms_norm(x, w, eps=1e-5)                 # doctest: +SKIP
    """
    y, _, _ = _normalise(x, w, eps, rows, block_cols)
    return y


@jt.kernel(threads=128, sharding=jt.ShardRule("r c, c -> r c, r", parallel="r"),
           dynamic={"x": 0})
def rms_norm_fwd(x, w, *, eps=1e-6, rows=4, block_cols=None):
    """``(rms_norm(x, w), rstd)``: also each row's ``1 / sqrt(mean(x**2) + eps)`` in
    float32, shape (rows,), for the backward pass."""
    y, s_t, r = _normalise(x, w, eps, rows, block_cols)
    rstd = jt.empty((x.shape[0],), jnp.float32)
    jt.copy(s_t, rstd.at[r * rows])
    return y, rstd


@jt.kernel(threads=128)
def rms_norm_bwd(x, w, rstd, g, *, rows=4, block_cols=None, groups=8):
    """The backward pass of :func:`rms_norm` for the cotangent ``g`` of its output.

    With ``xhat = x * rstd``: ``dx = rstd * (g*w - xhat * mean(g*w*xhat, axis=-1))`` (in
    ``x.dtype``) and the float32 partial sums of ``dw = sum(g * xhat, axis=0)`` over each
    block's rows, shape (blocks, features); blocks as in ``_rows.NormBackward``. Padding
    reads zero and contributes nothing.
    """
    nb = NormBackward("rms_norm_bwd", x, w, g, {"rstd": rstd}, rows=rows,
                      block_cols=block_cols, groups=groups, sums=1)
    s_t = jt.fragment((rows,), jnp.float32)
    (dw_t,) = nb.sums

    @jt.loop(groups)
    def _(i):
        row = nb.load(i)
        jt.copy(rstd.at[row], s_t)
        s = s_t[...][:, None]
        xhat = nb.x_t[...] * s
        gv = nb.g_t[...]
        gw = gv * nb.w_t[...][None, :]
        mean = jnp.sum(gw * xhat, axis=1, keepdims=True) * mean_scale(nb.n_cols)
        dw_t[...] = dw_t[...] + jnp.sum(gv * xhat, axis=0)
        nb.x_t[...] = s * (gw - xhat * mean)
        nb.store_dx(row)

    return nb.finish()


def _fwd(x, w, **params):
    y, rstd = rms_norm_fwd(x, w, **params)
    return y, (x, w, rstd)


def _bwd(res, g, *, eps, **params):
    del eps
    x, w, rstd = res
    dx, dw_part = rms_norm_bwd(x, w, rstd, g.astype(x.dtype), **params)
    return dx, jnp.sum(dw_part, axis=0).astype(w.dtype)


def _jvp(args, y, tangents, *, eps, **params):
    """The tangent as a jnp formula (XLA fuses it), in float32 like the kernel:
    ``(t_x r + x dr) w + x r t_w`` with ``dr = -r**3 mean(x t_x)``."""
    del params
    x, w = (a.astype(jnp.float32) for a in args)
    tx, tw = (t.astype(jnp.float32) for t in tangents)
    r = lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    dr = -(r ** 3) * jnp.mean(x * tx, axis=-1, keepdims=True)
    return ((tx * r + x * dr) * w + x * r * tw).astype(y.dtype)


rms_norm.defvjp(_fwd, _bwd)
rms_norm.defjvp(_jvp)
