"""The tile language on the CPU: reductions, broadcasting, iota, transposes, reshapes.

Shared helpers and the testing approach: ``language_helpers``.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from language_helpers import (
    APPROX,
    BF16,
    EVEN,
    F16,
    F32,
    I32,
    RAGGED,
    _is_float,
    check,
    check_fns,
    data,
    put,
    whole,
)

import jaxtile as jt

# --- reductions ----------------------------------------------------------------------------

def _reducers(names, axes=((0, False), (0, True), (1, False), (1, True), (None, False),
                            (None, True))):
    fns = {}
    for name in names:
        for axis, keep in axes:
            fn = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min}[name]
            fns[f"{name}-{axis}-{keep}"] = functools.partial(fn, axis=axis, keepdims=keep)
    return fns


def test_reductions_sum_f32(rng):
    """Sums over axis 0, axis 1 and all axes, with and without keepdims (0-d outputs too)."""
    x = put(data(rng, (6, 37), F32, edges=False), (4, 3), np.inf)
    check_fns(whole, [x], _reducers(["sum"]), {"rtol": 2e-6, "atol": 1e-5})


def test_reductions_max_min_f32(rng):
    """max/min with NaN (propagates), +-inf, -0.0 and huge values."""
    x = data(rng, (6, 37), F32)
    x = put(x, 5, np.abs(np.asarray(x)[5]))           # one NaN-free row and column
    x = put(x, (slice(None), 36), np.arange(6, dtype=F32))
    x = put(x, (5, 36), -np.inf)
    fns = _reducers(["max"])
    fns.update(_reducers(["min"], axes=((0, True), (1, False), (None, False))))
    check_fns(whole, [x], fns, {})


@pytest.mark.parametrize("dtype", [BF16, F16, I32], ids=["bf16", "f16", "i32"])
def test_reductions_other_dtypes(rng, dtype):
    x = data(rng, (6, 37), dtype, edges=False)
    if _is_float(dtype):
        x = put(put(x, (0, 0), np.nan), (1, 3), -np.inf)
    fns = {"sum-1": functools.partial(jnp.sum, axis=1, keepdims=True),
           "max-0": functools.partial(jnp.max, axis=0, keepdims=True),
           "min-1": functools.partial(jnp.min, axis=1)}
    tol = {} if dtype == I32 else {"rtol": APPROX[dtype]["rtol"], "atol": 1e-3}
    check_fns(whole, [x], fns, tol)


def _prod_rows(v):
    return jnp.prod(v, axis=1)


def _any_all(v):
    return jnp.any(v > 1.0, axis=0) & ~jnp.all(v < 1.5, axis=0)


def _mean_var(v):
    mu = jnp.mean(v, axis=1, keepdims=True)
    return jnp.mean((v - mu) ** 2, axis=1)


def test_more_reductions(rng):
    x = jnp.asarray(rng.uniform(0.5, 1.6, (5, 24)).astype(F32))
    check_fns(whole, [x], {"prod": _prod_rows, "any_all": _any_all, "var": _mean_var},
              {"rtol": 2e-6, "atol": 1e-6})


# --- broadcasting, iota, transposes, reshapes ----------------------------------------------

@jt.kernel
def broadcasts(x, c, r, s, *, rows=8):
    """(rows,1), (1,cols) and scalar operands against a (rows, cols) tile."""
    m, n = x.shape
    out = jt.empty((m, n), x.dtype)
    i = jt.grid(jt.cdiv(m, rows))
    t = jt.fragment((rows, n), x.dtype)
    ct = jt.fragment((rows, 1), c.dtype)
    jt.copy(x.at[i * rows, 0], t)
    jt.copy(c.at[i * rows, 0], ct)
    v = t[...]
    w = (v - ct[...]) * r[...] + s[0]
    w = w - 2 * jnp.max(v, axis=1, keepdims=True) + jnp.sum(v, axis=0, keepdims=True) / 4
    t[...] = w * 0.5 + 1
    jt.copy(t, out.at[i * rows, 0])
    return out


def _broadcasts_formula(x, c, r, s, rows):
    """The same computation in float64 numpy (rounded once to x's dtype at the end)."""
    x, c, r, s = (np.asarray(a, np.float64) for a in (x, c, r, s))
    m, n = x.shape
    nb = -(-m // rows)
    # The tile's zero padding joins the column sum: pad, then work on (blocks, rows, n).
    full = np.pad(x, ((0, nb * rows - m), (0, 0))).reshape(nb, rows, n)
    cv = np.pad(c, ((0, nb * rows - m), (0, 0))).reshape(nb, rows, 1)
    w = (full - cv) * r + s[0]
    w = w - 2 * np.max(full, axis=2, keepdims=True) + np.sum(full, axis=1, keepdims=True) / 4
    return (w * 0.5 + 1).reshape(nb * rows, n)[:m]


@pytest.mark.parametrize("dtype,m", [(F32, 13), (BF16, 16)], ids=["f32-13", "bf16-16"])
def test_broadcasting(rng, dtype, m):
    n = 20
    x = data(rng, (m, n), dtype, edges=False)
    c = data(rng, (m, 1), dtype, edges=False)
    r = data(rng, (1, n), dtype, edges=False)
    s = data(rng, (1,), dtype, edges=False)
    want = _broadcasts_formula(x, c, r, s, 8).astype(dtype)
    tol = {"rtol": 1e-5, "atol": 1e-4} if dtype == F32 else {"rtol": 2e-2, "atol": 0.1}
    check(broadcasts, [x, c, r, s], want, **tol)


@jt.kernel
def causal(x, *, bm=8, bn=16, offset=0):
    """A causal mask from broadcasted_iota: x where col <= row + offset, else -inf; then the
    row-wise masked softmax of each tile."""
    m, n = x.shape
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    t = jt.fragment((bm, bn), jnp.float32)
    jt.copy(x.at[by * bm, bx * bn], t)
    row = lax.broadcasted_iota(jnp.int32, (bm, bn), 0) + by * bm
    col = lax.broadcasted_iota(jnp.int32, (bm, bn), 1) + bx * bn
    masked = jnp.where(col <= row + offset, t[...], -jnp.inf)
    out = jt.empty((m, n), x.dtype)
    probs = jt.empty((m, n), jnp.float32)
    t[...] = masked
    jt.copy(t, out.at[by * bm, bx * bn])
    mx = jnp.max(masked, axis=1, keepdims=True)
    e = jnp.exp(masked - jnp.where(jnp.isneginf(mx), 0.0, mx))
    t[...] = e / jnp.maximum(jnp.sum(e, axis=1, keepdims=True), 1e-30)
    jt.copy(t, probs.at[by * bm, bx * bn])
    return out, probs


@pytest.mark.parametrize("shape,offset", [((13, 37), 5)], ids=["ragged"])
def test_iota_causal_mask(rng, shape, offset):
    x = data(rng, shape, F32, edges=False)
    m, n = shape
    keep = jnp.arange(n)[None, :] <= jnp.arange(m)[:, None] + offset
    masked = jnp.where(keep, x, -jnp.inf)
    # The softmax is per (8, 16) tile, and the tile's padding (zeros) joins it where the
    # mask keeps it: compute it on the padded array, tile by tile.
    gm, gn = -(-m // 8), -(-n // 16)
    xp = jnp.pad(x, ((0, gm * 8 - m), (0, gn * 16 - n)))
    keep_p = jnp.arange(gn * 16)[None, :] <= jnp.arange(gm * 8)[:, None] + offset
    tiles = jnp.where(keep_p, xp, -jnp.inf).reshape(gm, 8, gn, 16)
    mx = jnp.max(tiles, axis=3, keepdims=True)
    e = jnp.exp(tiles - jnp.where(jnp.isneginf(mx), 0.0, mx))
    p = e / jnp.maximum(jnp.sum(e, axis=3, keepdims=True), 1e-30)
    probs = p.reshape(gm * 8, gn * 16)[:m, :n]
    check(causal, [x], (masked, probs), {"offset": offset}, rtol=2e-6, atol=1e-7)


@jt.kernel
def transpose_tiles(x, *, bm=8, bn=16):
    """out = x.T, one (bm, bn) tile at a time."""
    m, n = x.shape
    out = jt.empty((n, m), x.dtype)
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    t = jt.fragment((bm, bn), x.dtype)
    jt.copy(x.at[by * bm, bx * bn], t)
    tt = jt.shared((bn, bm), x.dtype)
    tt[...] = t[...].T
    jt.copy(tt, out.at[bx * bn, by * bm])
    return out


@pytest.mark.parametrize("shape,dtype", [(RAGGED, F32), (EVEN, BF16)],
                         ids=["ragged-f32", "even-bf16"])
def test_transpose(rng, shape, dtype):
    x = data(rng, shape, dtype)
    check(transpose_tiles, [x], x.T, signed_zeros=True)


def _reshape_a(v):
    return v.reshape(v.shape[1], v.shape[0])


def _reshape_b(v):
    return v.reshape(-1).reshape(2, -1) * 2


def _group_sum(v):
    return v.reshape(v.shape[0], -1, 4).sum(axis=-1)


def _transpose_3d(v):
    return jnp.transpose(v.reshape(2, v.shape[0] // 2, -1), (1, 2, 0)).reshape(v.shape[0] // 2, -1)


def _sum_3d_axes(v):
    return jnp.max(v.reshape(2, 3, 8), axis=(0, 2)) + jnp.sum(v.reshape(2, 3, 8), axis=(0, 2))


def test_reshapes(rng):
    x = data(rng, (6, 8), F32, edges=False)
    check_fns(whole, [x], {"swap_dims": _reshape_a, "flatten": _reshape_b,
                           "group_sum": _group_sum, "transpose_3d": _transpose_3d,
                           "reduce_3d": _sum_3d_axes},
              {"rtol": 1e-6})
