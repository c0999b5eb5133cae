"""Scalars read from inputs drive the kernel (what Pallas calls scalar prefetch): copy
origins, loop bounds and conditions from values such as sequence lengths, expert offsets
or page indices, out-of-range ones included."""

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt

ROWS = 4


@jt.kernel
def _gather_blocks(x, starts):
    """Output block b holds the ROWS rows of x that start at row starts[b] (past the end of
    x the copy reads zeros, as always)."""
    n_blocks = starts.shape[0]
    m = x.shape[1]
    out = jt.empty((n_blocks * ROWS, m), x.dtype)
    b = jt.grid(n_blocks)
    t = jt.fragment((ROWS, m), x.dtype)
    jt.copy(x.at[starts[b], 0], t)
    jt.copy(t, out.at[b * ROWS, 0])
    return out


def test_copy_origin_read_from_an_input(rng):
    x = jnp.asarray(rng.standard_normal((10, 6)), jnp.float32)
    starts = jnp.array([0, 7, 3, 9, -2, 100], jnp.int32)
    xp = np.asarray(x)
    expected = np.zeros((len(starts) * ROWS, 6), np.float32)
    for b, s in enumerate(np.asarray(starts)):
        for r in range(ROWS):
            if 0 <= s + r < 10:
                expected[b * ROWS + r] = xp[s + r]
    np.testing.assert_array_equal(jax.jit(_gather_blocks)(x, starts), expected)
    np.testing.assert_array_equal(_gather_blocks.reference(x, starts), expected)


@jt.kernel
def _masked_rows(x, lens):
    """Row r of the output is x's row r where r < lens[0] and -1 elsewhere: a condition on
    a value read from an input."""
    n, m = x.shape
    out = jt.empty((n, m), x.dtype)
    r = jt.grid(n)
    t = jt.fragment((1, m), x.dtype)
    t[...] = jnp.full((1, m), -1.0, x.dtype)

    @jt.when(r < lens[0])
    def _():
        jt.copy(x.at[r, 0], t)

    jt.copy(t, out.at[r, 0])
    return out


def test_condition_read_from_an_input(rng):
    x = jnp.asarray(rng.standard_normal((7, 5)), jnp.float32)
    for n_valid in (0, 3, 7, 50, -1):
        lens = jnp.array([n_valid], jnp.int32)
        expected = np.where(np.arange(7)[:, None] < n_valid, np.asarray(x), -1.0)
        np.testing.assert_array_equal(jax.jit(_masked_rows)(x, lens), expected)
        np.testing.assert_array_equal(_masked_rows.reference(x, lens), expected)
