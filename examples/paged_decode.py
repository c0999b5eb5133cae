"""Paged attention for decoding: one new query token per sequence against a KV cache kept in
fixed-size pages, the pages of each sequence listed in a page table.

The kernel reads the page table on the device (``page_table[b, j]``) and uses the value as the
origin of the copies of page ``j``'s keys and values: the cache is never gathered into a
contiguous tensor. It runs one block per (sequence, kv head), with an online softmax over the
pages (``jt.ops.attention_decode`` is the library's version, which also splits long
sequences over several blocks).

    python examples/paged_decode.py
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

import jaxtile as jt


@jt.kernel(threads=128)
def paged_decode(q, k_pages, v_pages, page_table, lengths):
    """Attention of ``q`` (batch, heads, d) to the first ``lengths[b]`` keys of sequence
    ``b``, stored in ``k_pages``/``v_pages`` (kv_heads, pages, page_size, d) at the pages
    ``page_table[b]`` lists (batch, max_pages) int32. Query head ``h`` reads kv head
    ``h // (heads // kv_heads)``. Softmax in float32; a sequence with no key gets zeros."""
    batch, heads, d = q.shape
    kv_heads, _, page, _ = k_pages.shape
    group = heads // kv_heads
    scale = 1 / math.sqrt(d)
    out = jt.empty((batch, heads, d), q.dtype)
    hk, b = jt.grid(kv_heads, batch)
    q_s = jt.shared((group, d), q.dtype)
    k_s = jt.shared((page, d), k_pages.dtype)
    v_s = jt.shared((page, d), v_pages.dtype)
    s = jt.fragment((group, page), jnp.float32)
    p = jt.fragment((group, page), v_pages.dtype)
    acc = jt.fragment((group, d), jnp.float32)
    m_i = jt.fragment((group,), jnp.float32)
    l_i = jt.fragment((group,), jnp.float32)
    jt.copy(q.at[b, hk * group, 0], q_s)
    acc[...] = jnp.zeros((group, d), jnp.float32)
    m_i[...] = jnp.full((group,), -jnp.inf, jnp.float32)
    l_i[...] = jnp.zeros((group,), jnp.float32)
    length = jnp.clip(lengths[b], 0, page_table.shape[1] * page)

    @jt.loop(jt.cdiv(length, page))                  # a trip count read from an input
    def _(j):
        pg = page_table[b, j]                        # the page table, read on the device
        jt.copy(k_pages.at[hk, pg, 0, 0], k_s)
        jt.copy(v_pages.at[hk, pg, 0, 0], v_s)
        s[...] = jnp.zeros((group, page), jnp.float32)
        jt.gemm(q_s, k_s, s, transpose_b=True)
        key = j * page + jax.lax.broadcasted_iota(jnp.int32, (group, page), 1)
        sv = jnp.where(key < length, s[...] * scale, -jnp.inf)   # the last page's tail
        m_new = jnp.maximum(m_i[...], jnp.max(sv, axis=1))
        e = jnp.exp(sv - m_new[:, None])
        alpha = jnp.exp(m_i[...] - m_new)
        l_i[...] = l_i[...] * alpha + jnp.sum(e, axis=1)
        acc[...] = acc[...] * alpha[:, None]
        p[...] = e.astype(v_pages.dtype)
        jt.gemm(p, v_s, acc)
        m_i[...] = m_new

    lv = l_i[...]
    acc[...] = jnp.where(lv[:, None] > 0, acc[...] / lv[:, None], 0.0)
    res = jt.fragment((group, d), q.dtype)
    res[...] = acc[...].astype(q.dtype)
    jt.copy(res, out.at[b, hk * group, 0])
    return out


def paged_decode_jnp(q, k_pages, v_pages, page_table, lengths):
    """The same in jnp: gather each sequence's pages into a contiguous cache, then mask."""
    batch, heads, d = q.shape
    kv_heads, _, page, _ = k_pages.shape
    k = k_pages[:, page_table].reshape(kv_heads, batch, -1, d)   # (kvh, b, keys, d)
    v = v_pages[:, page_table].reshape(kv_heads, batch, -1, d)
    k = jnp.repeat(k, heads // kv_heads, axis=0).astype(jnp.float32)
    v = jnp.repeat(v, heads // kv_heads, axis=0).astype(jnp.float32)
    s = jnp.einsum("bhd,hbsd->bhs", q.astype(jnp.float32), k,
                   precision=jax.lax.Precision.HIGHEST) / math.sqrt(d)
    valid = jnp.arange(s.shape[-1])[None, None, :] < lengths[:, None, None]
    s = jnp.where(valid, s, -jnp.inf)
    p = jnp.where(valid, jax.nn.softmax(s, axis=-1), 0.0)
    o = jnp.einsum("bhs,hbsd->bhd", jnp.nan_to_num(p), v, precision=jax.lax.Precision.HIGHEST)
    return o.astype(q.dtype)


def example_inputs(key, batch=3, heads=4, kv_heads=2, d=32, page=16, max_pages=4):
    """A small paged cache whose pages are shuffled, with ragged lengths (one empty)."""
    kq, kk, kv, kp = jax.random.split(key, 4)
    pages = batch * max_pages + 2
    q = jax.random.normal(kq, (batch, heads, d))
    k_pages = jax.random.normal(kk, (kv_heads, pages, page, d))
    v_pages = jax.random.normal(kv, (kv_heads, pages, page, d))
    page_table = jax.random.permutation(kp, pages)[:batch * max_pages]
    page_table = page_table.reshape(batch, max_pages).astype(jnp.int32)
    lengths = jnp.array([37, 0, page * max_pages], jnp.int32)[:batch]
    return q, k_pages, v_pages, page_table, lengths


def main() -> None:
    args = example_inputs(jax.random.key(0))
    got = jax.jit(paged_decode)(*args)
    err = float(jnp.max(jnp.abs(got - paged_decode_jnp(*args))))
    print(f"paged decode, lengths {list(map(int, args[4]))}: max |jaxtile - jnp| = {err:.2e}")
    if not err < 1e-4:
        raise SystemExit(f"FAILED: paged decode differs from jnp by {err}")
    print("OK")


if __name__ == "__main__":
    main()
