"""jt.ops.attention's derivatives: the gradients of q, k and v (the dq and dk/dv kernels)
against jax.nn.dot_product_attention's and a float64 numpy formula; the forward-mode kernel
against jax.jvp of jax.nn; jax.test_util.check_grads in both modes; the log-sum-exp's
cotangent; grad and jvp under vmap; every derivative runs compiled kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_helpers import DTYPE_IDS, DTYPES, nn_attention, np_attention_grads, qkv
from jax.test_util import check_grads

import jaxtile as jt

BLOCKS = {"block_q": 16, "block_k": 16}
GRAD_TOL = {jnp.float32: {"rtol": 1e-4, "atol": 1e-4},
            jnp.bfloat16: {"rtol": 5e-2, "atol": 8e-2},
            jnp.float16: {"rtol": 1e-2, "atol": 1e-2}}


def _grads(fn, q, k, v, g):
    return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * g), argnums=(0, 1, 2))(
        q, k, v)


@pytest.mark.parametrize("causal, window, lengths", [
    (False, None, None),
    pytest.param(True, None, None, marks=pytest.mark.slow),
    pytest.param(False, (15, 3), [33, 20], marks=pytest.mark.slow),
    (True, 9, [26, 33])], ids=["full", "causal", "window-lengths", "causal-window-lengths"])
def test_gradients_gqa_ragged(rng, causal, window, lengths):
    # 4 query heads on 2 K/V heads, 33 positions over tiles of 16.
    q, k, v = qkv(rng, 2, 4, 2, 33, 33, 64, jnp.float32)
    g = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    lens = None if lengths is None else jnp.asarray(lengths, jnp.int32)
    mask = {"causal": causal, "window": window}

    def ours(q, k, v):
        return jt.ops.attention(q, k, v, lengths=lens, **mask, **BLOCKS)
    got = jax.jit(lambda *a: _grads(ours, *a, g))(q, k, v)
    want = np_attention_grads(q, k, v, g, lengths=lengths, **mask)
    # jax.nn differs on rows that see no key (there are none here) and is float32.
    nn = _grads(lambda *a: nn_attention(*a, lengths=lens, **mask), q, k, v, g)
    for name, a, b, c in zip("qkv", got, nn, want):
        np.testing.assert_allclose(a, c, **GRAD_TOL[jnp.float32], err_msg=f"d{name}")
        np.testing.assert_allclose(b, c, rtol=1e-4, atol=1e-4, err_msg=f"jax.nn d{name}")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, pytest.param(jnp.float16,
                                                                 marks=pytest.mark.slow)],
                         ids=DTYPE_IDS[1:])
def test_gradients_low_precision(rng, dtype):
    q, k, v = qkv(rng, 1, 2, 1, 24, 24, 64, dtype)
    g = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    got = _grads(lambda *a: jt.ops.attention(*a, causal=True, **BLOCKS), q, k, v, g)
    want = np_attention_grads(q, k, v, g.astype(dtype), causal=True)
    for name, a, c in zip("qkv", got, want):
        assert a.dtype == dtype
        np.testing.assert_allclose(np.asarray(a, np.float64), c, **GRAD_TOL[dtype],
                                   err_msg=f"d{name}")


def test_head_dim_128_gradients(rng):
    q, k, v = qkv(rng, 1, 2, 2, 20, 20, 128, jnp.float32)
    g = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    got = _grads(lambda *a: jt.ops.attention(*a, causal=True, **BLOCKS), q, k, v, g)
    for name, a, c in zip("qkv", got, np_attention_grads(q, k, v, g, causal=True)):
        np.testing.assert_allclose(a, c, **GRAD_TOL[jnp.float32], err_msg=f"d{name}")


def test_lse_cotangent(rng):
    # d/dq of sum(lse) = sum_j P_ij k_j * scale: the lse's cotangent enters through delta.
    # (The kernels' shapes and parameters are those of test_head_dim_128_gradients.)
    q, k, v = qkv(rng, 1, 2, 2, 20, 20, 128, jnp.float32)

    def total_lse(q, k):
        return jnp.sum(jt.ops.attention(q, k, v, causal=True, return_lse=True, **BLOCKS)[1])

    def nn_lse(q, k):
        s = jnp.einsum("bhtd,bhsd->bhts", q, k) / np.sqrt(128)
        s = jnp.where(jnp.tril(jnp.ones((20, 20), bool)), s, -jnp.inf)
        return jnp.sum(jax.nn.logsumexp(s, axis=-1))
    got = jax.grad(total_lse, argnums=(0, 1))(q, k)
    want = jax.grad(nn_lse, argnums=(0, 1))(q, k)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_jvp_kernel(rng):
    q, k, v = qkv(rng, 1, 4, 2, 27, 27, 64, jnp.float32)
    tangents = qkv(rng, 1, 4, 2, 27, 27, 64, jnp.float32)
    lengths = jnp.asarray([25], jnp.int32)

    def ours(q, k, v):
        return jt.ops.attention(q, k, v, causal=True, lengths=lengths, return_lse=True,
                                **BLOCKS)
    (out, lse), (t_out, t_lse) = jax.jit(lambda p, t: jax.jvp(ours, p, t))((q, k, v),
                                                                          tangents)
    want = jax.jvp(lambda *a: nn_attention(*a, causal=True, lengths=lengths), (q, k, v),
                   tangents)[1]
    np.testing.assert_allclose(t_out, want, rtol=1e-4, atol=1e-4)
    # The lse's tangent is rowsum(P * dS), the directional derivative of the lse.
    eps = 1e-3
    lse_eps = ours(*(x + eps * t for x, t in zip((q, k, v), tangents)))[1]
    np.testing.assert_allclose(t_lse, (lse_eps - lse) / eps, rtol=2e-2, atol=2e-2)
    jaxpr = str(jax.make_jaxpr(lambda p, t: jax.jvp(ours, p, t))((q, k, v), tangents))
    assert "jaxtile_kernel_tangent" in jaxpr


def test_check_grads_both_modes(rng):
    q, k, v = qkv(rng, 1, 2, 1, 9, 9, 8, jnp.float32)
    lengths = jnp.asarray([8], jnp.int32)

    def f(q, k, v):
        return jt.ops.attention(q, k, v, causal=True, lengths=lengths, block_q=8, block_k=8)
    check_grads(f, (q, k, v), order=1, modes=("fwd", "rev"), eps=1e-2, atol=2e-2, rtol=2e-2)


def test_grad_and_jvp_under_vmap(rng):
    q, k, v = qkv(rng, 3, 2, 1, 18, 18, 64, jnp.float32)
    g = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def loss(q, k, v, g):
        return jnp.sum(jt.ops.attention(q, k, v, causal=True, **BLOCKS) * g)
    # The batch is the leading axis split into 3 problems of batch 1.
    split = [x[:, None] for x in (q, k, v, g)]
    got = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(*split)
    want = np_attention_grads(q, k, v, g, causal=True)
    for a, c in zip(got, want):
        np.testing.assert_allclose(a[:, 0], c, **GRAD_TOL[jnp.float32])
    # Forward mode in the direction g: sum(dq * g).
    jvps = jax.jit(jax.vmap(lambda q, k, v, g, t: jax.jvp(lambda q: loss(q, k, v, g), (q,),
                                                          (t,))[1]))(*split, split[3])
    np.testing.assert_allclose(jvps, np.sum(np.asarray(got[0]) * np.asarray(split[3]),
                                            axis=(1, 2, 3, 4)), rtol=1e-4, atol=1e-4)
    jaxpr = str(jax.make_jaxpr(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(*split))
    assert jaxpr.count("jaxtile_kernel") >= 1 and "dot_general" not in jaxpr


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gradients_default_tiles_long(rng, dtype):
    q, k, v = qkv(rng, 1, 4, 2, 200, 200, 128, dtype)
    g = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    got = _grads(lambda *a: jt.ops.attention(*a, causal=True), q, k, v, g)
    want = np_attention_grads(q, k, v, g.astype(dtype), causal=True)
    for name, a, c in zip("qkv", got, want):
        np.testing.assert_allclose(np.asarray(a, np.float64), c, **GRAD_TOL[dtype],
                                   err_msg=f"d{name}")
