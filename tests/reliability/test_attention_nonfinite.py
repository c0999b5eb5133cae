"""NaN and inf reach the output of jt.ops.attention and attention_decode as they do in
jax.nn.dot_product_attention; only a row that sees no key gets the documented 0.

The kernels' final normalisation once tested ``l > 0``, which is false for a NaN ``l`` too,
so a NaN query, ``scale=nan`` or an inf key gave 0: a diverging run showed zeros."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.ops.attention import attention_fwd
from jaxtile.ops.attention_decode import decode_combine, decode_partial

B, H, T, D = 1, 2, 8, 16


def _xla(q, k, v, **kw):
    """jax.nn.dot_product_attention in jaxtile's (batch, heads, seq, dim) layout."""
    def t(x):
        return jnp.swapaxes(x, 1, 2)
    return t(jax.nn.dot_product_attention(t(q), t(k), t(v), implementation="xla", **kw))


def _jnp(q, k, v, scale):
    """softmax(q k^T * scale) v written out with jnp."""
    p = jax.nn.softmax(jnp.einsum("bhtd,bhsd->bhts", q, k) * scale, axis=-1)
    return jnp.einsum("bhts,bhsd->bhtd", p, v)


@pytest.fixture
def qkv():
    rng = np.random.default_rng(19)
    return tuple(jnp.asarray(rng.standard_normal((B, H, T, D)), jnp.float32)
                 for _ in range(3))


def _same(got, want):
    """Equal NaN positions, and equal values elsewhere."""
    got, want = np.asarray(got), np.asarray(want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_nan_query_and_inf_key_propagate(qkv):
    q, k, v = qkv
    lengths = jnp.full((B,), T, jnp.int32)
    params = {"bm": T, "bn": T}
    for qq, kk in ((q.at[0, 0, 3, 5].set(jnp.nan), k), (q, k.at[0, 1, 2, :].set(jnp.inf))):
        want = _xla(qq, kk, v)
        assert np.isnan(np.asarray(want)).any()
        out = jt.ops.attention(qq, kk, v, block_q=T, block_k=T)
        _same(out, want)
        _same(out, _jnp(qq, kk, v, 1 / np.sqrt(D)))
        ref, _ = attention_fwd.reference(qq, kk, v, lengths, **params)
        _same(out, ref)


def test_nan_scale_propagates(qkv):
    q, k, v = qkv
    out, lse = jt.ops.attention(q, k, v, scale=float("nan"), return_lse=True, block_q=T,
                                block_k=T)
    assert np.isnan(np.asarray(out)).all() and np.isnan(np.asarray(lse)).all()
    assert np.isnan(np.asarray(_xla(q, k, v, scale=float("nan")))).all()


@pytest.mark.slow
def test_nan_gradient_propagates(qkv):
    """The backward kernels recompute P from the forward log-sum-exp: a NaN row stays NaN in
    every gradient it reaches, as in JAX."""
    q, k, v = qkv
    qn = q.at[0, 0, 3, 5].set(jnp.nan)
    got = jax.grad(lambda *a: jt.ops.attention(*a, block_q=T, block_k=T).sum(),
                   argnums=(0, 1, 2))(qn, k, v)
    want = jax.grad(lambda *a: _xla(*a).sum(), argnums=(0, 1, 2))(qn, k, v)
    for g, w in zip(got, want):
        assert np.isnan(np.asarray(w)).any()
        np.testing.assert_array_equal(np.isnan(np.asarray(g)), np.isnan(np.asarray(w)))


def test_row_that_sees_no_key_is_zero(qkv):
    """The documented value for a query with no visible key: 0, log-sum-exp -inf (XLA would
    average V over keys the query must not see)."""
    q, k, v = qkv
    out, lse = jt.ops.attention(q, k, v, lengths=jnp.zeros((B,), jnp.int32),
                                return_lse=True, block_q=T, block_k=T)
    assert np.all(np.asarray(out) == 0) and np.all(np.asarray(lse) == -np.inf)


def test_decode_nan_query_propagates():
    rng = np.random.default_rng(7)
    page, pages = 4, 6
    q = jnp.asarray(rng.standard_normal((2, 2, D)), jnp.float32).at[0, 1, 0].set(jnp.nan)
    k_pages, v_pages = (jnp.asarray(rng.standard_normal((2, pages, page, D)), jnp.float32)
                        for _ in range(2))
    table = jnp.asarray(np.arange(pages, dtype=np.int32).reshape(2, 3))
    lengths = jnp.asarray([10, 0], jnp.int32)
    out = np.asarray(jt.ops.attention_decode(q, k_pages, v_pages, table, lengths, splits=2))
    # Sequence 0's head 1 has the NaN query; sequence 1 has no key: 0, NaN query or not.
    assert np.isnan(out[0, 1]).all()
    assert not np.isnan(out[0, 0]).any() and np.all(out[1] == 0)
    keys = k_pages[:, table[0]].reshape(2, -1, D)[:, :10]
    vals = v_pages[:, table[0]].reshape(2, -1, D)[:, :10]
    want = _jnp(q[:1, :, None], keys[None], vals[None], 1 / np.sqrt(D))[0, :, 0]
    _same(out[0], want)
    o_part, lse_part = decode_partial.reference(q, k_pages, v_pages, table,
                                                           lengths, splits=2)
    ref = decode_combine.reference(o_part, lse_part)
    _same(out, ref)


@pytest.mark.slow
def test_nan_propagates_in_the_emulator(qkv):
    """The CUDA lowering of the same kernel source, run in the SIMT emulator."""
    q, k, v = qkv
    qn = q.at[0, 0, 3, 5].set(jnp.nan)
    before = jt.backend()
    jax.clear_caches()       # jit's caches do not know the backend
    jt.set_backend("cuda-emulator")
    try:
        out = jt.ops.attention(qn, k, v, block_q=T, block_k=T)
    finally:
        jt.set_backend(before)
        jax.clear_caches()
    want = _xla(qn, k, v)
    np.testing.assert_array_equal(np.isnan(np.asarray(out)), np.isnan(np.asarray(want)))
    # tf32 tensor cores on CUDA: a looser tolerance for the finite rows.
    np.testing.assert_allclose(out, want, rtol=2e-2, atol=2e-2)
