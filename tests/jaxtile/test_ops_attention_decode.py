"""jt.ops.attention_decode: one query token per sequence against a paged KV cache, split
over the sequence and combined; against a float64 numpy formula and a jnp formula on the
gathered cache, with grouped-query heads, lengths that end inside a page, an empty sequence,
several split counts and three dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_helpers import DTYPE_IDS, DTYPES, TOL

import jaxtile as jt

PAGE, PAGES, PER_SEQ = 16, 24, 6


def _cache(rng, b, h, hk, d, dtype):
    table = rng.permutation(PAGES)[:b * PER_SEQ].reshape(b, PER_SEQ).astype(np.int32)
    q = jnp.asarray(rng.standard_normal((b, h, d)), dtype)
    k_pages, v_pages = (jnp.asarray(rng.standard_normal((hk, PAGES, PAGE, d)), dtype)
                        for _ in range(2))
    return q, k_pages, v_pages, table


def _np_decode(q, k_pages, v_pages, table, lengths):
    q, kp, vp = (np.asarray(jnp.asarray(x, jnp.float32), np.float64)
                 for x in (q, k_pages, v_pages))
    b_count, h, d = q.shape
    group = h // kp.shape[0]
    out = np.zeros_like(q)
    for b in range(b_count):
        n = lengths[b]
        keys = kp[:, table[b]].reshape(kp.shape[0], -1, d)[:, :n]
        vals = vp[:, table[b]].reshape(vp.shape[0], -1, d)[:, :n]
        for head in range(h):
            if n == 0:
                continue
            sc = keys[head // group] @ q[b, head] / np.sqrt(d)
            p = np.exp(sc - sc.max())
            out[b, head] = p / p.sum() @ vals[head // group]
    return out


def _jnp_decode(q, k_pages, v_pages, table, lengths):
    """The same with jnp: gather the pages, mask, softmax (every length > 0)."""
    hk, _, _, d = k_pages.shape
    keys = jnp.moveaxis(k_pages[:, table], 0, 1).reshape(q.shape[0], hk, -1, d)
    vals = jnp.moveaxis(v_pages[:, table], 0, 1).reshape(q.shape[0], hk, -1, d)
    group = q.shape[1] // hk
    keys, vals = (jnp.repeat(x, group, axis=1).astype(jnp.float32) for x in (keys, vals))
    s = jnp.einsum("bhd,bhsd->bhs", q.astype(jnp.float32), keys) / np.sqrt(d)
    s = jnp.where(jnp.arange(s.shape[-1]) < lengths[:, None, None], s, -jnp.inf)
    return jnp.einsum("bhs,bhsd->bhd", jax.nn.softmax(s, axis=-1), vals)


@pytest.mark.parametrize("splits", [1, 4])
def test_decode_gqa_splits(rng, splits):
    q, k_pages, v_pages, table = _cache(rng, 3, 8, 2, 64, jnp.float32)
    lengths = np.asarray([37, 96, 1], np.int32)       # mid-page, full cache, one token
    args = (q, k_pages, v_pages, jnp.asarray(table), jnp.asarray(lengths))
    got = jax.jit(lambda *a: jt.ops.attention_decode(*a, splits=splits))(*args)
    np.testing.assert_allclose(got, _np_decode(q, k_pages, v_pages, table, lengths),
                               **TOL[jnp.float32])
    np.testing.assert_allclose(got, _jnp_decode(*args), **TOL[jnp.float32])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_decode_dtypes_empty_sequence(rng, dtype):
    q, k_pages, v_pages, table = _cache(rng, 2, 4, 4, 128, dtype)
    lengths = np.asarray([0, 75], np.int32)
    got = jt.ops.attention_decode(q, k_pages, v_pages, jnp.asarray(table),
                                  jnp.asarray(lengths), splits=3)
    assert got.dtype == dtype
    np.testing.assert_allclose(np.asarray(got, np.float64),
                               _np_decode(q, k_pages, v_pages, table, lengths), **TOL[dtype])
    assert np.all(np.asarray(got[0]) == 0)


def test_decode_bad_operands(rng):
    q, k_pages, v_pages, table = _cache(rng, 2, 4, 3, 16, jnp.float32)
    with pytest.raises(jt.KernelError, match="multiple of kv_heads"):
        jt.ops.attention_decode(q, k_pages, v_pages, jnp.asarray(table),
                                jnp.zeros((2,), jnp.int32))
    q, k_pages, v_pages, table = _cache(rng, 2, 4, 2, 16, jnp.float32)
    with pytest.raises(jt.KernelError, match="page_table must be int32"):
        jt.ops.attention_decode(q, k_pages, v_pages, jnp.asarray(table, jnp.float32),
                                jnp.zeros((2,), jnp.int32))
