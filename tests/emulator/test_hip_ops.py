"""The ``jt.ops`` kernels on ``hip-emulator`` and ``hip-emulator:gfx90a`` (HIP text for the
AMD target run in the emulator's wave64 mode, races, bounds and barriers checked), forward
and backward, against their reference semantics and an independent jnp formula, on ragged
shapes; the kernels built on ``jt.gemm`` (no MFMA gemm planner for HIP yet) are a clear
KernelError naming it. All slow (a g++ build per kernel);
``tests/emulator/test_hip_emulator_backend.py`` keeps the default run's case."""

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


def _gemm_cases():
    h = _data((70, 72), np.float16)
    q = _data((1, 2, 40, 64))
    kv = _data((1, 1, 40, 64), seed=1)
    q_decode, page = _data((2, 4, 64), seed=3), _data((2, 12, 16, 64), seed=2)
    table = jnp.arange(8, dtype=jnp.int32).reshape(2, 4)
    lengths = jnp.asarray([37, 64], jnp.int32)
    return [
        ("matmul", lambda: ops.matmul(h, h.T)),
        ("matmul_relu", lambda: ops.matmul_relu(h, h.T)),
        ("attention", lambda: ops.attention(q, kv, kv)),
        ("attention_decode", lambda: ops.attention_decode(q_decode, page, page, table, lengths,
                                                          splits=2)),
    ]


@pytest.mark.parametrize("case", range(len(_gemm_cases())),
                         ids=[c[0] for c in _gemm_cases()])
def test_kernels_built_on_gemm_are_a_clear_error(hip, case):
    _, call = _gemm_cases()[case]
    with pytest.raises(jt.KernelError, match="jt.gemm is not lowered for hip:gfx9"):
        jax.jit(call)()
