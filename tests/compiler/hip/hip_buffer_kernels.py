"""Kernels whose global reads are masked at a buffer's end, at an interior edge, or with a
pad other than zero: shared by the lowering tests of the buffer-loads pass
(tests/compiler/hip/test_hip_buffer_loads.py) and their emulator runs
(tests/emulator/test_hip_emulator_buffer_loads.py)."""

import jax.numpy as jnp

import jaxtile as jt


@jt.kernel(threads=64)
def tail_affine(x, *, block=256):
    """1-D: ``2x + 1``, the last block reading past the end (into a fragment)."""
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, block))
    t = jt.fragment((block,), x.dtype)
    jt.copy(x.at[i * block], t)
    t[...] = t[...] * 2 + 1
    jt.copy(t, out.at[i * block])
    return out


@jt.kernel(threads=64)
def last_rows(x, *, bm=16, bn=64, pad=0):
    """2-D through LDS: the tile's rows past the last one read ``pad``; the output holds the
    tile's rows summed, so a row past the end that read anything but ``pad`` shows."""
    m, n = x.shape
    out = jt.empty((jt.cdiv(m, bm), n), jnp.float32)
    i, j = jt.grid(jt.cdiv(m, bm), n // bn)
    s = jt.shared((bm, bn), x.dtype)
    jt.copy(x.at[i * bm, j * bn], s, pad=pad)
    f = jt.fragment((bm, bn), jnp.float32)
    f[...] = s[...].astype(jnp.float32)
    c = jt.fragment((bn,), jnp.float32)
    c[...] = jnp.sum(f[...], axis=0)
    jt.copy(c, out.at[i, j * bn])
    return out


def last_rows_ref(x, bm=16, pad=0):
    m, n = x.shape
    rows = -(-m // bm) * bm
    padded = jnp.full((rows, n), pad, jnp.float32).at[:m].set(x.astype(jnp.float32))
    return padded.reshape(rows // bm, bm, n).sum(axis=1)


@jt.kernel(threads=64)
def ragged_row_sums(x, *, bm=8, bn=128):
    """2-D through LDS with a column edge (an interior edge: the next row follows in
    memory): each row's sum over a tile wider than the row."""
    m, n = x.shape
    out = jt.empty((m,), jnp.float32)
    i = jt.grid(jt.cdiv(m, bm))
    s = jt.shared((bm, bn), x.dtype)
    jt.copy(x.at[i * bm, 0], s, pad=0)
    f = jt.fragment((bm, bn), jnp.float32)
    f[...] = s[...].astype(jnp.float32)
    r = jt.fragment((bm,), jnp.float32)
    r[...] = jnp.sum(f[...], axis=1)
    jt.copy(r, out.at[i * bm])
    return out
