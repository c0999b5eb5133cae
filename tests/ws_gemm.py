"""The warp-specialised GEMM the sm_90a tests share (importable from every test, as
``gemm_kernels.py`` is): an ordinary tile kernel (128 x 256 x 64
tiles over 256 threads, two consumer warpgroups; the compiler adds the producer)."""

import jax.numpy as jnp

import jaxtile as jt


@jt.kernel(threads=256)
def ws_gemm(a, b, *, bm=128, bn=256, bk=64, stages=2, warp_specialize=None):
    """``a @ b`` accumulated in float32, returned in ``a.dtype``; any M, N, K whose rows are
    16-byte multiples (TMA), others fall back to cp.async."""
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), a.dtype)
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.pipelined(jt.cdiv(k, bk), stages=stages, warp_specialize=warp_specialize)
    def _(kk):
        jt.copy(a.at[by * bm, kk * bk], a_s)
        jt.copy(b.at[kk * bk, bx * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    jt.copy(acc, c.at[by * bm, bx * bn])
    return c
