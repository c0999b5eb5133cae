"""Tiled matrix multiplication with a fused ReLU."""

from __future__ import annotations

import jax.numpy as jnp

import jaxtile as jt


@jt.kernel(threads=128)
def matmul_relu(a, b, *, bm=128, bn=128, bk=32, stages=3):
    """``relu(a @ b)`` accumulated in float32 and cast to ``a.dtype``; any M, N, K."""
    M, K = a.shape
    N = b.shape[1]
    c = jt.empty((M, N), a.dtype)
    bx, by = jt.grid(jt.cdiv(N, bn), jt.cdiv(M, bm))

    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.pipelined(jt.cdiv(K, bk), stages=stages)
    def _(k):
        jt.copy(a.at[by * bm, k * bk], a_s)
        jt.copy(b.at[k * bk, bx * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    acc[...] = jnp.maximum(acc[...], 0)
    jt.copy(acc, c.at[by * bm, bx * bn])
    return c
