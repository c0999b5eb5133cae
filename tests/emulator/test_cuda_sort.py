"""``jnp.sort`` of tiles on CUDA, in the SIMT emulator with its race checks on: a sort inside
a loop over row tiles (the staging arrays are reused every iteration, so a missing barrier
would show as a race), along both axes, with NaNs, signed zeros and ties, against numpy's
stable sort (XLA's order: NaNs last) and the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt

pytestmark = pytest.mark.slow


@jt.kernel(threads=64)
def _sort_tiles(x, *, rows=4, axis=1):
    n, m = x.shape
    out = jt.empty((n, m), x.dtype)
    jt.grid(1)
    t = jt.fragment((rows, m), x.dtype)

    @jt.loop(jt.cdiv(n, rows))
    def _(i):
        jt.copy(x.at[i * rows, 0], t, pad=0)
        t[...] = jnp.sort(t[...], axis=axis)
        jt.copy(t, out.at[i * rows, 0])
    return out


@pytest.fixture
def emulator():
    before = jt.backend()
    jax.clear_caches()
    jt.set_backend("cuda-emulator")
    yield
    jt.set_backend(before)
    jax.clear_caches()


@pytest.mark.parametrize("axis", [0, 1])
def test_sort_in_a_loop_in_xla_order(emulator, axis):
    rng = np.random.default_rng(1)
    x = rng.integers(-3, 4, size=(16, 24)).astype(np.float32)   # many ties
    x[2, [0, 5, 9]] = np.nan
    x[6, [1, 2, 3]] = [0.0, -0.0, 0.0]
    x[:, 7] = -0.0
    got = np.asarray(jax.jit(lambda v: _sort_tiles(v, axis=axis))(jnp.asarray(x)))
    want = np.concatenate([np.sort(x[i:i + 4], axis=axis, kind="stable")
                           for i in range(0, 16, 4)])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    np.testing.assert_array_equal(got, _sort_tiles.reference(jnp.asarray(x), axis=axis))
