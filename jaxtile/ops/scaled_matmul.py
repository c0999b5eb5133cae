"""FP8 matrix multiply with per-tensor scales: the scale semantics of jaxtile's 8-bit floats.

The products of two 8-bit floats are exact in float32 and summed there (``jt.gemm`` into a
float32 accumulator); the scales multiply that float32 sum, once, before the result is
converted to ``out_dtype``. That is ``jnp.dot(a.astype(f32), b.astype(f32)) * (scale_a *
scale_b)`` up to the order of the sum.
"""

import jax.numpy as jnp

import jaxtile as jt

from . import _checks


@jt.kernel(threads=128)
def scaled_matmul_kernel(a, b, scales, *, out_dtype, transpose_b=False, bm=64, bn=64, bk=32,
                         stages=2):
    """``(a @ op(b)) * scales[0] * scales[1]`` for 2-D ``a`` and ``b`` of one dtype (float8
    or any float; ``b`` stored ``[N, K]`` when ``transpose_b``), ``scales`` a float32 vector
    of 2; accumulated in float32, returned in ``out_dtype``; any M, N, K."""
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    c = jt.empty((M, N), out_dtype)
    bx, by = jt.grid(jt.cdiv(N, bn), jt.cdiv(M, bm))
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bn, bk) if transpose_b else (bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.pipelined(jt.cdiv(K, bk), stages=stages)
    def _(k):
        jt.copy(a.at[by * bm, k * bk], a_s)
        if transpose_b:
            jt.copy(b.at[bx * bn, k * bk], b_s)
        else:
            jt.copy(b.at[k * bk, bx * bn], b_s)
        jt.gemm(a_s, b_s, acc, transpose_b=transpose_b)

    # one float32 product of the two scales, applied to the float32 sum
    acc[...] = acc[...] * (scales[0] * scales[1])
    out = jt.fragment((bm, bn), out_dtype)
    out[...] = acc[...].astype(out_dtype)
    jt.copy(out, c.at[by * bm, bx * bn])
    return c


def scaled_matmul(a, b, scale_a, scale_b, *, out_dtype=jnp.float32, transpose_b=False,
                  **tiles):
    """``(a @ b) * scale_a * scale_b`` for 2-D ``a`` and ``b`` of one dtype, typically
    ``float8_e4m3fn`` or ``float8_e5m2``, with per-tensor scales (scalars, or arrays of one
    element): the products are summed in float32 and the scales applied to that float32
    result, which is returned converted to ``out_dtype``. ``transpose_b``: ``b`` is stored
    ``[N, K]`` (``a @ b.T``), the K-major operand FP8 ``wgmma`` reads on ``cuda:sm_90a``
    (with ``b`` stored ``[K, N]`` the gemm stays on multiply-adds there).

    >>> jt.ops.scaled_matmul(a8, b8, sa, sb)   # doctest: +SKIP
    """
    _checks.rank("scaled_matmul", "a", a, 2)
    _checks.rank("scaled_matmul", "b", b, 2)
    _checks.same_dtype("scaled_matmul", a=a, b=b)
    if a.shape[1] != b.shape[1 if transpose_b else 0]:
        raise ValueError(f"scaled_matmul: contraction dimensions differ: a has shape "
                         f"{a.shape}, b has shape {b.shape}")
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if jnp.size(s) != 1:
            raise ValueError(f"scaled_matmul: {name} is a per-tensor scale (one element), "
                             f"got shape {jnp.shape(s)}")
    scales = jnp.stack([jnp.ravel(jnp.asarray(s, jnp.float32))[0] for s in (scale_a, scale_b)])
    return scaled_matmul_kernel(a, b, scales, out_dtype=jnp.dtype(out_dtype),
                                transpose_b=transpose_b, **tiles)
