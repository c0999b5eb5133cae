"""The ``jt.ops`` kernels on ``hip-emulator`` and ``hip-emulator:gfx90a`` (HIP text for the
AMD target run in the emulator's wave64 mode, races, bounds and barriers checked), forward
and backward, against their reference semantics and an independent jnp formula, on ragged
shapes, the kernels built on ``jt.gemm`` included (MFMA for 16-bit operands). All slow (a
g++ build per kernel); ``tests/hip/test_hip_emulator_backend.py`` keeps the default run's
case."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import ops

pytestmark = pytest.mark.slow


@pytest.fixture(params=["hip-emulator", "hip-emulator:gfx90a"], ids=["gfx942", "gfx90a"])
def hip(request):
    """Kernels compile for the AMD target and run in the wave64 emulator for the test."""
    before = jt.backend()
    # jax.jit's caches do not know jaxtile's backend (see tests/emulator/conftest.py).
    jax.clear_caches()
    jt.set_backend(request.param)
    yield
    jt.set_backend(before)
    jax.clear_caches()


def _data(shape, dtype=np.float32, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _close(got, want, tol=2e-5):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=tol, atol=tol)


def _against(kernel, args, want, tol=2e-5, **params):
    """The emulator's result against ``kernel``'s reference and ``want``."""
    got = jax.jit(lambda *a: kernel(*a, **params))(*args)
    _close(got, kernel.reference(*args, **params), tol)
    _close(got, want, tol)


def test_add(hip):
    x, y = _data((1000,)), _data((1000,), seed=1)
    _against(ops.add, (x, y), x + y)


@pytest.mark.parametrize("shape", [(10, 300), (33, 64)])
def test_softmax_and_its_backward(hip, shape):
    x, w = _data(shape), _data(shape, seed=1)
    y = jax.nn.softmax(x, axis=-1)
    _against(ops.softmax, (x,), y)

    def loss(f, x):
        return jnp.sum(f(x) * w)

    g = jax.jit(jax.grad(lambda x: loss(ops.softmax, x)))(x)
    _close(g, jax.grad(lambda x: loss(lambda t: jax.nn.softmax(t, -1), x))(x))
    _against(ops.softmax_bwd, (y, w), y * (w - jnp.sum(w * y, -1, keepdims=True)))


def _layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _rms_norm(x, w, eps=1e-6):
    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_norms_forward_and_backward(hip, norm):
    """The forward kernel, then ``jax.grad`` (the ``*_bwd`` kernel) for every input."""
    x, w, b, g = _data((7, 200)), _data((200,), seed=1), _data((200,), seed=2), \
        _data((7, 200), seed=3)
    if norm == "layer":
        _against(ops.layer_norm, (x, w, b), _layer_norm(x, w, b), 1e-4)
        fn, ref, args = ops.layer_norm, _layer_norm, (x, w, b)
    else:
        _against(ops.rms_norm, (x, w), _rms_norm(x, w), 1e-4)
        fn, ref, args = ops.rms_norm, _rms_norm, (x, w)
    argnums = tuple(range(len(args)))
    got = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * g), argnums))(*args)
    _close(got, jax.grad(lambda *a: jnp.sum(ref(*a) * g), argnums)(*args), 1e-3)


def test_decode_combine(hip):
    """The split-K combine of decode attention: softmax-weighted partial outputs."""
    o_part, lse_part = _data((2, 3, 4, 64), seed=1), _data((2, 3, 4), seed=2)
    weights = jax.nn.softmax(lse_part, axis=1)[..., None]
    _against(ops.decode_combine, (o_part, lse_part), jnp.sum(weights * o_part, axis=1), 1e-5)


def _tol(dtype):
    return {np.float32: 1e-4, np.float16: 2e-2, jnp.bfloat16: 8e-2}[dtype]


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16, np.float32],
                         ids=["f16", "bf16", "f32"])
def test_matmuls(hip, dtype):
    """MFMA for 16-bit operands (f32: the scalar gemm), 70 x 72 tiles that divide nothing."""
    h = _data((70, 72), dtype)
    want = jnp.dot(h.astype(jnp.float32), h.T.astype(jnp.float32), precision="highest")
    _against(ops.matmul, (h, h.T), want, _tol(dtype))
    _against(ops.matmul_relu, (h, h.T), jnp.maximum(want, 0), _tol(dtype))


def _attention(q, k, v, lengths, causal):
    """softmax(q k^T / sqrt(D) + mask) v in float32, K/V heads repeated for GQA."""
    group = q.shape[1] // k.shape[1]
    k, v = (jnp.repeat(x.astype(jnp.float32), group, axis=1) for x in (k, v))
    s = jnp.einsum("bhtd,bhsd->bhts", q.astype(jnp.float32), k,
                   precision="highest") / np.sqrt(q.shape[-1])
    rows, cols = np.arange(s.shape[2])[:, None], np.arange(s.shape[3])[None]
    keep = (cols < lengths[:, None, None, None]) & ((cols <= rows) if causal else True)
    p = jax.nn.softmax(jnp.where(keep, s, -jnp.inf), axis=-1)
    return jnp.einsum("bhts,bhsd->bhtd", p, v, precision="highest")


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_forward(hip, dtype, d, causal):
    """Flash attention on MFMA with the AMD tiles: GQA (4 query heads on 2 K/V heads),
    ragged (70 queries and keys, 53 valid keys in the second sequence)."""
    q = _data((2, 4, 70, d), dtype)
    k, v = _data((2, 2, 70, d), dtype, 1), _data((2, 2, 70, d), dtype, 2)
    lengths = jnp.asarray([70, 53], jnp.int32)
    got = jax.jit(lambda *a: ops.attention(*a, causal=causal, lengths=lengths))(q, k, v)
    want, _ = ops.attention_fwd.reference(q, k, v, lengths, causal=causal)
    _close(got, want, _tol(dtype))
    _close(got, _attention(q, k, v, lengths, causal), _tol(dtype))


def _decode_formula(q, kp, vp, table, lengths):
    hk, _, _, d = kp.shape
    keys, vals = (jnp.moveaxis(x[:, table], 0, 1).reshape(q.shape[0], hk, -1, d)
                  for x in (kp, vp))
    keys, vals = (jnp.repeat(x, q.shape[1] // hk, axis=1).astype(jnp.float32)
                  for x in (keys, vals))
    s = jnp.einsum("bhd,bhsd->bhs", q.astype(jnp.float32), keys) / np.sqrt(d)
    s = jnp.where(jnp.arange(s.shape[-1]) < lengths[:, None, None], s, -jnp.inf)
    return jnp.einsum("bhs,bhsd->bhd", jax.nn.softmax(s, axis=-1), vals)


def test_attention_decode(hip):
    q, page = _data((2, 4, 64), seed=3), _data((2, 12, 16, 64), seed=2)
    table = jnp.arange(8, dtype=jnp.int32).reshape(2, 4)
    lengths = jnp.asarray([37, 64], jnp.int32)
    got = jax.jit(lambda *a: ops.attention_decode(*a, splits=2))(q, page, page, table, lengths)
    _close(got, _decode_formula(q, page, page, table, lengths), 1e-4)
