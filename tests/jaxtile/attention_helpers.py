"""Independent formulas for the attention tests: float64 numpy (forward, log-sum-exp and
the gradients written out by hand) and jax.nn.dot_product_attention in our layout."""

import jax
import jax.numpy as jnp
import numpy as np

TOL = {jnp.float32: {"rtol": 2e-5, "atol": 2e-5},
       jnp.bfloat16: {"rtol": 3e-2, "atol": 3e-2},
       jnp.float16: {"rtol": 4e-3, "atol": 4e-3}}
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
DTYPE_IDS = ["f32", "bf16", "f16"]


def qkv(rng, b, h, hk, t, s, d, dtype):
    """Random q (b, h, t, d), k and v (b, hk, s, d) in ``dtype``."""
    def normal(shape):
        return jnp.asarray(rng.standard_normal(shape), dtype)
    return normal((b, h, t, d)), normal((b, hk, s, d)), normal((b, hk, s, d))


def _f64(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def np_mask(b, t, s, causal=False, lengths=None, window=None):
    """(b, 1, t, s): whether query i of sequence b sees key j."""
    i = np.arange(t)[:, None]
    j = np.arange(s)[None, :]
    keep = np.ones((b, 1, t, s), bool)
    if lengths is not None:
        keep &= (j[None, None] < np.asarray(lengths)[:, None, None, None])
    if causal:
        keep &= (j <= i)[None, None]
    if window is not None:
        left, right = (window, window) if isinstance(window, int) else window
        keep &= ((j >= i - left) & (j <= i + right))[None, None]
    return keep


def _probs(q, k, causal, lengths, window, scale):
    q, k = _f64(q), _f64(k)
    b, h, t, d = q.shape
    group = h // k.shape[1]
    k = np.repeat(k, group, axis=1)
    scale = 1 / np.sqrt(d) if scale is None else scale
    keep = np_mask(b, t, k.shape[2], causal, lengths, window)
    sc = np.where(keep, q @ np.swapaxes(k, 2, 3) * scale, -np.inf)
    m = sc.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(sc - m)
    total = e.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(total > 0, e / total, 0)
        lse = np.where(total[..., 0] > 0, np.log(total[..., 0]) + m[..., 0], -np.inf)
    return p, lse, group, scale


def np_attention(q, k, v, causal=False, lengths=None, window=None, scale=None):
    """float64 ``(out, lse)``; rows that see no key give 0 and -inf."""
    p, lse, group, _ = _probs(q, k, causal, lengths, window, scale)
    return p @ np.repeat(_f64(v), group, axis=1), lse


def np_attention_grads(q, k, v, g, causal=False, lengths=None, window=None, scale=None):
    """float64 ``(dq, dk, dv)`` of ``sum(out * g)``, from the softmax's Jacobian."""
    p, _, group, scale = _probs(q, k, causal, lengths, window, scale)
    qf, g = _f64(q), _f64(g)
    kf, vf = (np.repeat(_f64(x), group, axis=1) for x in (k, v))
    dv = np.swapaxes(p, 2, 3) @ g
    dp = g @ np.swapaxes(vf, 2, 3)
    ds = p * (dp - np.sum(dp * p, -1, keepdims=True)) * scale
    dq = ds @ kf
    dk = np.swapaxes(ds, 2, 3) @ qf
    b, h, s, d = dk.shape

    def fold(x):                            # sum the query heads of each group
        return x.reshape(b, h // group, group, s, d).sum(2)
    return dq, fold(dk), fold(dv)


def nn_attention(q, k, v, causal=False, lengths=None, window=None, scale=None):
    """jax.nn.dot_product_attention on (batch, heads, seq, head_dim) operands."""
    def bshd(x):
        return jnp.swapaxes(x, 1, 2)
    out = jax.nn.dot_product_attention(
        bshd(q), bshd(k), bshd(v), scale=scale, is_causal=causal,
        key_value_seq_lengths=None if lengths is None else jnp.asarray(lengths),
        local_window_size=window)
    return jnp.swapaxes(out, 1, 2)
