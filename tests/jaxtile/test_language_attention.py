"""Flash-attention forward written in the tile language: online softmax over K/V tiles, with
the causal K/V bound a traced value of the block index. Against jax.nn.dot_product_attention
and a float64 numpy formula, on ragged sequence lengths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt


@jt.kernel
def _flash_fwd(q, k, v, *, causal=False, bm=16, bn=16):
    bh_count, seq, d = q.shape
    out = jt.empty(q.shape, q.dtype)
    bx, bh = jt.grid(jt.cdiv(seq, bm), bh_count)
    q_s = jt.shared((bm, d), q.dtype)
    k_s = jt.shared((bn, d), k.dtype)
    v_s = jt.shared((bn, d), v.dtype)
    s = jt.fragment((bm, bn), jnp.float32)
    p = jt.fragment((bm, bn), v.dtype)
    acc = jt.fragment((bm, d), jnp.float32)
    m_i = jt.fragment((bm, 1), jnp.float32)
    l_i = jt.fragment((bm, 1), jnp.float32)
    o = jt.fragment((bm, d), q.dtype)
    jt.copy(q.at[bh, bx * bm, 0], q_s)
    acc[...] = jnp.zeros((bm, d), jnp.float32)
    m_i[...] = jnp.full((bm, 1), -jnp.inf, jnp.float32)
    l_i[...] = jnp.zeros((bm, 1), jnp.float32)
    n_kv = jt.cdiv(seq, bn)
    stop = jnp.minimum(n_kv, jt.cdiv((bx + 1) * bm, bn)) if causal else n_kv
    scale = 1.0 / float(d) ** 0.5

    @jt.loop(stop)
    def _(j):
        jt.copy(k.at[bh, j * bn, 0], k_s)
        jt.copy(v.at[bh, j * bn, 0], v_s)
        s[...] = jnp.zeros((bm, bn), jnp.float32)
        jt.gemm(q_s, k_s, s, transpose_b=True)
        rows = bx * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, bn), 0)
        cols = j * bn + jax.lax.broadcasted_iota(jnp.int32, (bm, bn), 1)
        keep = (cols < seq) & (cols <= rows) if causal else cols < seq
        sv = jnp.where(keep, s[...] * scale, -jnp.inf)
        m_old = m_i[...]
        m_new = jnp.maximum(m_old, jnp.max(sv, axis=1, keepdims=True))
        pe = jnp.exp(sv - m_new)
        alpha = jnp.exp(m_old - m_new)
        l_i[...] = l_i[...] * alpha + jnp.sum(pe, axis=1, keepdims=True)
        acc[...] = acc[...] * alpha
        p[...] = pe.astype(v.dtype)
        jt.gemm(p, v_s, acc)
        m_i[...] = m_new

    o[...] = (acc[...] / l_i[...]).astype(q.dtype)
    jt.copy(o, out.at[bh, bx * bm, 0])
    return out


def _numpy_attention(q, k, v, causal):
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    s = q @ np.swapaxes(k, 1, 2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[1:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_flash_attention_forward(rng, causal, d, dtype):
    bh, seq = 3, 37                       # ragged: 37 rows over tiles of 16
    q, k, v = (jnp.asarray(rng.standard_normal((bh, seq, d)), dtype) for _ in range(3))
    got = jax.jit(lambda *a: _flash_fwd(*a, causal=causal))(q, k, v)
    ref = _flash_fwd.reference(q, k, v, causal=causal)
    want = _numpy_attention(q, k, v, causal)
    # jax.nn's layout is (batch, seq, heads, dim)
    nn = jax.nn.dot_product_attention(*(t[None].transpose(0, 2, 1, 3) for t in (q, k, v)),
                                      is_causal=causal)[0].transpose(1, 0, 2)
    tol = {"rtol": 2e-5, "atol": 2e-5} if dtype == jnp.float32 else {"rtol": 3e-2,
                                                                        "atol": 3e-2}
    for result in (got, ref, nn):
        np.testing.assert_allclose(np.asarray(result, np.float64), want, **tol)
    if causal:
        assert "serial(0, +%" in _flash_fwd.lower(q, k, v, causal=True).tile_ir
