"""Adjacent blocks of elementwise kernels run row by row together on the CPU
(``compiler/cpu/block_groups.py``): which kernels are grouped and by how much, and their
results on shapes the tiles do and do not divide, in three dtypes, for whole calls and for
block ranges that start and end inside a group, against the reference semantics and a
numpy formula."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from language_helpers import BF16, F16, F32, aligned, check, data

import jaxtile as jt
from jaxtile import _ffi

GROUP_LOOP = re.compile(r"for (?:q\d+ in range\((\d+)\)|row\d+, q\d+ in T\.grid\(\d+, (\d+)\))")
"""The loop over a group's blocks (printed with the row loop around it as one ``T.grid``
where no test for the group's edges separates them)."""
TOL = {F32: {"rtol": 2e-6, "atol": 1e-6}, BF16: {"rtol": 2 ** -7, "atol": 1e-2},
       F16: {"rtol": 2 ** -10, "atol": 1e-3}}


@jt.kernel
def bias_tanh(x, b, *, bm=16, bn=32):
    out = jt.empty(x.shape, x.dtype)
    j, i = jt.grid(jt.cdiv(x.shape[1], bn), jt.cdiv(x.shape[0], bm))
    x_t = jt.fragment((bm, bn), jnp.float32)
    b_t = jt.fragment((bn,), jnp.float32)
    jt.copy(x.at[i * bm, j * bn], x_t)
    jt.copy(b.at[j * bn], b_t)
    x_t[...] = jnp.tanh(x_t[...] + b_t[...][None, :]) * 2.0
    jt.copy(x_t, out.at[i * bm, j * bn])
    return out


@jt.kernel
def bias_tanh_rows_fastest(x, b, *, bm=16, bn=32):
    """The same with the row blocks on the grid's fastest axis: neighbours are not side by
    side, so nothing is grouped."""
    out = jt.empty(x.shape, x.dtype)
    i, j = jt.grid(jt.cdiv(x.shape[0], bm), jt.cdiv(x.shape[1], bn))
    x_t = jt.fragment((bm, bn), jnp.float32)
    b_t = jt.fragment((bn,), jnp.float32)
    jt.copy(x.at[i * bm, j * bn], x_t)
    jt.copy(b.at[j * bn], b_t)
    x_t[...] = jnp.tanh(x_t[...] + b_t[...][None, :]) * 2.0
    jt.copy(x_t, out.at[i * bm, j * bn])
    return out


@jt.kernel
def add_column_index(x, *, bm=8, bn=32):
    """Uses the block index in arithmetic (the global column number): not grouped."""
    out = jt.empty(x.shape, x.dtype)
    j, i = jt.grid(jt.cdiv(x.shape[1], bn), jt.cdiv(x.shape[0], bm))
    t = jt.fragment((bm, bn), jnp.float32)
    jt.copy(x.at[i * bm, j * bn], t)
    cols = jax.lax.broadcasted_iota(jnp.int32, (bm, bn), 1) + j * bn
    t[...] = t[...] + cols.astype(jnp.float32)
    jt.copy(t, out.at[i * bm, j * bn])
    return out


@jt.kernel
def row_sums(x, *, bm=8, bn=32):
    """A reduction over each tile row, written per block: grouped, each block summing its
    own columns."""
    out = jt.empty((x.shape[0], x.shape[1] // bn), jnp.float32)
    j, i = jt.grid(x.shape[1] // bn, jt.cdiv(x.shape[0], bm))
    t = jt.fragment((bm, bn), jnp.float32)
    s = jt.fragment((bm, 1), jnp.float32)
    jt.copy(x.at[i * bm, j * bn], t)
    s[...] = jnp.sum(t[...], axis=1, keepdims=True)
    jt.copy(s, out.at[i * bm, j])
    return out


def _np_bias_tanh(x, b):
    return np.tanh(np.asarray(x, np.float64) + np.asarray(b, np.float64)) * 2.0


def _groups(lowered):
    return [int(a or b) for a, b in GROUP_LOOP.findall(lowered.source)]


def test_narrow_tiles_are_grouped_up_to_a_page():
    x, b = jnp.zeros((64, 1024), F32), jnp.zeros((1024,), F32)
    # 32 columns of float32 are 128 bytes: 32 blocks make a 4 KiB run.
    assert _groups(bias_tanh.lower(x, b)) == [32]
    assert _groups(bias_tanh.lower(x, b, bn=256)) == [4]
    # Rows of a page already: nothing to gain.
    assert _groups(bias_tanh.lower(x, b, bn=1024)) == []
    # The group divides the grid's fastest axis (5 blocks of 32 columns).
    assert _groups(bias_tanh.lower(jnp.zeros((64, 160), F32), jnp.zeros((160,), F32))) == [5]


def test_kernels_whose_neighbours_are_not_side_by_side_are_not_grouped():
    x, b = jnp.zeros((64, 256), F32), jnp.zeros((256,), F32)
    assert _groups(bias_tanh_rows_fastest.lower(x, b)) == []
    assert _groups(add_column_index.lower(x)) == []


@pytest.mark.parametrize("shape", [(37, 200), (64, 256)], ids=["ragged", "even"])
@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
def test_grouped_results(rng, shape, dtype):
    x = data(rng, shape, dtype)
    b = data(rng, shape[1:], dtype, edges=False)
    assert _groups(bias_tanh.lower(x, b))
    want = _np_bias_tanh(x, b).astype(dtype)
    check(bias_tanh, [x, b], want, **TOL[dtype])


def test_column_index_kernel_results(rng):
    x = data(rng, (24, 96), F32)
    want = np.asarray(x, np.float64) + np.arange(96)[None, :]
    check(add_column_index, [x], want.astype(np.float32), rtol=1e-6, atol=1e-6)


def test_grouped_row_reductions(rng):
    x = data(rng, (40, 256), F32, edges=False)
    assert _groups(row_sums.lower(x)) == [8]
    want = np.asarray(x, np.float64).reshape(40, 8, 32).sum(axis=2)
    check(row_sums, [x], want.astype(np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("begin,end", [(3, 13), (0, 16), (5, 7), (8, 16), (0, 1)])
def test_block_ranges_inside_groups(rng, begin, end):
    """A call's range starting or ending inside a group (the runtime splits the grid among
    threads anywhere): blocks outside it are untouched, blocks inside it are right."""
    x = np.asarray(data(rng, (32, 256), F32))
    b = np.asarray(data(rng, (256,), F32, edges=False))
    lowered = bias_tanh.lower(x, b, bm=16, bn=32)   # grid (8, 2): groups of 8
    assert _groups(lowered) == [8]
    jax.block_until_ready(jax.jit(lambda x, b: bias_tanh(x, b, bm=16, bn=32))(x, b))
    out = aligned(np.full((32, 256), -7.0, np.float32))
    _ffi.call_kernel(lowered.key, [aligned(x), aligned(b), out], begin, end)
    want = np.full((32, 256), -7.0, np.float32)
    full = _np_bias_tanh(x, b).astype(np.float32)
    for blk in range(begin, end):
        j, i = blk % 8, blk // 8
        want[i * 16:(i + 1) * 16, j * 32:(j + 1) * 32] = full[i * 16:(i + 1) * 16,
                                                              j * 32:(j + 1) * 32]
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)
