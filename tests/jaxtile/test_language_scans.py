"""Scans (jnp.cumsum, cumprod, lax.cummax, cummin, forward and reverse) and arg-reductions
(jnp.argmax, argmin) on tile values, compiled, against the reference semantics and numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from language_helpers import BF16, F16, F32, I32, data

import jaxtile as jt

ROWS = 8


def _row_tile_kernel(fn, out_dtype=None):
    """A kernel applying ``fn`` to 8-row tiles of x (whole rows), writing rows of the
    result (of the tile's or ``out_dtype``'s shape)."""

    @jt.kernel(name=f"rows_{fn.__name__}")
    def k(x):
        n, m = x.shape
        probe = jax.eval_shape(fn, jax.ShapeDtypeStruct((ROWS, m), x.dtype))
        out = jt.empty((n, *probe.shape[1:]), out_dtype or probe.dtype)
        r = jt.grid(jt.cdiv(n, ROWS))
        t = jt.fragment((ROWS, m), x.dtype)
        jt.copy(x.at[r * ROWS, 0], t)
        res = jt.fragment(probe.shape, probe.dtype)
        res[...] = fn(t[...])
        jt.copy(res, out.at[r * ROWS, *([0] * (len(probe.shape) - 1))])
        return out
    return k


def cumsum1(v):
    return jnp.cumsum(v, axis=1, dtype=v.dtype)


def cumsum0(v):
    return jnp.cumsum(v, axis=0, dtype=v.dtype)


def cumprod1r(v):
    return lax.cumprod(v, axis=1, reverse=True)


def cummax1(v):
    return lax.cummax(v, axis=1)


def cummin0r(v):
    return lax.cummin(v, axis=0, reverse=True)


def _np_scan(x, fn, axis, reverse, rows):
    """numpy's running reductions over each 8-row tile (axis 0 stays inside a tile)."""
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[fn]
    out = np.empty_like(x)
    for i in range(0, x.shape[0], rows):
        tile = x[i:i + rows]
        if axis == 0 and tile.shape[0] < rows:
            tile = np.concatenate([tile, np.zeros((rows - tile.shape[0], *tile.shape[1:]),
                                                  tile.dtype)])
        t = np.flip(tile, axis) if reverse else tile
        acc = ufunc.accumulate(t, axis=axis)
        acc = np.flip(acc, axis) if reverse else acc
        out[i:i + rows] = acc[:min(rows, x.shape[0] - i)]
    return out


SCANS = [(cumsum1, "sum", 1, False), (cumsum0, "sum", 0, False), (cumprod1r, "prod", 1, True),
         (cummax1, "max", 1, False), (cummin0r, "min", 0, True)]


@pytest.mark.parametrize("fn,kind,axis,reverse", SCANS, ids=[s[0].__name__ for s in SCANS])
@pytest.mark.parametrize("dtype", [F32, I32, BF16], ids=["f32", "i32", "bf16"])
def test_scans(rng, fn, kind, axis, reverse, dtype):
    scale = 1.1 if kind == "prod" else 2.0
    x = data(rng, (13, 12), dtype, scale=scale, edges=kind in ("max", "min"))
    if kind == "prod" and dtype == I32:
        x = jnp.asarray(rng.integers(-2, 3, size=(13, 12)), jnp.int32)
    k = _row_tile_kernel(fn)
    got = np.asarray(jax.jit(k)(x))
    ref = np.asarray(k.reference(x))
    if dtype == BF16:
        # rounded to bfloat16 after every step; XLA may combine in another order
        expected = _np_scan(np.asarray(x, np.float64), kind, axis, reverse, ROWS)
        for result in (got, ref):
            np.testing.assert_allclose(result.astype(np.float64), expected, rtol=0.05,
                                       atol=0.02)
        return
    expected = _np_scan(np.asarray(x), kind, axis, reverse, ROWS)
    tol = {"rtol": 2e-6, "atol": 1e-5} if dtype == F32 else {"rtol": 0, "atol": 0}
    np.testing.assert_allclose(got, expected, **tol)
    np.testing.assert_allclose(ref, expected, **tol)


def argmax1(v):
    return jnp.argmax(v, axis=1)


def argmin1(v):
    return jnp.argmin(v, axis=1)


@pytest.mark.parametrize("fn", [argmax1, argmin1])
@pytest.mark.parametrize("dtype", [F32, F16, I32], ids=["f32", "f16", "i32"])
def test_arg_reductions_take_the_first_extreme_and_nan(rng, fn, dtype):
    x = np.array(data(rng, (11, 9), dtype))
    if dtype != I32:
        x[0, [2, 5]] = np.nan          # the first NaN wins
        x[1, :] = 1.0                  # ties: the first index
        x[2, [3, 7]] = np.inf if fn is argmax1 else -np.inf
    else:
        x[1, :] = 7
    k = _row_tile_kernel(fn)
    expected = (np.argmax if fn is argmax1 else np.argmin)(x, axis=1)
    np.testing.assert_array_equal(jax.jit(k)(jnp.asarray(x)), expected)
    np.testing.assert_array_equal(k.reference(jnp.asarray(x)), expected)
    np.testing.assert_array_equal(jax.jit(fn)(jnp.asarray(x)), expected)


def test_scan_ir_names_its_axis():
    text = _row_tile_kernel(cummin0r).lower(jnp.ones((8, 4))).tile_ir
    assert "scan(" in text and "axis=0" in text and "fn='min'" in text and "reverse=True" in text


def sort1(v):
    return jnp.sort(v, axis=1)


def sort0(v):
    return jnp.sort(v, axis=0)


def _np_sort_tiles(x, axis, rows):
    """numpy's stable sort of each 8-row tile (the partial last tile padded with zeros)."""
    out = np.empty_like(x)
    for i in range(0, x.shape[0], rows):
        tile = x[i:i + rows]
        if axis == 0 and tile.shape[0] < rows:
            tile = np.concatenate([tile, np.zeros((rows - tile.shape[0], *tile.shape[1:]),
                                                  tile.dtype)])
        # (numpy cannot sort bfloat16 by value: sort the exact float32 values)
        wide = tile.astype(np.float32) if tile.dtype == BF16 else tile
        done = np.sort(wide, axis=axis, kind="stable").astype(tile.dtype)
        out[i:i + rows] = done[:min(rows, x.shape[0] - i)]
    return out


@pytest.mark.parametrize("fn,axis", [(sort1, 1), (sort0, 0)], ids=["axis1", "axis0"])
@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=["f32", "bf16", "i32"])
def test_sort_in_xla_order(rng, fn, axis, dtype):
    x = np.array(data(rng, (13, 12), dtype))
    if dtype != I32:
        x[3, [1, 6]] = np.nan          # NaNs sort last
        x[4, [2, 5]] = [0.0, -0.0]     # equal: a stable sort keeps their order
        x[4, 9] = 0.0
    else:
        x[5, :] = 3                    # ties
    k = _row_tile_kernel(fn)
    expected = _np_sort_tiles(x, axis, ROWS)
    if dtype == BF16:   # (numpy compares bfloat16 NaNs as unequal)
        expected = expected.astype(np.float32)
    for got in (np.asarray(jax.jit(k)(jnp.asarray(x))), np.asarray(k.reference(jnp.asarray(x)))):
        got = got.astype(expected.dtype)
        np.testing.assert_array_equal(got, expected)
        if dtype != I32:
            np.testing.assert_array_equal(np.signbit(got.astype(np.float32)),
                                          np.signbit(expected.astype(np.float32)))
