"""Row-wise tiles run one row at a time on the CPU (``compiler/cpu/rows.py``): what is and
is not run so, and the results on shapes the row tiles do and do not divide, in three
dtypes, against the reference semantics and a numpy formula."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from language_helpers import BF16, F16, F32, check, data

import jaxtile as jt

ROW_LOOP = re.compile(r"for row\d+ in range\((\d+)\)")
TOL = {F32: {"rtol": 2e-5, "atol": 1e-6}, BF16: {"rtol": 2 ** -7, "atol": 1e-2},
       F16: {"rtol": 2 ** -10, "atol": 1e-3}}


@jt.kernel
def softmax(x, *, rows=8):
    out = jt.empty(x.shape, x.dtype)
    i = jt.grid(jt.cdiv(x.shape[0], rows))
    t = jt.fragment((rows, x.shape[1]), jnp.float32)
    jt.copy(x.at[i * rows, 0], t)
    v = t[...]
    e = jnp.exp(v - jnp.max(v, axis=1, keepdims=True))
    t[...] = e / jnp.sum(e, axis=1, keepdims=True)
    jt.copy(t, out.at[i * rows, 0])
    return out


@jt.kernel
def centred_norm(x, w, *, rows=4):
    """The centred rows go through a second fragment, stored and read back in the loop."""
    n = x.shape[1]
    out = jt.empty(x.shape, x.dtype)
    i = jt.grid(jt.cdiv(x.shape[0], rows))
    t = jt.fragment((rows, n), jnp.float32)
    c = jt.fragment((rows, n), jnp.float32)
    w_t = jt.fragment((n,), jnp.float32)
    jt.copy(x.at[i * rows, 0], t)
    jt.copy(w, w_t)
    v = t[...]
    c[...] = v - jnp.mean(v, axis=1, keepdims=True)
    d = c[...]
    t[...] = d * jax.lax.rsqrt(jnp.mean(d * d, axis=1, keepdims=True) + 1e-5) * w_t[...]
    jt.copy(t, out.at[i * rows, 0])
    return out


@jt.kernel
def cross_entropy(logits, labels, *, rows=8):
    n = logits.shape[1]
    loss = jt.empty((logits.shape[0],), jnp.float32)
    i = jt.grid(jt.cdiv(logits.shape[0], rows))
    t = jt.fragment((rows, n), jnp.float32)
    lab = jt.fragment((rows,), jnp.int32)
    out = jt.fragment((rows,), jnp.float32)
    jt.copy(logits.at[i * rows, 0], t)
    jt.copy(labels.at[i * rows], lab)
    v = t[...]
    m = jnp.max(v, axis=1, keepdims=True)
    logp = v - m - jnp.log(jnp.sum(jnp.exp(v - m), axis=1, keepdims=True))
    cols = jax.lax.broadcasted_iota(jnp.int32, (rows, n), 1)
    out[...] = -jnp.sum(jnp.where(cols == lab[...][:, None], logp, 0.0), axis=1)
    jt.copy(out, loss.at[i * rows])
    return loss


@jt.kernel
def column_centre(x, *, rows=8):
    """Mixes the rows of a tile (a mean over axis 0): must not run row by row."""
    out = jt.empty(x.shape, x.dtype)
    i = jt.grid(jt.cdiv(x.shape[0], rows))
    t = jt.fragment((rows, x.shape[1]), jnp.float32)
    jt.copy(x.at[i * rows, 0], t)
    v = t[...]
    s = v * 2.0
    t[...] = s - jnp.mean(s, axis=0, keepdims=True)
    jt.copy(t, out.at[i * rows, 0])
    return out


def _np_softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _row_loops(lowered):
    return [int(n) for n in ROW_LOOP.findall(lowered.source)]


@pytest.mark.parametrize("shape", [(37, 200), (32, 128)], ids=["ragged", "even"])
@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
def test_softmax_runs_row_by_row(rng, shape, dtype):
    x = data(rng, shape, dtype, edges=False)
    assert _row_loops(softmax.lower(x)) == [8]
    want = _np_softmax(x).astype(dtype)
    check(softmax, [x], want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
def test_norm_through_a_second_fragment_runs_row_by_row(rng, dtype):
    x = data(rng, (37, 96), dtype, edges=False)
    w = data(rng, (96,), dtype, edges=False)
    assert _row_loops(centred_norm.lower(x, w)) == [4]
    xf, wf = np.asarray(x, np.float64), np.asarray(w, np.float64)
    c = xf - xf.mean(axis=1, keepdims=True)
    want = (c / np.sqrt((c * c).mean(axis=1, keepdims=True) + 1e-5) * wf).astype(dtype)
    check(centred_norm, [x, w], want, **TOL[dtype])


@pytest.mark.parametrize("rows", [4, 8])
def test_cross_entropy_runs_row_by_row(rng, rows):
    logits = data(rng, (45, 300), F32, edges=False) * 3
    labels = jnp.asarray(rng.integers(0, 300, 45), jnp.int32)
    assert _row_loops(cross_entropy.lower(logits, labels, rows=rows)) == [rows]
    lf = np.asarray(logits, np.float64)
    logp = lf - lf.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    want = (-logp[np.arange(45), np.asarray(labels)]).astype(np.float32)
    check(cross_entropy, [logits, labels], want, {"rows": rows}, rtol=1e-5, atol=1e-5)


def test_special_values_stay_in_their_row(rng):
    """NaN and inf in one row reach that row's outputs only."""
    x = np.array(data(rng, (16, 64), F32, edges=False))
    x[3, 5], x[9, 0], x[9, 1] = np.nan, np.inf, -np.inf
    x = jnp.asarray(x)
    got = np.asarray(jax.jit(softmax)(x))
    with np.errstate(invalid="ignore"):
        want = _np_softmax(x).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[3]).all() and np.isnan(got[9]).all()
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=2e-5, atol=1e-6)


def test_rows_mixed_by_a_reduction_over_them_are_not_split(rng):
    x = data(rng, (37, 64), F32, edges=False)
    assert _row_loops(column_centre.lower(x)) == []
    xf = np.asarray(x, np.float64) * 2.0
    want = np.empty_like(xf)
    for start in range(0, 37, 8):
        tile = xf[start:start + 8]
        # The last tile is padded with zeros to 8 rows before the mean (copy's pad).
        want[start:start + 8] = tile - tile.sum(axis=0, keepdims=True) / 8
    check(column_centre, [x], want.astype(np.float32), rtol=1e-5, atol=1e-5)


@jt.kernel
def centre_and_max(x, *, rows=8):
    """The row maxima are read again after the row-by-row statements (in a loop, outside the
    forwarded segment): their array must keep every row."""
    out = jt.empty(x.shape, x.dtype)
    peak = jt.empty((x.shape[0],), jnp.float32)
    i = jt.grid(jt.cdiv(x.shape[0], rows))
    t = jt.fragment((rows, x.shape[1]), jnp.float32)
    o = jt.fragment((rows,), jnp.float32)
    jt.copy(x.at[i * rows, 0], t)
    v = t[...]
    m = jnp.max(v, axis=1)
    t[...] = v - m[:, None]
    jt.copy(t, out.at[i * rows, 0])

    @jt.loop(1)
    def _(k):
        o[...] = m * 2.0
        jt.copy(o, peak.at[i * rows])

    return out, peak


def test_values_read_after_the_rows_keep_all_rows(rng):
    x = data(rng, (37, 80), F32, edges=False)
    assert _row_loops(centre_and_max.lower(x)) == [8]
    xf = np.asarray(x, np.float64)
    m = xf.max(axis=1)
    want = ((xf - m[:, None]).astype(np.float32), (2 * m).astype(np.float32))
    check(centre_and_max, [x], want, rtol=1e-6, atol=1e-6)


@jt.kernel
def twice_exp(x, *, block=64):
    """1-D tiles with a materialised value: they keep their vector loop (no row loop)."""
    out = jt.empty(x.shape, x.dtype)
    i = jt.grid(jt.cdiv(x.shape[0], block))
    t = jt.fragment((block,), jnp.float32)
    jt.copy(x.at[i * block], t)
    e = jnp.exp(t[...])
    t[...] = e * e + e
    jt.copy(t, out.at[i * block])
    return out


def test_one_dimensional_tiles_are_not_split(rng):
    x = data(rng, (200,), F32, edges=False)
    assert _row_loops(twice_exp.lower(x)) == []
    xf = np.exp(np.asarray(x, np.float64))
    check(twice_exp, [x], (xf * xf + xf).astype(np.float32), rtol=1e-6, atol=1e-6)
