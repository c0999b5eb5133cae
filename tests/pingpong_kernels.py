"""The test kernel of the ping-pong pass (compiler/gpu/pingpong.py): a 2-D single-head
flash-attention forward in the tile language, FA3's shape on sm_90a (256 threads: two
consumer warpgroups of 64 query rows each, a TMA ring on K/V that the ws pass gives a
producer warpgroup), and its float64 formula."""

import math

import jax.numpy as jnp
import numpy as np

import jaxtile as jt


@jt.kernel(threads=256)
def flash_fwd(q, k, v, *, causal=False, shift=0, bm=128, bn=64, stages=2, pingpong=None,
              warp_specialize=None):
    """``softmax(q k^T / sqrt(D) + mask) v`` for ``q`` (T, D), ``k`` and ``v`` (S, D), in
    ``q.dtype``; scores and the softmax in float32, probabilities cast to ``v.dtype`` for
    the product with ``v``. ``causal``: query ``r`` sees keys ``c <= r + shift`` (a negative
    ``shift`` leaves the first rows, and a whole first block, with no key: their output is
    0, and that block's loop runs no iteration)."""
    t_len, d = q.shape
    s_len = k.shape[0]
    scale = 1.0 / math.sqrt(d)
    out = jt.empty((t_len, d), q.dtype)
    bx = jt.grid(jt.cdiv(t_len, bm))
    q_s = jt.shared((bm, d), q.dtype)
    k_s = jt.shared((bn, d), k.dtype)
    v_s = jt.shared((bn, d), v.dtype)
    s = jt.fragment((bm, bn), jnp.float32)
    p = jt.fragment((bm, bn), v.dtype)
    acc = jt.fragment((bm, d), jnp.float32)
    m_i = jt.fragment((bm,), jnp.float32)
    l_i = jt.fragment((bm,), jnp.float32)
    o = jt.fragment((bm, d), q.dtype)
    jt.copy(q.at[bx * bm, 0], q_s)
    acc[...] = jnp.zeros((bm, d), jnp.float32)
    m_i[...] = jnp.full((bm,), -jnp.inf, jnp.float32)
    l_i[...] = jnp.zeros((bm,), jnp.float32)
    if causal:   # keys up to the block's last row + shift, at least none
        n = jnp.clip(jt.cdiv(jnp.minimum(bx * bm + bm + shift, s_len), bn), 0, None)
    else:
        n = jt.cdiv(s_len, bn)

    @jt.pipelined(n, stages=stages, pingpong=pingpong, warp_specialize=warp_specialize)
    def _(j):
        jt.copy(k.at[j * bn, 0], k_s)
        jt.copy(v.at[j * bn, 0], v_s)
        s[...] = jnp.zeros((bm, bn), jnp.float32)
        jt.gemm(q_s, k_s, s, transpose_b=True)
        rows = bx * bm + jnp.arange(bm)[:, None]
        cols = j * bn + jnp.arange(bn)[None, :]
        keep = cols < s_len
        if causal:
            keep = keep & (cols <= rows + shift)
        sv = jnp.where(keep, s[...] * scale, -jnp.inf)
        m_old = m_i[...]
        m_new = jnp.maximum(m_old, jnp.max(sv, axis=1))
        m_sub = jnp.where(m_new == -jnp.inf, 0.0, m_new)   # a row with no key yet
        pe = jnp.exp(sv - m_sub[:, None])
        alpha = jnp.exp(m_old - m_sub)
        l_i[...] = l_i[...] * alpha + jnp.sum(pe, axis=1)
        acc[...] = acc[...] * alpha[:, None]
        p[...] = pe.astype(v.dtype)
        jt.gemm(p, v_s, acc)
        m_i[...] = m_new

    lv = l_i[...]
    o[...] = jnp.where(lv[:, None] == 0, 0.0, acc[...] / lv[:, None]).astype(q.dtype)
    jt.copy(o, out.at[bx * bm, 0])
    return out


def flash_formula(q, k, v, *, causal=False, shift=0):
    """The same in float64 numpy, independently of the kernel: rows that see no key give 0."""
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = q64 @ k64.T / math.sqrt(q64.shape[1])
    rows, cols = np.arange(q64.shape[0])[:, None], np.arange(k64.shape[0])[None, :]
    keep = np.ones_like(scores, bool) if not causal else cols <= rows + shift
    scores = np.where(keep, scores, -np.inf)
    top = np.max(scores, axis=1, keepdims=True, initial=-np.inf)
    e = np.where(keep, np.exp(scores - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = e.sum(axis=1, keepdims=True)
    return np.where(total > 0, (e @ v64) / np.where(total > 0, total, 1.0), 0.0)


flash_fwd_3wg = jt.kernel(threads=384)(flash_fwd.fn)
"""The same over three consumer warpgroups (call with ``bm=192``): turns go round 0, 1, 2."""
