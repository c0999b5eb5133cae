"""Kernels that read their structure from inputs: a grouped (MoE) GEMM that reads expert
offsets and gathers its rows, and a paged-attention decode step that reads a page table and
per-sequence lengths."""

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt

BM, BN = 8, 16


@jt.kernel
def _grouped_gemm(x, w, order, offsets):
    """y[order[i]] = x[order[i]] @ w[e] for i in [offsets[e], offsets[e + 1]): tokens sorted
    by expert, each expert's rows gathered, multiplied and scattered back."""
    t, k = x.shape
    e_count, _, n = w.shape
    y = jt.empty((t, n), jnp.float32)
    e, bt, bn = jt.grid(e_count, jt.cdiv(t, BM), jt.cdiv(n, BN))
    lo, hi = offsets[e], offsets[e + 1]
    start = lo + bt * BM
    idx = jt.fragment((BM,), jnp.int32)
    x_s = jt.shared((BM, k), x.dtype)
    w_s = jt.shared((k, BN), w.dtype)
    acc = jt.fragment((BM, BN), jnp.float32)

    @jt.when(start < hi)
    def _():
        jt.copy(order.at[start], idx, pad=-1)
        pos = start + jax.lax.broadcasted_iota(jnp.int32, (BM,), 0)
        rows = jnp.where(pos < hi, idx[...], -1)       # rows of other experts: none
        jt.gather(x, rows, x_s)
        jt.copy(w.at[e, 0, bn * BN], w_s)
        acc[...] = jnp.zeros((BM, BN), jnp.float32)
        jt.gemm(x_s, w_s, acc)
        jt.scatter(acc, rows, y.at[:, jt.ds(bn * BN, BN)])
    return y


def test_grouped_gemm_reads_offsets_and_gathers_rows(rng):
    t, k, n, e_count = 29, 16, 40, 3
    x = jnp.asarray(rng.standard_normal((t, k)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((e_count, k, n)), jnp.float32)
    expert = rng.integers(0, e_count, size=t)
    order = np.argsort(expert, kind="stable").astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(expert, minlength=e_count))])
    expected = np.einsum("tk,tkn->tn", np.asarray(x, np.float64),
                         np.asarray(w, np.float64)[expert])
    args = (x, w, jnp.asarray(order), jnp.asarray(offsets, jnp.int32))
    np.testing.assert_allclose(jax.jit(_grouped_gemm)(*args), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_grouped_gemm.reference(*args), expected, rtol=1e-4,
                               atol=1e-4)


PAGE = 8


@jt.kernel
def _paged_decode(q, k_pages, v_pages, page_table, lens):
    """One query token per (sequence, head) against a paged KV cache: the pages of sequence
    b are page_table[b, :cdiv(lens[b], PAGE)]; online softmax over them."""
    b_count, h_count, d = q.shape
    out = jt.empty(q.shape, q.dtype)
    b, h = jt.grid(b_count, h_count)
    q_s = jt.shared((1, d), q.dtype)
    k_s = jt.shared((PAGE, d), k_pages.dtype)
    v_s = jt.shared((PAGE, d), v_pages.dtype)
    s = jt.fragment((1, PAGE), jnp.float32)
    p = jt.fragment((1, PAGE), v_pages.dtype)
    acc = jt.fragment((1, d), jnp.float32)
    m_i = jt.fragment((1, 1), jnp.float32)
    l_i = jt.fragment((1, 1), jnp.float32)
    o = jt.fragment((1, d), q.dtype)
    jt.copy(q.at[b, h, 0], q_s)
    acc[...] = jnp.zeros((1, d), jnp.float32)
    m_i[...] = jnp.full((1, 1), -jnp.inf, jnp.float32)
    l_i[...] = jnp.zeros((1, 1), jnp.float32)
    length = lens[b]

    @jt.loop(jt.cdiv(length, PAGE))
    def _(j):
        page = page_table[b, j]
        jt.copy(k_pages.at[page, h, 0, 0], k_s)
        jt.copy(v_pages.at[page, h, 0, 0], v_s)
        s[...] = jnp.zeros((1, PAGE), jnp.float32)
        jt.gemm(q_s, k_s, s, transpose_b=True)
        cols = j * PAGE + jax.lax.broadcasted_iota(jnp.int32, (1, PAGE), 1)
        sv = jnp.where(cols < length, s[...] / float(d) ** 0.5, -jnp.inf)
        m_new = jnp.maximum(m_i[...], jnp.max(sv, axis=1, keepdims=True))
        pe = jnp.exp(sv - m_new)
        alpha = jnp.exp(m_i[...] - m_new)
        l_i[...] = l_i[...] * alpha + jnp.sum(pe, axis=1, keepdims=True)
        acc[...] = acc[...] * alpha
        p[...] = pe.astype(v_pages.dtype)
        jt.gemm(p, v_s, acc)
        m_i[...] = m_new

    o[...] = (acc[...] / l_i[...]).astype(q.dtype)
    jt.copy(o, out.at[b, h, 0])
    return out


def test_paged_attention_decode(rng):
    b_count, h_count, d, n_pages = 3, 2, 32, 12
    lens = np.array([5, 17, 24], np.int32)
    max_pages = 3
    table = rng.permutation(n_pages)[:b_count * max_pages].reshape(b_count, max_pages)
    q = rng.standard_normal((b_count, h_count, d)).astype(np.float32)
    k_pages = rng.standard_normal((n_pages, h_count, PAGE, d)).astype(np.float32)
    v_pages = rng.standard_normal((n_pages, h_count, PAGE, d)).astype(np.float32)
    expected = np.zeros_like(q, np.float64)
    for b in range(b_count):
        keys = np.concatenate([k_pages[p] for p in table[b]], axis=1)[:, :lens[b]]
        vals = np.concatenate([v_pages[p] for p in table[b]], axis=1)[:, :lens[b]]
        for h in range(h_count):
            sc = keys[h].astype(np.float64) @ q[b, h] / np.sqrt(d)
            pr = np.exp(sc - sc.max())
            expected[b, h] = (pr / pr.sum()) @ vals[h]
    args = tuple(jnp.asarray(a) for a in (q, k_pages, v_pages, table.astype(np.int32), lens))
    np.testing.assert_allclose(jax.jit(_paged_decode)(*args), expected, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(_paged_decode.reference(*args), expected, rtol=2e-5,
                               atol=2e-5)
