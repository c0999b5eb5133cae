"""jt.ops.attention's forward pass against jax.nn.dot_product_attention and a float64 numpy
formula: causal and not, grouped-query heads, per-sequence lengths, sliding windows, ragged
sequence lengths (not multiples of the tiles), head dims 64 and 128, three dtypes; its
log-sum-exp; its reference semantics; vmap; bad operands."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_helpers import DTYPE_IDS, DTYPES, TOL, nn_attention, np_attention, qkv

import jaxtile as jt

BLOCKS = {"block_q": 16, "block_k": 16}


def _check(got, q, k, v, dtype, **mask):
    want, lse = np_attention(q, k, v, **mask)
    # jax.nn gives a row that sees no key the mean of all values; jaxtile (and the numpy
    # formula) give it 0. Compare jax.nn on the other rows.
    seen = np.isfinite(lse)[..., None]
    nn = np.where(seen, np.asarray(nn_attention(q, k, v, **mask), np.float64), want)
    for result in (got, nn):
        np.testing.assert_allclose(np.asarray(result, np.float64), want, **TOL[dtype])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_forward_gqa_ragged(rng, causal, d):
    # 4 query heads on 2 K/V heads; 37 rows over tiles of 16.
    q, k, v = qkv(rng, 2, 4, 2, 37, 37, d, jnp.float32)
    got = jax.jit(lambda *a: jt.ops.attention(*a, causal=causal, **BLOCKS))(q, k, v)
    _check(got, q, k, v, jnp.float32, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=DTYPE_IDS[1:])
def test_forward_low_precision(rng, dtype):
    q, k, v = qkv(rng, 1, 2, 1, 40, 40, 64, dtype)
    got = jt.ops.attention(q, k, v, causal=True, **BLOCKS)
    assert got.dtype == dtype
    _check(got, q, k, v, dtype, causal=True)


@pytest.mark.parametrize("causal, window", [(False, (5, 9)), (True, 7), (False, None)],
                         ids=["window", "causal-window", "lengths-only"])
def test_forward_lengths_and_window(rng, causal, window):
    q, k, v = qkv(rng, 3, 2, 2, 45, 45, 64, jnp.float32)
    lengths = jnp.asarray([45, 1, 30], jnp.int32)
    got = jax.jit(lambda *a: jt.ops.attention(*a[:3], lengths=a[3], causal=causal,
                                              window=window, **BLOCKS))(q, k, v, lengths)
    _check(got, q, k, v, jnp.float32, causal=causal, lengths=np.asarray(lengths),
           window=window)


def test_forward_lse_cross_attention_and_empty_rows(rng):
    # 20 queries on 45 keys, default tiles (64): one partial tile each way; a sequence with
    # no keys gives zeros and a log-sum-exp of -inf.
    q, k, v = qkv(rng, 2, 2, 1, 20, 45, 64, jnp.float32)
    lengths = np.asarray([45, 0], np.int32)
    out, lse = jt.ops.attention(q, k, v, lengths=jnp.asarray(lengths), scale=0.3,
                                return_lse=True)
    want, want_lse = np_attention(q, k, v, lengths=lengths, scale=0.3)
    np.testing.assert_allclose(out, want, **TOL[jnp.float32])
    np.testing.assert_allclose(lse, want_lse, **TOL[jnp.float32])
    assert np.all(np.asarray(out[1]) == 0) and np.all(np.isneginf(np.asarray(lse[1])))


def test_reference_semantics_match(rng):
    q, k, v = qkv(rng, 1, 2, 2, 19, 19, 64, jnp.float32)
    lengths = jnp.asarray([19], jnp.int32)
    params = {"causal": True, "scale": None, "window": (4, 0), "bm": 16, "bn": 16}
    got = jt.ops.attention_fwd(q, k, v, lengths, **params)
    ref = jt.ops.attention_fwd.reference(q, k, v, lengths, **params)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_vmap_is_one_kernel(rng):
    q, k, v = qkv(rng, 3, 2, 1, 21, 21, 64, jnp.float32)
    qs, ks, vs = (jnp.stack([x, x[:, :, ::-1]]) for x in (q, k, v))   # a batch of 2

    def f(q, k, v):
        return jt.ops.attention(q, k, v, causal=True, **BLOCKS)
    got = jax.jit(jax.vmap(f))(qs, ks, vs)
    for i in range(2):
        want, _ = np_attention(qs[i], ks[i], vs[i], causal=True)
        np.testing.assert_allclose(got[i], want, **TOL[jnp.float32])
    jaxpr = str(jax.make_jaxpr(jax.vmap(f))(qs, ks, vs))
    assert jaxpr.count("jaxtile_kernel_call") == 1


def test_bad_operands_are_kernel_errors(rng):
    q, k, v = qkv(rng, 1, 3, 2, 8, 8, 16, jnp.float32)
    with pytest.raises(jt.KernelError, match="multiple of"):
        jt.ops.attention(q, k, v)
    q, k, v = qkv(rng, 1, 2, 1, 8, 8, 16, jnp.float32)
    with pytest.raises(jt.KernelError, match="float32, bfloat16 or float16"):
        jt.ops.attention(q.astype(jnp.int32), k.astype(jnp.int32), v.astype(jnp.int32))
    with pytest.raises(jt.KernelError, match="window"):
        jt.ops.attention(q, k, v, window=-1)
    with pytest.raises(jt.KernelError, match="lengths"):
        jt.ops.attention(q, k, v, lengths=jnp.zeros((2,), jnp.int32))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_default_tiles_long(rng, dtype, causal):
    q, k, v = qkv(rng, 1, 4, 1, 300, 300, 128, dtype)
    got = jax.jit(lambda *a: jt.ops.attention(*a, causal=causal))(q, k, v)
    _check(got, q, k, v, dtype, causal=causal)
