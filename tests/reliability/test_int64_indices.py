"""64-bit indices under x64 (issue 19, point 3): gather ids, copy origins, direct ref
indices and loop bounds used to be cast to int32, so 2**32 + 1 read row 1 and a loop to
-2**32 + 3 ran three times (in the compiled kernel and the reference alike; the emulator and
the reference for direct indexing). They are now saturated into int32's range before the
cast, so a value out of range stays out of range and follows the edge rules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture(params=["cpu", pytest.param("cuda-emulator", marks=pytest.mark.slow)])
def backend(request):
    before = jt.backend()
    jax.clear_caches()
    jt.set_backend(request.param)
    yield request.param
    jt.set_backend(before)
    jax.clear_caches()


_IDS = [2**32 + 1, 3, -2**32 + 2, 2**31, 7, 0, 2**62, -1]
_ORIGINS = [2**32 + 1, -2**32 + 1, 2**31, 2**31 - 1, 3]


@jt.kernel
def _gather_and_origins(table, ids, origins):
    """Rows ``ids`` of ``table`` (pad -1); for each origin the 2 rows from it (pad -1),
    and the row it indexes directly (clamped into range, as JAX's indexing of refs is)."""
    n, w = ids.shape[0], table.shape[1]
    rows = jt.empty((n, w), table.dtype)
    t = jt.fragment((n, w), table.dtype)
    jt.gather(table, ids[...], t, pad=-1.0)
    jt.copy(t, rows)
    windows = jt.empty((origins.shape[0], 2, w), table.dtype)
    win = jt.fragment((2, w), table.dtype)
    direct = jt.empty((origins.shape[0], w), table.dtype)

    @jt.loop(origins.shape[0])
    def _(k):
        jt.copy(table.at[origins[k], 0], win, pad=-1.0)
        jt.copy(win, windows.at[k, 0, 0])
        direct[k, :] = table[origins[k], :]
    return rows, windows, direct


def _expected(table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = table.shape[0]
    rows = np.stack([table[i] if 0 <= i < n else np.full(table.shape[1], -1.0, table.dtype)
                     for i in _IDS])
    windows = np.stack([np.stack([table[o + r] if 0 <= o + r < n else
                                  np.full(table.shape[1], -1.0, table.dtype)
                                  for r in range(2)]) for o in _ORIGINS])
    direct = table[np.clip(_ORIGINS, 0, n - 1)]
    return rows, windows, direct


def test_out_of_range_indices_stay_out_of_range(x64, backend):
    table = jnp.arange(32, dtype=jnp.float32).reshape(8, 4)
    ids = jnp.asarray(_IDS, jnp.int64)
    origins = jnp.asarray(_ORIGINS, jnp.int64)
    want = _expected(np.asarray(table))
    # (the independent formula is numpy's: jnp.take(..., mode="fill") itself wraps 2**32 + 1
    # onto row 1 under x64 in JAX 0.10)
    for got in (jax.jit(_gather_and_origins)(table, ids, origins),
                _gather_and_origins.reference(table, ids, origins)):
        for g, w, name in zip(got, want, ("gather", "copy origins", "direct indexing")):
            np.testing.assert_array_equal(g, w, err_msg=name)


@jt.kernel
def _count(bounds):
    """How many iterations ``jt.loop(bounds[0], bounds[1])`` runs."""
    out = jt.empty((1,), jnp.int32)
    c = jt.local((1,), jnp.int32)
    c[0] = jnp.int32(0)

    @jt.loop(bounds[0], bounds[1])
    def _(i):
        c[0] = c[0] + 1
    out[0] = c[0]
    return out


@pytest.mark.parametrize("start,stop", [
    (0, -2**32 + 3), (2**32, 2**32 + 3),
    pytest.param(-2**33, -2**33 + 2, marks=pytest.mark.slow),
    pytest.param(2, 5, marks=pytest.mark.slow)])
def test_loop_bounds_saturate_instead_of_wrapping(x64, backend, start, stop):
    bounds = jnp.asarray([start, stop], jnp.int64)
    # both bounds saturate into int32: wrapping would run 3, 3 and 2 iterations
    lo, hi = (int(np.clip(b, -2**31, 2**31 - 1)) for b in (start, stop))
    want = [max(hi - lo, 0)]
    np.testing.assert_array_equal(jax.jit(_count)(bounds), want)
    np.testing.assert_array_equal(_count.reference(bounds), want)


def test_a_static_loop_bound_outside_int32_is_an_error():
    @jt.kernel
    def far(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...]

        @jt.loop(2**32 + 3)
        def _(i):
            out[0] = out[0] + 1
        return out

    with pytest.raises(jt.KernelError, match="loop bound 4294967299 is outside the int32"):
        far(jnp.zeros((2,), jnp.float32))
