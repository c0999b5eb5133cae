"""Decode-time attention: one new query token per sequence against a long, paged KV cache.

The cache is split over the sequence (split-K, "flash decoding"): :func:`decode_partial`
runs one block per (split, K/V head, sequence), each an online softmax over its share of
the sequence's pages that also returns its log-sum-exp; :func:`decode_combine` merges the
splits' partial outputs, weighting each by ``exp(lse_split - lse)``. All query heads of a
K/V head's group are rows of one tile, so grouped-query attention reads each page once.

The cache is paged: ``k_pages`` and ``v_pages`` have shape (kv_heads, pages, page_size,
head_dim) and sequence ``b``'s keys are the pages ``page_table[b, :cdiv(lengths[b],
page_size)]`` in order (the page table and lengths are read on the device).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

import jaxtile as jt

from . import _checks
from .attention_mask import FLOATS, attention_scale


def _check(q: Any, k_pages: Any, v_pages: Any, page_table: Any, lengths: Any) -> int:
    """The operands of :func:`decode_partial`; returns the query heads per K/V head."""
    op = "attention_decode"
    _checks.rank(op, "q", q, 3)
    for name, x in (("k_pages", k_pages), ("v_pages", v_pages)):
        _checks.rank(op, name, x, 4)
    _checks.same_shape(op, k_pages=k_pages, v_pages=v_pages)
    _checks.same_dtype(op, q=q, k_pages=k_pages, v_pages=v_pages)
    if q.dtype not in [jnp.dtype(d) for d in FLOATS]:
        raise TypeError(f"{op}: q must be float32, bfloat16 or float16, got {q.dtype}")
    b, h, d = q.shape
    if d == 0:
        raise ValueError(f"{op}: q has shape {tuple(q.shape)}: head_dim is 0 (no features "
                         "to score keys with); attention needs head_dim >= 1")
    hk = k_pages.shape[0]
    if k_pages.shape[3] != d or hk == 0 or h % hk:
        raise ValueError(f"{op}: q has shape {tuple(q.shape)} (batch, heads, head_dim) but "
                         f"k_pages has shape {tuple(k_pages.shape)} (kv_heads, pages, "
                         "page_size, head_dim): head_dim must agree and heads be a multiple "
                         "of kv_heads")
    _checks.rank(op, "page_table", page_table, 2)
    if page_table.shape[0] != b:
        raise ValueError(f"{op}: page_table must have one row per sequence ({b}), got "
                         f"shape {tuple(page_table.shape)}")
    _checks.vector(op, "lengths", lengths, b, "one length per sequence")
    for name, x in (("page_table", page_table), ("lengths", lengths)):
        if x.dtype != jnp.int32:
            raise TypeError(f"{op}: {name} must be int32, got {x.dtype}")
    return h // hk


@jt.kernel(threads=128)
def decode_partial(q, k_pages, v_pages, page_table, lengths, *, scale=None, splits=8):
    """``(o_part, lse_part)``: for each of ``splits`` shares of a sequence's pages, the
    attention output of its keys alone, (batch, splits, heads, head_dim) float32, and their
    log-sum-exp, (batch, splits, heads) float32 (``-inf`` for a share with no key). A share
    is ``cdiv(pages, splits)`` consecutive pages of the sequence."""
    group = _check(q, k_pages, v_pages, page_table, lengths)
    _checks.positive_int("attention_decode", "splits", splits)
    batch, heads, d = q.shape
    kv_heads, _, page, _ = k_pages.shape
    scale = attention_scale(scale, d)
    o_part = jt.empty((batch, splits, heads, d), jnp.float32)
    lse_part = jt.empty((batch, splits, heads), jnp.float32)
    sp, hk, b = jt.grid(splits, kv_heads, batch)
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
    n_pages = jt.cdiv(length, page)
    share = jt.cdiv(n_pages, splits)

    @jt.loop(sp * share, jnp.minimum((sp + 1) * share, n_pages))
    def _(j):
        pg = page_table[b, j]
        jt.copy(k_pages.at[hk, pg, 0, 0], k_s)
        jt.copy(v_pages.at[hk, pg, 0, 0], v_s)
        s[...] = jnp.zeros((group, page), jnp.float32)
        jt.gemm(q_s, k_s, s, transpose_b=True)
        cols = j * page + jax.lax.broadcasted_iota(jnp.int32, (group, page), 1)
        sv = jnp.where(cols < length, s[...] * scale, -jnp.inf)
        m_new = jnp.maximum(m_i[...], jnp.max(sv, axis=1))
        pe = jnp.exp(sv - m_new[:, None])       # every visited page holds a key: m is finite
        alpha = jnp.exp(m_i[...] - m_new)
        l_i[...] = l_i[...] * alpha + jnp.sum(pe, axis=1)
        acc[...] = acc[...] * alpha[:, None]
        p[...] = pe.astype(v_pages.dtype)
        jt.gemm(p, v_s, acc)
        m_i[...] = m_new

    lv = l_i[...]
    # l == 0 only for a share with no key; a NaN l (from a NaN or inf operand) must stay NaN.
    acc[...] = jnp.where(lv[:, None] == 0, 0.0, acc[...] / lv[:, None])
    jt.copy(acc, o_part.at[b, sp, hk * group, 0])
    l_i[...] = jnp.where(lv == 0, -jnp.inf, m_i[...] + jnp.log(lv))
    jt.copy(l_i, lse_part.at[b, sp, hk * group])
    return o_part, lse_part


@jt.kernel(threads=128)
def decode_combine(o_part, lse_part, *, dtype=jnp.float32, heads_per_block=8):
    """Merge :func:`decode_partial`'s splits: ``out[b, h] = sum_s w_s o_part[b, s, h]`` with
    ``w_s = exp(lse_part[b, s, h] - lse)``, ``lse = logsumexp_s lse_part[b, s, h]``;
    returns ``out`` (batch, heads, head_dim) in ``dtype`` (0 for a sequence with no key)."""
    _checks.rank("decode_combine", "o_part", o_part, 4)
    batch, splits, heads, d = o_part.shape
    if tuple(lse_part.shape) != (batch, splits, heads):
        raise ValueError(f"decode_combine: lse_part must have shape {(batch, splits, heads)}, "
                         f"got {tuple(lse_part.shape)}")
    bh = heads_per_block
    out = jt.empty((batch, heads, d), dtype)
    hx, b = jt.grid(jt.cdiv(heads, bh), batch)
    o_t = jt.fragment((bh, d), jnp.float32)
    acc = jt.fragment((bh, d), jnp.float32)
    lse_t = jt.fragment((bh,), jnp.float32)
    m_i = jt.fragment((bh,), jnp.float32)
    l_i = jt.fragment((bh,), jnp.float32)
    res = jt.fragment((bh, d), dtype)
    acc[...] = jnp.zeros((bh, d), jnp.float32)
    m_i[...] = jnp.full((bh,), -jnp.inf, jnp.float32)
    l_i[...] = jnp.zeros((bh,), jnp.float32)

    @jt.loop(splits)
    def _(sp):
        jt.copy(o_part.at[b, sp, hx * bh, 0], o_t)
        jt.copy(lse_part.at[b, sp, hx * bh], lse_t, pad=-jnp.inf)
        lv = lse_t[...]
        m_new = jnp.maximum(m_i[...], lv)
        m_sub = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        w = jnp.exp(lv - m_sub)
        alpha = jnp.exp(m_i[...] - m_sub)
        l_i[...] = l_i[...] * alpha + w
        acc[...] = acc[...] * alpha[:, None] + w[:, None] * o_t[...]
        m_i[...] = m_new

    lv = l_i[...]
    res[...] = jnp.where(lv[:, None] == 0, 0.0, acc[...] / lv[:, None]).astype(dtype)
    jt.copy(res, out.at[b, hx * bh, 0])
    return out


def attention_decode(q: Any, k_pages: Any, v_pages: Any, page_table: Any, lengths: Any, *,
                     scale: float | None = None, splits: int = 8) -> Any:
    """Attention of one query token per sequence against a paged KV cache.

    Args:
      q: (batch, heads, head_dim), float32, bfloat16 or float16.
      k_pages, v_pages: (kv_heads, pages, page_size, head_dim), q's dtype; ``heads`` a
        multiple of ``kv_heads`` (grouped-query attention).
      page_table: int32 (batch, pages_per_sequence): the pages of each sequence, in order.
      lengths: int32 (batch,): the number of cached tokens of each sequence (at most
        ``pages_per_sequence * page_size``); a sequence of length 0 gets 0 (as in
        :func:`jaxtile.ops.attention`, a query that sees no key gets 0).
      scale: the score scale; default ``1 / sqrt(head_dim)``.
      splits: how many shares each sequence's pages are split into (blocks that run in
        parallel; then combined).

    Returns (batch, heads, head_dim) in q's dtype; a NaN or inf in a head's scores makes
    that head's output NaN, as in ``jax.nn.dot_product_attention``.

    >>> out = jt.ops.attention_decode(q, k_pages, v_pages, page_table, lengths)  # doctest: +SKIP
    """
    o_part, lse_part = decode_partial(q, k_pages, v_pages, page_table, lengths, scale=scale,
                                      splits=splits)
    return decode_combine(o_part, lse_part, dtype=jnp.dtype(q.dtype).type,
                          heads_per_block=min(8, q.shape[1]))
