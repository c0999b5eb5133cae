"""``jt.set_backend("hip-emulator")`` (gfx942) and ``"hip-emulator:gfx90a"``: kernel calls
inside ``jax.jit``, ``vmap`` and ``grad`` run the HIP text generated for the AMD target in
the emulator's wave64 mode (races, bounds, barriers checked), against the kernels' reference
semantics and an independent jnp formula, on shapes that do and do not divide the tiles.
The default run keeps one user kernel; ``-m slow`` runs the library kernels and gfx90a."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import _config, ops

# The kernels of the tests of compiler/hip/lower.py.
sys.path.insert(0, str(Path(__file__).parents[1] / "compiler" / "hip"))
from test_hip_lower import exp_add, row_sums, staged_sums  # noqa: E402

SLOW = pytest.mark.slow


@pytest.fixture(params=["hip-emulator", pytest.param("hip-emulator:gfx90a", marks=SLOW)])
def hip_emulator(request):
    """Kernels compile for the AMD target and run in the wave64 emulator for the test."""
    before = jt.backend()
    # jax.jit's caches do not know jaxtile's backend (see tests/emulator/conftest.py).
    jax.clear_caches()
    jt.set_backend(request.param)
    yield request.param
    jt.set_backend(before)
    jax.clear_caches()


def _data(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _close(got, want, tol=2e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=tol, atol=tol)


def _against(kernel, args, want, tol=2e-5):
    got = jax.jit(kernel)(*args)
    _close(got, kernel.reference(*args), tol)
    _close(got, want, tol)


def test_backend_names_and_environment(monkeypatch):
    assert _config.BACKENDS["hip-emulator"] == "hip:gfx942"
    assert _config.BACKENDS["hip-emulator:gfx90a"] == "hip:gfx90a"
    monkeypatch.setenv("JAXTILE_BACKEND", "HIP-Emulator:gfx90a")
    assert _config.get("JAXTILE_BACKEND") == "hip-emulator:gfx90a"
    with pytest.raises(jt.KernelError, match="unknown backend 'hip-emulator:gfx1100'"):
        jt.set_backend("hip-emulator:gfx1100")


def test_a_reduction_runs_in_wave64(hip_emulator):
    # 300 columns do not divide the 128-wide tiles, 100 rows do divide the 4-row blocks.
    x = _data((100, 300))
    _against(row_sums, (x,), jnp.sum(x, axis=1), 1e-4)


@SLOW
@pytest.mark.parametrize("n", [1024, 1000])
def test_elementwise(hip_emulator, n):
    x, y = _data((n,)), _data((n,), seed=1)
    _against(exp_add, (x, y), jnp.exp(x) + y, 1e-5)


@SLOW
@pytest.mark.parametrize("shape", [(8, 256), (10, 1000)])
def test_pipelined_through_lds(hip_emulator, shape):
    x = _data(shape)
    rows, cols = 4, 128
    padded = np.zeros((-(-shape[0] // rows) * rows, -(-shape[1] // cols) * cols), np.float32)
    padded[:shape[0], :shape[1]] = np.asarray(x)
    want = padded.reshape(-1, rows, padded.shape[1] // cols, cols).sum(2).reshape(-1, cols)
    _against(staged_sums, (x,), want[:shape[0]], 1e-4)


@SLOW
@pytest.mark.parametrize("shape", [(8, 256), (33, 300)])
def test_softmax_with_vmap_and_grad(hip_emulator, shape):
    x, w = _data(shape), _data(shape, seed=1)
    _against(ops.softmax, (x,), jax.nn.softmax(x, axis=-1))
    batched = jax.jit(jax.vmap(ops.softmax))(jnp.stack([x, 2 * x]))
    _close(batched, jax.nn.softmax(jnp.stack([x, 2 * x]), axis=-1))
    g = jax.jit(jax.grad(lambda x: jnp.sum(ops.softmax(x) * w)))(x)
    _close(g, jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, axis=-1) * w))(x), 1e-5)


def _layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _rms_norm(x, w, eps=1e-6):
    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


@SLOW
@pytest.mark.parametrize("shape", [(8, 256), (7, 200)])
def test_norms(hip_emulator, shape):
    x, w, b = _data(shape), _data(shape[-1:], seed=1), _data(shape[-1:], seed=2)
    _against(ops.layer_norm, (x, w, b), _layer_norm(x, w, b), 1e-4)
    _against(ops.rms_norm, (x, w), _rms_norm(x, w), 1e-4)
    g = jax.jit(jax.grad(lambda x: jnp.sum(ops.rms_norm(x, w) ** 2)))(x)
    _close(g, jax.grad(lambda x: jnp.sum(_rms_norm(x, w) ** 2))(x), 1e-4)
