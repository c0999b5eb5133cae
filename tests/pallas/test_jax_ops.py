"""JAX's Pallas GPU kernels, unmodified but for their two Pallas imports, compiled by jaxtile
and compared with their modules' own reference functions (``jax.nn.softmax`` for softmax)
and an independent jnp formula, on shapes that are not powers of two."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_ops import load, primitives

TOL = dict(rtol=2e-5, atol=2e-5)


def _compiled_by_jaxtile(f, *args):
    names = primitives(jax.make_jaxpr(f)(*args).jaxpr)
    assert "jaxtile_kernel_call" in names and "pallas_call" not in names, names


def test_softmax(rng, backend):
    softmax = load("softmax").softmax
    x = jnp.asarray(rng.standard_normal((3, 5, 100)) * 4, jnp.float32)
    y = softmax(x)
    np.testing.assert_allclose(y, jax.nn.softmax(x, axis=-1), **TOL)
    e = np.exp(np.asarray(x, np.float64) - np.asarray(x).max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), **TOL)
    _compiled_by_jaxtile(softmax, x)


def _norm_inputs(rng, n=200):
    x = jnp.asarray(rng.standard_normal((2, 3, n)) + 1.5, jnp.float32)
    w = jnp.asarray(rng.standard_normal(n), jnp.float32)
    b = jnp.asarray(rng.standard_normal(n), jnp.float32)
    do = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    return x, w, b, do


def _jnp_layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * w + b


def _jnp_rms_norm(x, w, b, eps=1e-5):
    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * w + b


_NORMS = [("layer_norm", _jnp_layer_norm), ("rms_norm", _jnp_rms_norm)]


@pytest.mark.slow
@pytest.mark.parametrize("name, formula", _NORMS)
def test_norm_forward(rng, backend, name, formula):
    module = load(name)
    f, reference = getattr(module, name), getattr(module, f"{name}_reference")
    x, w, b, _ = _norm_inputs(rng)
    np.testing.assert_allclose(f(x, w, b), reference(x, w, b), **TOL)
    np.testing.assert_allclose(f(x, w, b), formula(x, w, b), **TOL)
    _compiled_by_jaxtile(f, x, w, b)


@pytest.mark.slow
@pytest.mark.parametrize("name, formula", _NORMS)
def test_norm_backward(rng, backend, name, formula):
    """The backward kernels through the module's custom_vjp: dx per row, dw and db reduced
    over rows by a grid over column blocks (2-D masked loads of an outer product of rows
    and columns)."""
    module = load(name)
    f, reference = getattr(module, name), getattr(module, f"{name}_reference")
    x, w, b, do = _norm_inputs(rng)

    def loss(g):
        return lambda x, w, b: (g(x, w, b) * do).sum()
    grads = jax.grad(loss(f), argnums=(0, 1, 2))(x, w, b)
    for got, want, indep in zip(grads, jax.grad(loss(reference), argnums=(0, 1, 2))(x, w, b),
                                jax.grad(loss(formula), argnums=(0, 1, 2))(x, w, b)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got, indep, rtol=1e-4, atol=1e-4)
    _compiled_by_jaxtile(jax.grad(loss(f)), x, w, b)


def _np_attention(q, k, v, mask=None):
    """Softmax attention in float64 NumPy: q [.., m, d], k and v [.., n, d]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mha_forward_and_backward(rng, backend, causal):
    """``mha`` (sequence lengths multiples of the blocks, as the module requires; head
    dimension 40, padded to 64 inside): forward and the fused backward kernels."""
    module = load("attention")
    q, k, v, do = (jnp.asarray(rng.standard_normal((1, 96, 2, 40)), jnp.float32)
                   for _ in range(4))
    blocks = module.BlockSizes(block_q=32, block_k=32, block_q_dkv=32, block_kv_dkv=32,
                               block_q_dq=32, block_kv_dq=32)

    def mha(q, k, v):
        return module.mha(q, k, v, None, causal=causal, block_sizes=blocks)

    def reference(q, k, v):
        return module.mha_reference(q, k, v, None, causal=causal)
    out = mha(q, k, v)
    np.testing.assert_allclose(out, reference(q, k, v), rtol=1e-4, atol=1e-4)
    mask = np.tril(np.ones((96, 96), bool)) if causal else None
    indep = _np_attention(*(np.swapaxes(a, 1, 2) for a in (q, k, v)), mask)
    np.testing.assert_allclose(out, np.swapaxes(indep, 1, 2), rtol=1e-4, atol=1e-4)
    grads = jax.grad(lambda *a: (mha(*a) * do).sum(), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(lambda *a: (reference(*a) * do).sum(), argnums=(0, 1, 2))(q, k, v)
    for got, w in zip(grads, want):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4)
    _compiled_by_jaxtile(jax.grad(lambda *a: (mha(*a) * do).sum()), q, k, v)


@pytest.mark.slow
def test_decode_attention(rng, backend):
    """``mqa`` and ``gqa`` with per-example ``start_idx`` and ``kv_seq_len``, 6 query
    heads in blocks of 8, head dimension 40, 4 key splits."""
    module = load("decode_attention")
    q = jnp.asarray(rng.standard_normal((2, 6, 40)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((2, 256, 40)), jnp.float32) for _ in range(2))
    start, length = jnp.array([3, 50]), jnp.array([250, 120])
    blocks = dict(block_h=8, block_k=32, k_splits=4)
    out = module.mqa(q, k, v, start, length, **blocks)
    np.testing.assert_allclose(out, module.mqa_reference(q, k, v, start, length),
                               rtol=1e-5, atol=1e-5)
    pos = np.arange(256)
    mask = (pos >= np.asarray(start)[:, None]) & (pos < np.asarray(length)[:, None])
    indep = _np_attention(q / np.sqrt(40), k, v, mask[:, None, :])
    np.testing.assert_allclose(out, indep, rtol=1e-5, atol=1e-5)
    k4, v4 = (jnp.asarray(rng.standard_normal((2, 256, 2, 40)), jnp.float32)
              for _ in range(2))
    out = module.gqa(q, k4, v4, start, length, **blocks)
    np.testing.assert_allclose(out, module.gqa_reference(q, k4, v4, start, length),
                               rtol=1e-5, atol=1e-5)
    _compiled_by_jaxtile(lambda *a: module.gqa(*a, **blocks), q, k4, v4, start, length)


def _pages(rng, dense, page, tables):
    """``dense`` [batch, seq, kv_heads, d] laid out in pages [kv_heads, pages, page, d]
    at the page numbers ``tables`` [batch, seq // page] gives."""
    b, s, h, d = dense.shape
    pages = np.zeros((h, tables.size, page, d), np.float32)
    for i in range(b):
        for j in range(s // page):
            pages[:, tables[i, j]] = dense[i, j * page:(j + 1) * page].transpose(1, 0, 2)
    return jnp.asarray(pages)


@pytest.mark.slow
def test_paged_attention(rng, backend):
    """Pages of 16 tokens in a shuffled page table, ragged lengths, 8 query heads over 2
    KV heads (blocks of 16 heads, padded), 3 key splits."""
    module = load("paged_attention")
    q = jnp.asarray(rng.standard_normal((2, 8, 40)), jnp.float32)
    k, v = (rng.standard_normal((2, 96, 2, 40)).astype(np.float32) for _ in range(2))
    tables = rng.permutation(12).reshape(2, 6).astype(np.int32)
    lengths = jnp.array([90, 37], jnp.int32)
    args = (q, _pages(rng, k, 16, tables), _pages(rng, v, 16, tables), jnp.asarray(tables),
            lengths)
    blocks = dict(block_h=16, pages_per_compute_block=2, k_splits=3)
    out = module.paged_attention(*args, **blocks)
    np.testing.assert_allclose(out, module.paged_attention_reference(q, k, v, lengths),
                               rtol=1e-5, atol=1e-5)
    mask = np.arange(96)[None, :] < np.asarray(lengths)[:, None]
    q4 = np.asarray(q).reshape(2, 2, 4, 40)
    indep = _np_attention(q4, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
                          mask[:, None, None, :]).reshape(2, 8, 40)
    np.testing.assert_allclose(out, indep, rtol=1e-5, atol=1e-5)
    _compiled_by_jaxtile(lambda *a: module.paged_attention(*a, **blocks), *args)
