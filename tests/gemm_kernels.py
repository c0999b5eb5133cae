"""The tile-language GEMMs several test files run, declared once. (Importable from every test:
``tests/conftest.py`` puts this directory on ``sys.path``, as pytest does for a conftest.)

Tests that look at a GEMM's lowering (its IR, plan, registers) keep their own kernel where
they need a different body; these are the ones that were copies of each other."""

import jax.numpy as jnp

import jaxtile as jt


@jt.kernel
def matmul(a, b, *, bm=16, bn=32, bk=8, pad_b=None):
    """C (float32) = A @ B[:K] for K = A's columns, one (bm, bn) tile a block, K in steps of
    ``bk`` through shared tiles: a plain ``jt.loop`` (the CPU backend's shape of a GEMM).
    ``pad_b``: what B's copies read past its end (zero by default)."""
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
        jt.copy(b.at[kk * bk, j * bn], b_s, pad=pad_b)
        jt.gemm(a_s, b_s, acc)

    jt.copy(acc, c.at[i * bm, j * bn])
    return c


@jt.kernel
def transposed_matmul(a, b, *, bm=16, bn=32, bk=8, ta=False, tb=False):
    """C (float32) = op(A) @ op(B), ``op`` transposing where ``ta``/``tb`` is set: the
    bfloat16 GEMM tests' kernel (the CPU's transposed panel copies)."""
    m = a.shape[1] if ta else a.shape[0]
    k = a.shape[0] if ta else a.shape[1]
    n = b.shape[0] if tb else b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    j, i = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a_s = jt.shared((bk, bm) if ta else (bm, bk), a.dtype)
    b_s = jt.shared((bn, bk) if tb else (bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.loop(jt.cdiv(k, bk))
    def _(kk):
        jt.copy(a.at[kk * bk, i * bm] if ta else a.at[i * bm, kk * bk], a_s)
        jt.copy(b.at[j * bn, kk * bk] if tb else b.at[kk * bk, j * bn], b_s)
        jt.gemm(a_s, b_s, acc, transpose_a=ta, transpose_b=tb)

    jt.copy(acc, c.at[i * bm, j * bn])
    return c


@jt.kernel(threads=128)
def pipelined_gemm(a, b, *, bm=128, bn=128, bk=32, stages=3):
    """The same GEMM as a GPU writes it: 128 threads, the K loop ``jt.pipelined`` over
    ``stages`` shared-memory stages (cp.async on CUDA). The default tiles are issue 11's
    (128 x 128 x 32, 3 stages), whose ptxas figures the CUDA tests and benchmarks check."""
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
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

    jt.copy(acc, c.at[by * bm, bx * bn])
    return c
