"""The ``cuda-emulator:sm_90a`` backend: every kernel call compiles for ``cuda:sm_90a`` (Hopper
code) and runs in the SIMT emulator, against the kernel's reference semantics and an
independent jnp formula; plain ``cuda-emulator`` stays sm_80."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import ops


def _data(shape, dtype, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


@jt.kernel(threads=128)
def _scaled_row_sums(x, *, rows=4):
    n_rows, n_cols = x.shape
    out = jt.empty((n_rows, 1), jnp.float32)
    r = jt.grid(jt.cdiv(n_rows, rows))
    tile = jt.fragment((rows, jt.cdiv(n_cols, 128) * 128), jnp.float32)
    jt.copy(x.at[r * rows, 0], tile, pad=0)
    total = jt.fragment((rows, 1), jnp.float32)
    total[...] = jnp.sum(tile[...] * 0.5, axis=1, keepdims=True)
    jt.copy(total, out.at[r * rows, 0])
    return out


def test_language_kernel_runs_as_sm90a_code(hopper):
    x = _data((10, 70), np.float32)
    got = jax.jit(lambda v: _scaled_row_sums(v))(x)
    np.testing.assert_allclose(got, _scaled_row_sums.reference(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, 0.5 * x.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)
    # the emulator compiled exactly what the CUDA backend hands nvcc for sm_90a
    assert hopper == [_scaled_row_sums.lower(x, target="cuda:sm_90a").source]


@pytest.mark.slow   # a second emulator compile; the language kernel above covers the default run
def test_ops_softmax_on_sm90a(hopper):
    x = _data((7, 130), np.float32, 1)
    got = jax.jit(ops.softmax)(x)
    np.testing.assert_allclose(got, ops.softmax.reference(x), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got, jax.nn.softmax(x, axis=-1), rtol=2e-5, atol=2e-6)
    assert len(hopper) == 1


def test_plain_emulator_stays_sm80(hopper):
    # A shape no other test compiles: a specialisation built earlier in the session would be
    # reused without a build to spy on.
    x = _data((5, 137), np.float32, 2)
    jt.set_backend("cuda-emulator")
    jax.block_until_ready(jax.jit(ops.softmax)(x))
    assert hopper == [ops.softmax.lower(x, target="cuda:sm_80").source]
