"""Issue 19, point 14: ``lax.top_k`` (values and indices), ``jnp.argsort`` and ``lax.sort`` of
several operands on tile values, compiled for the CPU, against the kernel's reference
semantics, the jnp/lax call itself and an independent numpy formula. Sizes along the sorted
axis that are and are not powers of two (the sorting network pads to one)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from language_helpers import BF16, F32, I32, data

import jaxtile as jt

ROWS = 8


def _rows_kernel(fn):
    """A kernel applying ``fn`` (a tile -> two tiles) to 8-row tiles of x, writing both
    (results of fewer rows, from ``fn`` along axis 0, are stacked tile after tile)."""

    @jt.kernel(name="rows_pair")
    def k(x):
        n, m = x.shape
        a, b = jax.eval_shape(fn, jax.ShapeDtypeStruct((ROWS, m), x.dtype))
        rows = n if a.shape[0] == ROWS else n // ROWS * a.shape[0]
        out_a = jt.empty((rows, a.shape[1]), a.dtype)
        out_b = jt.empty((rows, b.shape[1]), b.dtype)
        r = jt.grid(jt.cdiv(n, ROWS))
        t = jt.fragment((ROWS, m), x.dtype)
        jt.copy(x.at[r * ROWS, 0], t)
        ta, tb = jt.fragment(a.shape, a.dtype), jt.fragment(b.shape, b.dtype)
        ta[...], tb[...] = fn(t[...])
        jt.copy(ta, out_a.at[r * a.shape[0], 0])
        jt.copy(tb, out_b.at[r * b.shape[0], 0])
        return out_a, out_b
    return k


def _total_key(x):
    """numpy: an int64 whose order is the IEEE total order of float ``x`` (what lax.top_k
    ranks by: -NaN < -inf < -0.0 < 0.0 < inf < NaN)."""
    if x.dtype.kind in "iu":
        return x.astype(np.int64)
    if x.dtype == np.float64:
        bits = x.view(np.int64)
        return np.where(bits < 0, bits ^ 0x7FFFFFFFFFFFFFFF, bits)
    bits = x.astype(np.float32).view(np.int32).astype(np.int64)
    return np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _np_top_k(x, k):
    idx = np.argsort(-_total_key(x), axis=1, kind="stable")[:, :k]
    return np.take_along_axis(x, idx, axis=1), idx.astype(np.int32)


def _edge_rows(x):
    if x.dtype != I32:
        x[0, [1, 4]] = np.nan
        x[0, 5] = -np.nan                      # a NaN with the sign bit: last of all
        x[1, :6] = [0.0, -0.0, 0.0, -0.0, 1.0, 1.0]
        x[2, [0, 3]] = [np.inf, -np.inf]
    x[3, :] = x[3, 0]                          # all tied: indices in order
    return x


def _assert_same(got, want, nan_signs=True):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind == "f" or want.dtype == BF16:
        got, want = got.astype(np.float32), want.astype(np.float32)
        signed = np.ones(want.shape, bool) if nan_signs else ~np.isnan(want)
        np.testing.assert_array_equal(np.signbit(got)[signed], np.signbit(want)[signed])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype,m,k", [(F32, 13, 5), (BF16, 16, 16), (I32, 9, 1)],
                         ids=["f32-ragged", "bf16-pow2-all", "i32-k1"])
def test_top_k_values_and_indices(rng, kernel_backend, dtype, m, k):
    x = jnp.asarray(_edge_rows(np.array(data(rng, (19, m), dtype))))
    kern = _rows_kernel(lambda v: lax.top_k(v, k))
    values, indices = jax.jit(kern)(x)
    want_v, want_i = _np_top_k(np.asarray(x), k)
    # The GPU's float -> bfloat16 conversion (cvt.rn.bf16.f32) makes every NaN the positive
    # canonical one, so on CUDA a -NaN keeps its place (and index) but not its sign.
    _assert_same(values, want_v, nan_signs=kernel_backend == "cpu" or dtype != BF16)
    _assert_same(indices, want_i)
    for got_v, got_i in (kern.reference(x), lax.top_k(x, k)):
        _assert_same(got_v, want_v)
        _assert_same(got_i, want_i)


def test_top_k_along_the_first_axis(rng):
    x = jnp.asarray(_edge_rows(np.array(data(rng, (16, 6), F32))))
    kern = _rows_kernel(lambda v: lax.top_k(v, 3, axis=0))
    values, indices = jax.jit(kern)(x)
    for tile in range(2):
        want_v, want_i = _np_top_k(np.asarray(x)[tile * ROWS:(tile + 1) * ROWS].T, 3)
        _assert_same(values[tile * 3:tile * 3 + 3], want_v.T)
        _assert_same(indices[tile * 3:tile * 3 + 3], want_i.T)
    ref_v, ref_i = kern.reference(x)
    _assert_same(values, ref_v)
    _assert_same(indices, ref_i)


@pytest.mark.parametrize("m,descending", [(12, False), (32, True)])
def test_argsort_is_stable_in_xla_order(rng, m, descending):
    x = jnp.asarray(_edge_rows(np.array(data(rng, (16, m), F32))))
    x = x.at[5].set(jnp.round(x[5]))                      # more ties
    kern = _rows_kernel(lambda v: (jnp.argsort(v, axis=1, descending=descending),
                                   jnp.sort(v, axis=1, descending=descending)))
    order, values = jax.jit(kern)(x)
    # numpy's stable sort puts every NaN last and keeps -0.0 and 0.0 in order: XLA's order.
    # Descending is jnp's: the reversed stable sort of the reversed row.
    xs = np.asarray(x)[:, ::-1] if descending else np.asarray(x)
    want = np.argsort(xs, axis=1, kind="stable")
    if descending:
        want = (m - 1 - want)[:, ::-1]
    _assert_same(order, want.astype(np.int32))
    # jnp.sort's descending order reverses the ascending one, ties included (unlike argsort).
    ascending = np.sort(np.asarray(x), axis=1, kind="stable")
    _assert_same(values, ascending[:, ::-1] if descending else ascending)
    ref_order, ref_values = kern.reference(x)
    _assert_same(order, ref_order)
    _assert_same(values, ref_values)


def test_sort_of_several_operands_by_two_keys(rng):
    def fn(v):
        major = jnp.floor(v * 2)                           # ties broken by the second key
        _, _, payload = lax.sort((major, -v, v * 10), dimension=1, num_keys=2)
        return lax.sort((major, jnp.abs(v)), dimension=1, num_keys=1)[1], payload

    x = jnp.asarray(_edge_rows(np.array(data(rng, (16, 11), F32, edges=False))))
    kern = _rows_kernel(fn)
    by_major, payload = jax.jit(kern)(x)
    xn = np.asarray(x)
    major = np.floor(xn * 2)
    want_payload = np.empty_like(xn)
    want_major = np.empty_like(xn)
    for i in range(16):
        want_payload[i] = (xn[i] * 10)[np.lexsort((-xn[i], major[i]))]
        want_major[i] = np.abs(xn[i])[np.argsort(major[i], kind="stable")]
    _assert_same(payload, want_payload)
    _assert_same(by_major, want_major)
    ref = kern.reference(x)
    _assert_same(by_major, ref[0])
    _assert_same(payload, ref[1])


def test_float64_keys(rng):
    # float64 keys are 64-bit integers (int64_t in CUDA's shared memory).
    @jt.kernel
    def sort_and_top(x):
        out = jt.empty(x.shape, x.dtype)
        idx = jt.empty((x.shape[0], 3), jnp.int32)
        jt.grid(1)
        t = jt.fragment(x.shape, x.dtype)
        ti = jt.fragment((x.shape[0], 3), jnp.int32)
        jt.copy(x.at[0, 0], t)
        ti[...] = lax.top_k(t[...], 3)[1]
        t[...] = jnp.sort(t[...], axis=1)
        jt.copy(t, out.at[0, 0])
        jt.copy(ti, idx.at[0, 0])
        return out, idx

    with jax.enable_x64(True):
        x = rng.integers(-3, 3, (4, 11)).astype(np.float64)
        x[0, [1, 5]] = np.nan
        x[1, [2, 3]] = [-0.0, 0.0]
        x[2, 4] = -np.nan
        values, indices = jax.jit(sort_and_top)(jnp.asarray(x))
        _assert_same(values, np.sort(x, axis=1, kind="stable"))
        _assert_same(indices, _np_top_k(x, 3)[1])
        ref_v, ref_i = sort_and_top.reference(jnp.asarray(x))
        _assert_same(values, ref_v)
        _assert_same(indices, ref_i)
