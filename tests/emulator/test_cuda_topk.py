"""``lax.top_k`` and ``jnp.argsort`` of tiles on CUDA, in the SIMT emulator with its race
checks on: inside a loop over row tiles (the sort's shared arrays are reused every
iteration, so a missing barrier shows as a race), on a row length that is not a power of
two, against ``lax.top_k``/``jnp.argsort`` and the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxtile as jt

pytestmark = pytest.mark.slow

K = 4


@jt.kernel(threads=64)
def _route(x, *, rows=4):
    n, m = x.shape
    top = jt.empty((n, K), x.dtype)
    which = jt.empty((n, K), jnp.int32)
    order = jt.empty((n, m), jnp.int32)
    jt.grid(1)
    t = jt.fragment((rows, m), x.dtype)
    tv = jt.fragment((rows, K), x.dtype)
    ti = jt.fragment((rows, K), jnp.int32)
    to = jt.fragment((rows, m), jnp.int32)

    @jt.loop(jt.cdiv(n, rows))
    def _(i):
        jt.copy(x.at[i * rows, 0], t, pad=0)
        tv[...], ti[...] = lax.top_k(t[...], K)
        to[...] = jnp.argsort(t[...], axis=1)
        jt.copy(tv, top.at[i * rows, 0])
        jt.copy(ti, which.at[i * rows, 0])
        jt.copy(to, order.at[i * rows, 0])
    return top, which, order


@pytest.fixture
def emulator():
    before = jt.backend()
    jax.clear_caches()
    jt.set_backend("cuda-emulator")
    yield
    jt.set_backend(before)
    jax.clear_caches()


def test_top_k_and_argsort_in_a_loop(emulator):
    rng = np.random.default_rng(2)
    x = rng.integers(-4, 5, size=(16, 20)).astype(np.float32)     # many ties
    x[1, [0, 7, 19]] = np.nan
    x[2, [3, 4, 5]] = [0.0, -0.0, 0.0]
    x = jnp.asarray(x)
    top, which, order = jax.jit(_route)(x)
    want_v, want_i = lax.top_k(x, K)
    np.testing.assert_array_equal(top, want_v)
    np.testing.assert_array_equal(np.signbit(top), np.signbit(want_v))
    np.testing.assert_array_equal(which, want_i)
    np.testing.assert_array_equal(order, jnp.argsort(x, axis=1))
    np.testing.assert_array_equal(order, np.argsort(np.asarray(x), axis=1, kind="stable"))
    for got, ref in zip((top, which, order), _route.reference(x)):
        np.testing.assert_array_equal(got, ref)
