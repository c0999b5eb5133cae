"""Ragged edges of GEMMs (``compiler/passes/gemm_edges.py``): gemms whose accumulator is
copied to an output past its edge compute only the rows and columns that land inside.

The analysis is checked on the IR (which gemms get a bound, and which kernels are left
alone), and the results on ragged shapes against numpy, the reference semantics, and
bitwise against the same kernel on inputs zero-padded to whole tiles (where no tile is
cut, so every row and column is computed): the rows that reach the output must come out
exactly as when all of them are computed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemm_kernels import matmul
from language_helpers import BF16, F32, check, data

import jaxtile as jt
from jaxtile.compiler import build, ir
from jaxtile.compiler.passes.gemm_edges import trim_edge_gemms
from jaxtile.compiler.target import parse_target


@jt.kernel
def matmul_bias_relu(a, b, bias, *, bm=16, bn=32, bk=8):
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    j, i = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    bias_t = jt.fragment((bn,), jnp.float32)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.loop(jt.cdiv(k, bk))
    def _(kk):
        jt.copy(a.at[i * bm, kk * bk], a_s)
        jt.copy(b.at[kk * bk, j * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    jt.copy(bias.at[j * bn], bias_t)
    acc[...] = jnp.maximum(acc[...] + bias_t[...][None, :], 0.0)
    jt.copy(acc, c.at[i * bm, j * bn])
    return c


@jt.kernel
def matmul_and_row_sums(a, b, *, bm=16, bn=32, bk=8, twice=False, transposed=False):
    """The accumulator also feeds a reduction (or a second copy, or a transpose): rows
    past the edge reach an output through it, so nothing may be left out."""
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    j, i = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.loop(jt.cdiv(k, bk))
    def _(kk):
        jt.copy(a.at[i * bm, kk * bk], a_s)
        jt.copy(b.at[kk * bk, j * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    jt.copy(acc, c.at[i * bm, j * bn])
    if transposed:
        t = jt.fragment((bn, bm), jnp.float32)
        t[...] = acc[...].T
        ct = jt.empty((n, m), jnp.float32)
        jt.copy(t, ct.at[j * bn, i * bm])
        return c, ct
    if twice:
        again = jt.empty((m, n), jnp.float32)
        jt.copy(acc, again.at[i * bm, j * bn])
        return c, again
    total = jt.empty((jt.cdiv(n, bn), jt.cdiv(m, bm)), jnp.float32)
    s = jt.fragment((1, 1), jnp.float32)
    s[...] = jnp.sum(acc[...]).reshape(1, 1)
    jt.copy(s, total.at[j, i])
    return c, total


def _gemm_notes(kernel, *args, **params):
    lowered = build.lowered_ir(kernel.lower(*args, **params).kernel, parse_target("cpu"))
    return [s.notes.get("live") for s in ir.walk(lowered.body)
            if isinstance(s, ir.Op) and s.kind == "gemm"]


def test_only_the_ragged_axes_get_a_bound():
    z = jnp.zeros
    # K = 5000: panels over the whole-K budget, so 256-deep ones and a remainder.
    both = _gemm_notes(matmul_bias_relu, z((37, 5000)), z((5000, 45)), z((45,)))
    assert len(both) == 2                               # a panel and the remainder panel
    assert all(rows is not None and cols is not None for rows, cols in both)
    assert both[0] == both[1]                           # one bound per accumulator
    rows_only = _gemm_notes(matmul_bias_relu, z((37, 64)), z((64, 64)), z((64,)))
    assert all(rows is not None and cols is None for rows, cols in rows_only)
    assert _gemm_notes(matmul_bias_relu, z((32, 64)), z((64, 64)), z((64,))) == [None]


@pytest.mark.parametrize("params", [{}, {"twice": True}, {"transposed": True}],
                         ids=["reduced", "copied_twice", "transposed"])
def test_an_accumulator_used_otherwise_is_left_whole(rng, params):
    a = data(rng, (37, 29), F32, edges=False)
    b = data(rng, (29, 45), F32, edges=False)
    assert _gemm_notes(matmul_and_row_sums, a, b, **params) == [None]
    got = jax.jit(lambda a, b: matmul_and_row_sums(a, b, **params))(a, b)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    np.testing.assert_allclose(np.asarray(got[0]), exact, rtol=1e-5, atol=1e-4)
    if not params:
        padded = np.zeros((48, 64))
        padded[:37, :45] = exact
        want = padded.reshape(3, 16, 2, 32).sum(axis=(1, 3)).T
        np.testing.assert_allclose(np.asarray(got[1]), want, rtol=1e-5, atol=1e-3)


def test_the_pass_leaves_a_kernel_without_ragged_gemms_unchanged():
    z = jnp.zeros
    kernel = build.lowered_ir(matmul_bias_relu.lower(z((32, 64)), z((64, 64)), z((64,))).kernel,
                              parse_target("cpu"))
    assert trim_edge_gemms(kernel) is kernel


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("mkn, tiles", [
    ((37, 29, 45), dict(bm=16, bn=32, bk=8)),        # both edges ragged, odd K
    ((70, 300, 33), dict(bm=64, bn=16, bk=32)),      # several panels, one column past
    ((5, 16, 130), dict(bm=16, bn=64, bk=16)),       # fewer rows than one tile
    ((37, 29, 93), dict(bm=16, bn=40, bk=8)),        # 40 = 32 + 8 columns of tiles
], ids=["ragged", "panels", "thin", "width40"])
def test_ragged_gemm_matches_whole_tiles_bitwise(rng, dtype, mkn, tiles):
    m, k, n = mkn
    a = data(rng, (m, k), dtype, edges=False)
    b = data(rng, (k, n), dtype, edges=False)
    bias = data(rng, (n,), F32, edges=False)
    exact = np.maximum(np.asarray(a, np.float64) @ np.asarray(b, np.float64)
                       + np.asarray(bias, np.float64), 0)
    got = check(matmul_bias_relu, [a, b, bias], exact.astype(np.float32), tiles,
                rtol=2e-5, atol=2e-4)
    # The same kernel on zero-padded inputs: no tile is cut, nothing is left out.
    mp, np_ = -(-m // tiles["bm"]) * tiles["bm"], -(-n // tiles["bn"]) * tiles["bn"]
    padded = [_pad(a, (mp, k)), _pad(b, (k, np_)), _pad(bias, (np_,))]
    assert set(_gemm_notes(matmul_bias_relu, *padded, **tiles)) == {None}
    assert None not in _gemm_notes(matmul_bias_relu, a, b, bias, **tiles)
    whole = jax.jit(lambda *x: matmul_bias_relu(*x, **tiles))(*padded)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(whole)[:m, :n])


def _pad(x, shape):
    """``x`` with zeros after it to ``shape``."""
    return jnp.zeros(shape, x.dtype).at[tuple(slice(0, d) for d in x.shape)].set(x)


# --- the contraction: K past both operands' ends ------------------------------------------
# ``matmul`` (tests/gemm_kernels.py) computes A @ B[:K] for K = A's columns: B may have more
# rows than A has columns, and its panel then holds real values where A's holds pads.

def _k_notes(kernel, *args, **params):
    lowered = build.lowered_ir(kernel.lower(*args, **params).kernel, parse_target("cpu"))
    return [s.notes.get("live_k") for s in ir.walk(lowered.body)
            if isinstance(s, ir.Op) and s.kind == "gemm"]


def test_a_ragged_contraction_gets_a_bound_only_where_both_operands_pad():
    z = jnp.zeros
    # K = 29 in 8-deep steps: the last panel runs 3 past the end of both operands.
    assert None not in _k_notes(matmul_bias_relu, z((37, 29)), z((29, 45)), z((45,)))
    assert None not in _k_notes(matmul, z((37, 29)), z((29, 45)))
    # b is deeper than a: its panel holds values where a's holds pads, still a bound (the
    # larger of the two ends), unless b fills the whole 32-deep panel ...
    assert None not in _k_notes(matmul, z((37, 29)), z((31, 45)))
    assert _k_notes(matmul, z((37, 29)), z((32, 45))) == [None]
    # ... but a pad that is not zero multiplies into the sum: no bound.
    assert _k_notes(matmul, z((37, 29)), z((29, 45)), pad_b=1.0) == [None]
    # K a multiple of the panel with static starts: nothing to leave out.
    assert _k_notes(matmul, z((16, 32)), z((32, 32)), bm=16, bn=32, bk=32) == [None]


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("mkn, tiles", [
    ((37, 29, 45), dict(bm=16, bn=32, bk=8)),        # one panel, 3 columns past K
    ((70, 900, 33), dict(bm=64, bn=16, bk=64)),      # the quickstart's K: 60 past it
    ((40, 5000, 40), dict(bm=16, bn=32, bk=64)),     # 256-deep panels and a remainder
], ids=["small", "k900", "panels"])
def test_a_ragged_contraction_matches_zero_padded_inputs_bitwise(rng, dtype, mkn, tiles):
    m, k, n = mkn
    a = data(rng, (m, k), dtype, edges=False)
    b = data(rng, (k, n), dtype, edges=False)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    got = check(matmul, [a, b], exact.astype(np.float32), tiles,
                rtol=2e-5, atol=5e-4 * np.sqrt(k))
    # K padded with zeros to whole steps: the kernel reads them all and adds the same
    # products, plus zeros, in the same order.
    kp = -(-k // tiles["bk"]) * tiles["bk"]
    whole = jax.jit(lambda *x: matmul(*x, **tiles))(_pad(a, (m, kp)), _pad(b, (kp, n)))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(whole))


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_values_past_one_operands_end_still_multiply_the_others_pads(rng, dtype):
    """b deeper than a: past a's end its pads (zeros) meet b's values, and ``0 * inf`` is
    NaN. Those products must still be computed (the bound is the larger end)."""
    m, k, n = 20, 29, 40
    a = data(rng, (m, k), dtype, edges=False)
    b = np.array(data(rng, (k + 2, n), dtype, edges=False), np.float32)
    b[k, 5] = np.inf             # rows k, k + 1: inside b, past a's end, in the last step
    b[k + 1, 7] = np.nan         # (32 deep: its last row pads both, and is left out)
    b = jnp.asarray(b, dtype)
    assert None not in _k_notes(matmul, a, b)
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)[:k]
    want[:, [5, 7]] = np.nan     # 0 * inf and 0 * nan, in every row
    got = check(matmul, [a, b], want.astype(np.float32), dict(bm=16, bn=32, bk=8),
                rtol=2e-5, atol=2e-3)
    assert np.isnan(np.asarray(got)[:, [5, 7]]).all()
