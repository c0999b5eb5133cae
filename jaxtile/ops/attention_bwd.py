"""The derivatives of flash attention as tile kernels, in the FlashAttention-2 style.

With ``S = q k^T * scale``, ``P = exp(S - lse)`` (recomputed tile by tile from the forward
pass's log-sum-exp, never stored), ``out = P v`` and the cotangents ``g`` of ``out`` and
``g_lse`` of ``lse``:

- ``delta = rowsum(g * out) - g_lse`` (:func:`attention_dq`, which also returns ``dq``);
- ``dS = P * (g v^T - delta)``, ``dq = dS k * scale`` (one block per query tile, a loop
  over the K/V tiles it sees);
- ``dk = dS^T q * scale`` and ``dv = P^T g`` (:func:`attention_dkdv`: one block per K/V
  tile of a K/V head, a loop over the query heads of its group and their query tiles).

The forward-mode rule (:func:`attention_jvp`) is one more kernel: with the tangent
scores ``dS = (tq k^T + q tk^T) * scale``, ``t_lse = rowsum(P * dS)`` and
``t_out = (P * dS) v + P tv - t_lse * out``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

import jaxtile as jt

from .attention_mask import (
    attention_scale,
    check_qkv,
    kv_range,
    n_keys,
    positions,
    q_range,
    visible,
    window_pair,
)


def _probabilities(s: Any, lse: Any, keep: Any, scale: float) -> Any:
    """``P`` of a score tile from the rows' log-sum-exp; 0 where masked."""
    return jnp.where(keep, jnp.exp(s * scale - lse[:, None]), 0.0)


@jt.kernel(threads=128)
def attention_dq(q, k, v, lengths, out, lse, g, g_lse, *, causal=False, scale=None,
                 window=None, bm=64, bn=64):
    """``(dq, delta)``: the query cotangent (in ``q.dtype``) and ``delta = rowsum(g * out)
    - g_lse`` (B, H, T) float32 for :func:`attention_dkdv`. Blocks as in the forward
    kernel."""
    group, seq = check_qkv("attention_dq", q, k, v, lengths)
    window = window_pair(window)
    batch, heads, t_len, d = q.shape
    scale = attention_scale(scale, d)
    dq = jt.empty(q.shape, q.dtype)
    delta = jt.empty((batch, heads, t_len), jnp.float32)
    bx, h, b = jt.grid(jt.cdiv(t_len, bm), heads, batch)
    hk = h // group
    q_s = jt.shared((bm, d), q.dtype)
    g_s = jt.shared((bm, d), g.dtype)
    k_s = jt.shared((bn, d), k.dtype)
    v_s = jt.shared((bn, d), v.dtype)
    o_t = jt.fragment((bm, d), jnp.float32)
    s = jt.fragment((bm, bn), jnp.float32)
    dp = jt.fragment((bm, bn), jnp.float32)
    ds = jt.fragment((bm, bn), k.dtype)
    acc = jt.fragment((bm, d), jnp.float32)
    lse_t = jt.fragment((bm,), jnp.float32)
    delta_t = jt.fragment((bm,), jnp.float32)
    row0 = bx * bm
    jt.copy(q.at[b, h, row0, 0], q_s)
    jt.copy(g.at[b, h, row0, 0], g_s)
    jt.copy(out.at[b, h, row0, 0], o_t)
    jt.copy(lse.at[b, h, row0], lse_t)
    jt.copy(g_lse.at[b, h, row0], delta_t)
    delta_t[...] = jnp.sum(o_t[...] * g_s[...].astype(jnp.float32), axis=1) - delta_t[...]
    jt.copy(delta_t, delta.at[b, h, row0])
    acc[...] = jnp.zeros((bm, d), jnp.float32)
    keys = n_keys(lengths, b, seq)
    first, stop = kv_range(row0, bm, keys, bn, causal=causal, window=window)

    @jt.loop(first, stop)
    def _(j):
        jt.copy(k.at[b, hk, j * bn, 0], k_s)
        jt.copy(v.at[b, hk, j * bn, 0], v_s)
        s[...] = jnp.zeros((bm, bn), jnp.float32)
        jt.gemm(q_s, k_s, s, transpose_b=True)
        dp[...] = jnp.zeros((bm, bn), jnp.float32)
        jt.gemm(g_s, v_s, dp, transpose_b=True)
        rows, cols = positions(row0, j * bn, (bm, bn))
        keep = visible(rows, cols, keys, causal=causal, window=window)
        pv = _probabilities(s[...], lse_t[...], keep, scale)
        ds[...] = (pv * (dp[...] - delta_t[...][:, None]) * scale).astype(k.dtype)
        jt.gemm(ds, k_s, acc)

    o_t[...] = acc[...]
    jt.copy(o_t, dq.at[b, h, row0, 0])
    return dq, delta


@jt.kernel(threads=128)
def attention_dkdv(q, k, v, lengths, lse, delta, g, *, causal=False, scale=None, window=None,
                   bm=64, bn=64):
    """``(dk, dv)`` in ``k.dtype``, from the forward pass's ``lse`` and
    :func:`attention_dq`'s ``delta``. A block handles ``bn`` keys of one K/V head: it
    visits the query tiles that see them, for every query head of the head's group."""
    group, seq = check_qkv("attention_dkdv", q, k, v, lengths)
    window = window_pair(window)
    batch, heads, t_len, d = q.shape
    scale = attention_scale(scale, d)
    dk = jt.empty(k.shape, k.dtype)
    dv = jt.empty(v.shape, v.dtype)
    by, hk, b = jt.grid(jt.cdiv(seq, bn), k.shape[1], batch)
    q_s = jt.shared((bm, d), q.dtype)
    g_s = jt.shared((bm, d), g.dtype)
    k_s = jt.shared((bn, d), k.dtype)
    v_s = jt.shared((bn, d), v.dtype)
    s = jt.fragment((bm, bn), jnp.float32)
    dp = jt.fragment((bm, bn), jnp.float32)
    p = jt.fragment((bm, bn), g.dtype)
    ds = jt.fragment((bm, bn), q.dtype)
    dk_acc = jt.fragment((bn, d), jnp.float32)
    dv_acc = jt.fragment((bn, d), jnp.float32)
    lse_t = jt.fragment((bm,), jnp.float32)
    delta_t = jt.fragment((bm,), jnp.float32)
    col0 = by * bn
    jt.copy(k.at[b, hk, col0, 0], k_s)
    jt.copy(v.at[b, hk, col0, 0], v_s)
    dk_acc[...] = jnp.zeros((bn, d), jnp.float32)
    dv_acc[...] = jnp.zeros((bn, d), jnp.float32)
    keys = n_keys(lengths, b, seq)
    first, stop = q_range(col0, bn, t_len, bm, causal=causal, window=window)
    stop = jnp.where(col0 < keys, stop, first)        # padding keys get zero cotangents

    @jt.loop(group)
    def _(hg):
        h = hk * group + hg

        @jt.loop(first, stop)
        def _(i):
            row0 = i * bm
            jt.copy(q.at[b, h, row0, 0], q_s)
            jt.copy(g.at[b, h, row0, 0], g_s)
            jt.copy(lse.at[b, h, row0], lse_t)
            jt.copy(delta.at[b, h, row0], delta_t)
            s[...] = jnp.zeros((bm, bn), jnp.float32)
            jt.gemm(q_s, k_s, s, transpose_b=True)
            dp[...] = jnp.zeros((bm, bn), jnp.float32)
            jt.gemm(g_s, v_s, dp, transpose_b=True)
            rows, cols = positions(row0, col0, (bm, bn))
            keep = visible(rows, cols, keys, causal=causal, window=window)
            keep = keep & (rows < t_len)
            pv = _probabilities(s[...], lse_t[...], keep, scale)
            p[...] = pv.astype(g.dtype)
            jt.gemm(p, g_s, dv_acc, transpose_a=True)
            ds[...] = (pv * (dp[...] - delta_t[...][:, None]) * scale).astype(q.dtype)
            jt.gemm(ds, q_s, dk_acc, transpose_a=True)

    s_out = jt.fragment((bn, d), k.dtype)
    s_out[...] = dk_acc[...].astype(k.dtype)
    jt.copy(s_out, dk.at[b, hk, col0, 0])
    s_out[...] = dv_acc[...].astype(v.dtype)
    jt.copy(s_out, dv.at[b, hk, col0, 0])
    return dk, dv


@jt.kernel(threads=128)
def attention_jvp(q, k, v, lengths, out, lse, tq, tk, tv, *, causal=False, scale=None,
                  window=None, bm=64, bn=64):
    """``(t_out, t_lse)``: the forward-mode tangents of ``(out, lse)`` for the tangents
    ``tq``, ``tk``, ``tv`` (see the module doc). Blocks as in the forward kernel."""
    group, seq = check_qkv("attention_jvp", q, k, v, lengths)
    window = window_pair(window)
    batch, heads, t_len, d = q.shape
    scale = attention_scale(scale, d)
    t_out = jt.empty(q.shape, q.dtype)
    t_lse = jt.empty((batch, heads, t_len), jnp.float32)
    bx, h, b = jt.grid(jt.cdiv(t_len, bm), heads, batch)
    hk = h // group
    q_s = jt.shared((bm, d), q.dtype)
    tq_s = jt.shared((bm, d), q.dtype)
    k_s = jt.shared((bn, d), k.dtype)
    tk_s = jt.shared((bn, d), k.dtype)
    v_s = jt.shared((bn, d), v.dtype)
    tv_s = jt.shared((bn, d), v.dtype)
    s = jt.fragment((bm, bn), jnp.float32)
    ts = jt.fragment((bm, bn), jnp.float32)
    p = jt.fragment((bm, bn), v.dtype)
    acc = jt.fragment((bm, d), jnp.float32)
    lse_t = jt.fragment((bm,), jnp.float32)
    r_t = jt.fragment((bm,), jnp.float32)
    row0 = bx * bm
    jt.copy(q.at[b, h, row0, 0], q_s)
    jt.copy(tq.at[b, h, row0, 0], tq_s)
    jt.copy(lse.at[b, h, row0], lse_t)
    acc[...] = jnp.zeros((bm, d), jnp.float32)
    r_t[...] = jnp.zeros((bm,), jnp.float32)
    keys = n_keys(lengths, b, seq)
    first, stop = kv_range(row0, bm, keys, bn, causal=causal, window=window)

    @jt.loop(first, stop)
    def _(j):
        jt.copy(k.at[b, hk, j * bn, 0], k_s)
        jt.copy(tk.at[b, hk, j * bn, 0], tk_s)
        jt.copy(v.at[b, hk, j * bn, 0], v_s)
        jt.copy(tv.at[b, hk, j * bn, 0], tv_s)
        s[...] = jnp.zeros((bm, bn), jnp.float32)
        jt.gemm(q_s, k_s, s, transpose_b=True)
        ts[...] = jnp.zeros((bm, bn), jnp.float32)
        jt.gemm(tq_s, k_s, ts, transpose_b=True)
        jt.gemm(q_s, tk_s, ts, transpose_b=True)
        rows, cols = positions(row0, j * bn, (bm, bn))
        keep = visible(rows, cols, keys, causal=causal, window=window)
        pv = _probabilities(s[...], lse_t[...], keep, scale)
        pts = pv * ts[...] * scale
        r_t[...] = r_t[...] + jnp.sum(pts, axis=1)
        p[...] = pts.astype(v.dtype)
        jt.gemm(p, v_s, acc)
        p[...] = pv.astype(v.dtype)
        jt.gemm(p, tv_s, acc)

    o_t = jt.fragment((bm, d), jnp.float32)
    jt.copy(out.at[b, h, row0, 0], o_t)
    o_t[...] = acc[...] - r_t[...][:, None] * o_t[...]
    jt.copy(o_t, t_out.at[b, h, row0, 0])
    jt.copy(r_t, t_lse.at[b, h, row0])
    return t_out, t_lse


def attention_grads(q: Any, k: Any, v: Any, lengths: Any, out: Any, lse: Any, g: Any,
                    g_lse: Any, **params: Any) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` for the cotangents ``g`` of ``out`` and ``g_lse`` of ``lse``: two
    kernels, :func:`attention_dq` then :func:`attention_dkdv`."""
    dq, delta = attention_dq(q, k, v, lengths, out, lse, g, g_lse.astype(jnp.float32),
                             **params)
    dk, dv = attention_dkdv(q, k, v, lengths, lse, delta, g, **params)
    return dq, dk, dv

