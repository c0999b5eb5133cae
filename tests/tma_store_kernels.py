"""Kernels whose copies the TMA-store pass makes TMA stores on sm_90 on, shared by its tests
(``tests/compiler/gpu/test_tma_store.py``) and the emulator's
(``tests/emulator/test_hopper_tma_store.py``). (``tests/conftest.py`` puts this directory on
``sys.path``.)"""

import jax.numpy as jnp

import jaxtile as jt


@jt.kernel(threads=128)
def gemm_tma_epilogue(a, b, *, bm=64, bn=64, bk=32, stages=2):
    """``a @ b`` in float32, cast to ``a.dtype`` into a shared tile, then copied out whole:
    the copy a TMA store makes on sm_90 on."""
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), a.dtype)
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.pipelined(jt.cdiv(k, bk), stages=stages)
    def _(kk):
        jt.copy(a.at[by * bm, kk * bk], a_s)
        jt.copy(b.at[kk * bk, bx * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    c_s = jt.shared((bm, bn), a.dtype)
    jt.copy(acc, c_s)
    jt.copy(c_s, c.at[by * bm, bx * bn])
    return c


@jt.kernel(threads=128)
def two_tiles_through_one_buffer(x):
    """Two row blocks of ``x`` (negated) out through the same shared tile: the second fill
    must wait until the first store has read it."""
    n, m = x.shape
    out = jt.empty((n, m), x.dtype)
    s = jt.shared((16, m), x.dtype)
    for t in range(2):
        v = x[t * 16:(t + 1) * 16, :]
        s[...] = -v
        jt.copy(s, out.at[t * 16, 0])
    return out


@jt.kernel(threads=128)
def batched_rows(x, *, rows=16):
    """``x * 3`` for a 3-D ``x``, one (batch, row block) per block, out through a shared tile
    of ``rows`` rows: a 3-D TMA store (box ``[m, rows, 1]``), ragged when ``rows`` does not
    divide the rows."""
    b, n, m = x.shape
    out = jt.empty((b, n, m), x.dtype)
    t, i = jt.grid(jt.cdiv(n, rows), b)
    s = jt.shared((rows, m), x.dtype)
    v = jt.fragment((rows, m), x.dtype)
    jt.copy(x.at[i, t * rows, 0], v, pad=0)
    v[...] = v[...] * 3
    jt.copy(v, s)
    jt.copy(s, out.at[i, t * rows, 0])
    return out


@jt.kernel(threads=128)
def store_then_pipeline(x, y):
    """A tile stored, then a pipelined loop whose stages the plan may put on its bytes."""
    n, m = y.shape
    first = jt.empty((16, 64), x.dtype)
    sums = jt.empty((1, m), jnp.float32)
    s = jt.shared((16, 64), x.dtype)
    s[...] = x[...] + 1
    jt.copy(s, first.at[0, 0])
    t = jt.shared((16, m), y.dtype)
    acc = jt.fragment((1, m), jnp.float32)
    acc[...] = jnp.zeros((1, m), jnp.float32)

    @jt.pipelined(jt.cdiv(n, 16), stages=2)
    def _(k):
        jt.copy(y.at[k * 16, 0], t, pad=0)
        acc[...] = acc[...] + jnp.sum(t[...].astype(jnp.float32), axis=0, keepdims=True)

    jt.copy(acc, sums.at[0, 0])
    return first, sums
