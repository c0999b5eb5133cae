"""Gather and scatter of rows by an index tile (jt.gather, jt.scatter): embedding lookups,
MoE dispatch and combine; out-of-range rows read pad and their writes are dropped."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt

ROWS, COLS = 4, 8


@jt.kernel
def _embed(table, ids, *, pad=0.0):
    """out[i, :] = table[ids[i], :] (pad where ids[i] is out of range)."""
    n = ids.shape[0]
    d = table.shape[1]
    out = jt.empty((n, d), jnp.float32)
    bi, bj = jt.grid(jt.cdiv(n, ROWS), jt.cdiv(d, COLS))
    idx = jt.fragment((ROWS,), jnp.int32)
    jt.copy(ids.at[bi * ROWS], idx)
    rows = jt.fragment((ROWS, COLS), jnp.float32)
    jt.gather(table.at[:, jt.ds(bj * COLS, COLS)], idx[...], rows, pad=pad)
    jt.copy(rows, out.at[bi * ROWS, bj * COLS])
    return out


def _embed_reference(table, ids, pad):
    table, ids = np.asarray(table, np.float32), np.asarray(ids)
    out = np.full((len(ids), table.shape[1]), pad, np.float32)
    ok = (ids >= 0) & (ids < table.shape[0])
    out[ok] = table[ids[ok]]
    return out


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_embedding_lookup(rng, dtype):
    table = jnp.asarray(rng.standard_normal((11, 13)), dtype)   # ragged columns
    ids = jnp.array([3, 0, 10, 3, -1, 11, 7, 2, 5, 100], jnp.int32)  # ragged rows
    expected = _embed_reference(table, ids, -1.0)
    np.testing.assert_array_equal(jax.jit(lambda t, i: _embed(t, i, pad=-1.0))(table, ids),
                                  expected)
    np.testing.assert_array_equal(_embed.reference(table, ids, pad=-1.0), expected)


@jt.kernel
def _combine(x, dest, *, n_out=10):
    """out[dest[i], :] = x[i, :] (rows of out no index names stay 0; writes out of range
    are dropped)."""
    n, d = x.shape
    out = jt.empty((n_out, d), x.dtype)
    jt.grid(1)
    zero = jt.fragment((n_out, d), x.dtype)
    zero[...] = jnp.zeros((n_out, d), x.dtype)
    jt.copy(zero, out)
    tile = jt.fragment((n, d), x.dtype)
    jt.copy(x, tile)
    idx = jt.fragment((n,), jnp.int32)
    jt.copy(dest, idx)
    jt.scatter(tile, idx[...], out)
    return out


def test_scatter_rows(rng):
    x = jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)
    dest = jnp.array([9, 0, 4, -3, 12, 2], jnp.int32)
    expected = np.zeros((10, 5), np.float32)
    for i, r in enumerate(np.asarray(dest)):
        if 0 <= r < 10:
            expected[r] = np.asarray(x)[i]
    np.testing.assert_array_equal(jax.jit(_combine)(x, dest), expected)
    np.testing.assert_array_equal(_combine.reference(x, dest), expected)


def test_gather_index_tile_must_be_integers():
    @jt.kernel
    def k(table, ids):
        out = jt.empty((4, 8), table.dtype)
        jt.grid(1)
        idx = jt.fragment((4,), jnp.float32)
        jt.copy(ids, idx)
        rows = jt.fragment((4, 8), table.dtype)
        jt.gather(table, idx[...], rows)  # MARK
        jt.copy(rows, out)
        return out

    with pytest.raises(jt.KernelError, match=r"jt.gather: the index tile must hold integers"):
        k.lower(jnp.ones((6, 8)), jnp.ones(4))


def test_gather_tile_must_match():
    @jt.kernel
    def k(table, ids):
        out = jt.empty((4, 8), table.dtype)
        jt.grid(1)
        rows = jt.fragment((4, 6), table.dtype)
        jt.gather(table, ids[...], rows)
        jt.copy(rows, out.at[0, 0])
        return out

    with pytest.raises(jt.KernelError, match=r"shape mismatch: the source tile is \(4, 8\)"):
        k.lower(jnp.ones((6, 8)), jnp.ones(4, jnp.int32))


@jt.kernel
def _outer_gather(x, rows, cols):
    """out[i, j] = 2 * x[rows[i], cols[j]] for the positions in range, written back to the
    same positions of a zero output (writes out of range are dropped)."""
    m, n = rows.shape[0], cols.shape[0]
    out = jt.empty(x.shape, x.dtype)
    jt.grid(1)
    zero = jt.fragment(x.shape, x.dtype)
    zero[...] = jnp.zeros(x.shape, x.dtype)
    jt.copy(zero, out)
    r, c = jt.fragment((m,), jnp.int32), jt.fragment((n,), jnp.int32)
    jt.copy(rows, r)
    jt.copy(cols, c)
    tile = jt.fragment((m, n), x.dtype)
    jt.gather(x, (r[...], c[...]), tile, axis=(0, 1), pad=-1.0)
    tile[...] = 2 * tile[...]
    jt.scatter(tile, (r[...], c[...]), out, axis=(0, 1))
    return out


def test_gather_scatter_outer_product(rng, kernel_backend):
    """Several index tiles with several axes index an outer product of positions (what
    Pallas' x_ref.at[rows[:, None], cols[None, :]] reads)."""
    x = jnp.asarray(rng.standard_normal((7, 9)), jnp.float32)
    rows = jnp.array([6, 0, 7, 2], jnp.int32)        # 7 is past the end
    cols = jnp.array([1, 8, -1, 4, 3], jnp.int32)    # -1 too
    out = np.zeros((7, 9), np.float32)
    ok_r, ok_c = rows[rows < 7], cols[cols >= 0]
    out[np.ix_(ok_r, ok_c)] = 2 * np.asarray(x)[np.ix_(ok_r, ok_c)]
    np.testing.assert_array_equal(jax.jit(_outer_gather)(x, rows, cols), out)
    np.testing.assert_array_equal(_outer_gather.reference(x, rows, cols), out)


def test_gather_axes_must_match_index_tiles():
    @jt.kernel
    def bad(x, rows):
        out = jt.empty((4, 4), x.dtype)
        tile = jt.fragment((4, 4), x.dtype)
        jt.gather(x, (rows[...], rows[...]), tile, axis=0)
        jt.copy(tile, out)
        return out

    with pytest.raises(jt.KernelError, match="2 index tile.*1 axis"):
        bad(jnp.ones((4, 4)), jnp.arange(4, dtype=jnp.int32))
