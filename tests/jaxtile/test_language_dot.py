"""``jnp.dot``/``@`` of tile values in kernel bodies: a gemm through on-chip tiles, with
transposed operands, inside loops, 16-bit operands accumulating in float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt


@jt.kernel
def _scores(q, k, v, *, bk=16):
    """o = sum over key blocks of (q @ k_blk.T) @ v_blk: two dots per iteration, one of them
    with a transposed operand, the first one's result cast to the second's operand dtype."""
    m, d = q.shape
    out = jt.empty((m, d), jnp.float32)
    jt.grid(1)
    qt = q[...]

    def step(j, acc):
        kb, vb = k[jt.ds(j * bk, bk), :], v[jt.ds(j * bk, bk), :]
        s = jnp.dot(qt, kb.T, preferred_element_type=jnp.float32)
        return acc + jnp.dot(s.astype(vb.dtype), vb, preferred_element_type=jnp.float32)
    out[...] = jax.lax.fori_loop(0, k.shape[0] // bk, step, jnp.zeros((m, d), jnp.float32))
    return out


@pytest.mark.parametrize("dtype", [jnp.float32, pytest.param(jnp.bfloat16, marks=pytest.mark.slow)],
                         ids=["f32", "bf16"])
def test_dot_of_tile_values(rng, kernel_backend, dtype):
    q, k, v = (jnp.asarray(rng.standard_normal(s) / 4, dtype)
               for s in ((24, 32), (48, 32), (48, 32)))
    want = sum(np.asarray(jnp.dot(jnp.dot(q, kb.T, preferred_element_type=jnp.float32)
                                  .astype(dtype), vb, preferred_element_type=jnp.float32))
               for kb, vb in zip(jnp.split(k, 3), jnp.split(v, 3)))
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == jnp.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    if kernel_backend != "cpu" and dtype == jnp.float32:
        tol = dict(rtol=2e-3, atol=2e-3)   # tf32 tensor cores, as jnp.dot's default
    np.testing.assert_allclose(jax.jit(_scores)(q, k, v), want, **tol)
    np.testing.assert_allclose(_scores.reference(q, k, v), want, **tol)
    f64 = [np.asarray(a, np.float64) for a in (q, k, v)]
    np.testing.assert_allclose(
        _scores(q, k, v), sum((f64[0] @ f64[1][i:i + 16].T) @ f64[2][i:i + 16]
                              for i in (0, 16, 32)), **{**tol, "atol": 5e-2})


def test_dot_of_3d_tiles_is_an_error():
    @jt.kernel
    def batched(x):
        out = jt.empty((2, 4, 4), jnp.float32)
        t = x[...]
        out[...] = jnp.einsum("bij,bjk->bik", t, t)
        return out

    with pytest.raises(jt.KernelError,
                       match="2-D tiles contracting one dimension.*test_language_dot"):
        batched(jnp.ones((2, 4, 4), jnp.float32))
