"""Atomic updates (jt.atomic_add / atomic_max / atomic_min): split-K GEMM, a histogram and
a running maximum, with many blocks updating the same elements at once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt

BM, BN, BK = 16, 16, 32


@jt.kernel
def _split_k(a, b, *, splits=4):
    """c = a @ b, the K dimension split over a grid axis; every split adds its partial
    product into c atomically (c starts as zeros)."""
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    bx, by, bs = jt.grid(jt.cdiv(n, BN), jt.cdiv(m, BM), splits)
    per_split = jt.cdiv(jt.cdiv(k, BK), splits)
    a_s = jt.shared((BM, BK), a.dtype)
    b_s = jt.shared((BK, BN), b.dtype)
    acc = jt.fragment((BM, BN), jnp.float32)
    acc[...] = jnp.zeros((BM, BN), jnp.float32)

    @jt.loop(per_split)
    def _(i):
        kk = (bs * per_split + i) * BK
        jt.copy(a.at[by * BM, kk], a_s)
        jt.copy(b.at[kk, bx * BN], b_s)
        jt.gemm(a_s, b_s, acc)

    jt.atomic_add(c.at[by * BM, bx * BN], acc[...])
    return c


@pytest.mark.parametrize("shape", [(32, 128, 32), (37, 200, 29)])
def test_split_k_gemm(rng, shape):
    m, k, n = shape
    a = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
    expected = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    np.testing.assert_allclose(jax.jit(_split_k)(a, b), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_split_k.reference(a, b), expected, rtol=1e-4, atol=1e-4)
    text = _split_k.lower(a, b).tile_ir
    assert "atomic(" in text and "init c0_init" not in text and "-> out0" in text


@jt.kernel
def _histogram(x, *, bins=8, block=64):
    """counts[v] = how many elements of x equal v (values outside [0, bins) are dropped)."""
    n = x.shape[0]
    counts = jt.empty((bins,), jnp.int32)
    i = jt.grid(jt.cdiv(n, block))
    t = jt.fragment((block,), jnp.int32)
    jt.copy(x.at[i * block], t, pad=-1)
    ones = jnp.ones((1,), jnp.int32)

    @jt.loop(block)
    def _(j):
        jt.atomic_add(counts.at[t[j]], ones)
    return counts


def test_histogram_loses_no_update(rng):
    # 1000 blocks all hitting 8 bins: lost updates would show
    x = jnp.asarray(rng.integers(-2, 10, size=64_000), jnp.int32)
    expected = np.bincount(np.asarray(x)[(np.asarray(x) >= 0) & (np.asarray(x) < 8)],
                           minlength=8)
    for _ in range(3):
        np.testing.assert_array_equal(jax.jit(_histogram)(x), expected)
    np.testing.assert_array_equal(_histogram.reference(x[:640]),
                                  np.bincount(np.clip(np.asarray(x[:640]), -1, 8)[
                                      (np.asarray(x[:640]) >= 0) & (np.asarray(x[:640]) < 8)],
                                      minlength=8))


@jt.kernel
def _column_extremes(x, *, rows=4):
    """Per column, the maximum and the minimum over all rows, one row tile per block."""
    n, m = x.shape
    hi = jt.empty((m,), x.dtype)
    lo = jt.empty((m,), x.dtype)
    r = jt.grid(jt.cdiv(n, rows))
    t = jt.fragment((rows, m), x.dtype)
    jt.copy(x.at[r * rows, 0], t, pad=0)
    jt.atomic_max(hi.at[0], jnp.max(t[...], axis=0))
    jt.atomic_min(lo.at[0], jnp.min(t[...], axis=0))
    return hi, lo


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32])
def test_atomic_max_and_min(rng, dtype):
    x = np.asarray(rng.standard_normal((30, 12)) * 10, dtype)
    if dtype == jnp.float32:
        x[3, 5] = np.nan
        x[:, 7] = -0.0  # XLA's order: min gives -0.0 over the zeros the outputs start as
    hi, lo = jax.jit(_column_extremes)(jnp.asarray(x))
    # outputs start at zero and 0 pads the ragged last tile: both take part
    pad = np.zeros((1, 12), dtype)
    full = np.concatenate([x, pad])
    np.testing.assert_array_equal(hi, np.max(full, axis=0))
    np.testing.assert_array_equal(lo, np.min(full, axis=0))
    if dtype == jnp.float32:
        assert not np.signbit(hi[7]) and np.signbit(lo[7])
    ref_hi, ref_lo = _column_extremes.reference(jnp.asarray(x))
    np.testing.assert_array_equal(ref_hi, hi)
    np.testing.assert_array_equal(ref_lo, lo)


def test_atomics_need_a_supported_dtype():
    @jt.kernel
    def k(x):
        out = jt.empty((4,), jnp.float16)
        jt.grid(1)
        jt.atomic_add(out.at[0], x[...])
        return out

    with pytest.raises(jt.KernelError, match=r"atomic updates of float16 are not supported"):
        k.lower(jnp.ones((4,), jnp.float16))


@jt.kernel
def _row_sums_on_chip(x, *, rows=4):
    """Row sums accumulated with atomic_add into an on-chip tile, one column at a time."""
    n, m = x.shape
    out = jt.empty((n,), jnp.float32)
    r = jt.grid(jt.cdiv(n, rows))
    t = jt.fragment((rows, m), jnp.float32)
    acc = jt.fragment((rows,), jnp.float32)
    acc[...] = jnp.zeros((rows,), jnp.float32)
    jt.copy(x.at[r * rows, 0], t)

    @jt.loop(m)
    def _(j):
        jt.atomic_add(acc, t[:, j])   # a traced column of the tile value
    jt.copy(acc, out.at[r * rows])
    return out


def test_atomic_add_into_an_on_chip_tile(rng):
    x = jnp.asarray(rng.standard_normal((10, 7)), jnp.float32)
    expected = np.asarray(x, np.float64).sum(axis=1)
    np.testing.assert_allclose(jax.jit(_row_sums_on_chip)(x), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_row_sums_on_chip.reference(x), expected, rtol=1e-5, atol=1e-5)
