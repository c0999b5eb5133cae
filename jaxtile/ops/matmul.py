"""Tiled matrix multiplication: a general `matmul` (transposes, backward rule) and a
matmul with a fused ReLU."""

from __future__ import annotations

import jax.numpy as jnp

import jaxtile as jt

from . import _checks


@jt.kernel(threads=128, sharding=jt.ShardRule("m k, k n -> m n", parallel="m n"))
def matmul_relu(a, b, *, bm=128, bn=128, bk=32, stages=3):
    """``relu(a @ b)`` accumulated in float32 and cast to ``a.dtype``; any M, N, K."""
    _check_operands("matmul_relu", a, b, False, False)
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


@jt.kernel(threads=128)
def matmul(a, b, *, transpose_a=False, transpose_b=False, bm=64, bn=64, bk=32, stages=2):
    """``op(a) @ op(b)`` for 2-D floating ``a`` and ``b`` of one dtype, where ``op``
    transposes when ``transpose_a``/``transpose_b`` is set. Accumulated in float32 and
    returned in ``a.dtype``; any M, N, K (edge tiles read zeros past the end and drop writes
    past it). Differentiable: its backward pass is two more ``matmul`` calls.

    >>> jt.ops.matmul(a, b, transpose_b=True)           # doctest: +SKIP  (a @ b.T)
    """
    _check_operands("matmul", a, b, transpose_a, transpose_b)
    m, k = a.shape[::-1] if transpose_a else a.shape
    n = b.shape[0] if transpose_b else b.shape[1]
    c = jt.empty((m, n), a.dtype)
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a_s = jt.shared((bk, bm) if transpose_a else (bm, bk), a.dtype)
    b_s = jt.shared((bn, bk) if transpose_b else (bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.pipelined(jt.cdiv(k, bk), stages=stages)
    def _(kk):
        jt.copy(a.at[kk * bk, by * bm] if transpose_a else a.at[by * bm, kk * bk], a_s)
        jt.copy(b.at[bx * bn, kk * bk] if transpose_b else b.at[kk * bk, bx * bn], b_s)
        jt.gemm(a_s, b_s, acc, transpose_a=transpose_a, transpose_b=transpose_b)

    jt.copy(acc, c.at[by * bm, bx * bn])
    return c


def _check_operands(op, a, b, transpose_a, transpose_b):
    _checks.rank(op, "a", a, 2)
    _checks.rank(op, "b", b, 2)
    _checks.same_dtype(op, a=a, b=b)
    m, k = a.shape[::-1] if transpose_a else a.shape
    k2, n = b.shape[::-1] if transpose_b else b.shape
    if k != k2:
        raise ValueError(f"{op}: contraction dimensions differ: op(a) has shape ({m}, {k}), "
                         f"op(b) has shape ({k2}, {n})")


def _matmul_fwd(a, b, **params):
    return matmul(a, b, **params), (a, b)


def _matmul_bwd(res, g, *, transpose_a, transpose_b, **tiles):
    """With ``A = op(a)``, ``B = op(b)`` and ``C = A @ B``: ``dA = g @ B.T`` and
    ``dB = A.T @ g``, each one ``matmul`` whose transposes undo ``op``."""
    a, b = res
    g = g.astype(a.dtype)
    if transpose_a:                       # a = A.T: da = dA.T = B @ g.T
        da = matmul(b, g, transpose_a=transpose_b, transpose_b=True, **tiles)
    else:                                 # da = g @ B.T
        da = matmul(g, b, transpose_b=not transpose_b, **tiles)
    if transpose_b:                       # b = B.T: db = dB.T = g.T @ A
        db = matmul(g, a, transpose_a=True, transpose_b=transpose_a, **tiles)
    else:                                 # db = A.T @ g
        db = matmul(a, g, transpose_a=not transpose_a, **tiles)
    return da.astype(a.dtype), db.astype(b.dtype)


def _matmul_jvp(args, c, tangents, **params):
    """``op(ta) @ op(b) + op(a) @ op(tb)``: two more ``matmul`` calls."""
    (a, b), (ta, tb) = args, tangents
    return (matmul(ta.astype(a.dtype), b, **params)
            + matmul(a, tb.astype(b.dtype), **params)).astype(c.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)
matmul.defjvp(_matmul_jvp)
