"""Findings 9 and 10: what the lowering cannot do is a KernelError naming the kernel and
the line, never a raw TVM error; zero-size buffers work; long fused chains compile."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler.errors import KernelError


def test_matmul_with_empty_contraction_is_zeros():
    a = jnp.ones((16, 0), jnp.float32)
    b = jnp.ones((0, 24), jnp.float32)
    got = jt.ops.matmul(a, b, bm=8, bn=8, bk=8)
    assert got.shape == (16, 24)
    np.testing.assert_array_equal(np.asarray(got), np.zeros((16, 24)))
    np.testing.assert_array_equal(np.asarray(jax.jit(jt.ops.matmul)(a, b)), np.zeros((16, 24)))


def test_vmap_over_an_empty_batch_is_empty():
    x = jnp.ones((0, 4, 40), jnp.float32)
    for f in (jax.vmap(jt.ops.softmax), jax.jit(jax.vmap(jt.ops.softmax))):
        got = f(x)
        assert got.shape == (0, 4, 40) and got.dtype == jnp.float32
    w = jnp.ones(40)
    got = jax.vmap(jt.ops.rms_norm, in_axes=(0, None))(x, w)
    assert got.shape == (0, 4, 40)


def test_a_grid_of_2_to_the_31_blocks_is_a_kernel_error_at_trace_time():
    @jt.kernel
    def wide(x):
        out = jt.empty(x.shape, x.dtype)
        jt.grid(1 << 16, 1 << 15)
        out[...] = x[...]
        return out

    with pytest.raises(KernelError, match=r"(?s)wide.*2147483648 blocks.*test_kernel_limits"):
        wide(jnp.ones(8, jnp.float32))


def test_a_fragment_of_2_to_the_31_elements_is_a_kernel_error_at_trace_time():
    @jt.kernel
    def big(x):
        out = jt.empty(x.shape, x.dtype)
        f = jt.fragment((1 << 16, 1 << 15), x.dtype)
        f[0, 0:8] = x[...]
        out[...] = f[0, 0:8]
        return out

    with pytest.raises(KernelError, match=r"(?s)big.*2147483648 elements.*test_kernel_limits"):
        big(jnp.ones(8, jnp.float32))


def test_compiler_failures_are_kernel_errors(monkeypatch):
    from jaxtile.compiler.cpu import lower

    def broken(kernel, target):
        raise RuntimeError("Check failed: (pb->value != 0) is false: Divide by zero\n"
                           "# from tvm.script import tir as T\n" + "x" * 5000)

    monkeypatch.setattr(lower, "compile_to_library", broken)

    @jt.kernel
    def doomed(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] + 41
        return out

    with pytest.raises(KernelError, match=r"(?s)doomed.*compiler failed.*test_kernel_limits") \
            as e:
        doomed(jnp.ones(8, jnp.float32))
    assert "tvm.script" not in str(e.value) and len(str(e.value)) < 1000


@pytest.mark.parametrize("length", [400, 1000])
def test_long_fused_chains_compile(length):
    @jt.kernel
    def chain(x):
        out = jt.empty(x.shape, x.dtype)
        v = x[...]
        for k in range(length):
            v = v * 1.0001 + 0.5 if k % 2 else v - 0.25
        out[...] = v
        return out

    x = jnp.linspace(-1, 1, 64, dtype=jnp.float32)
    want = np.asarray(x, np.float64)
    for k in range(length):
        want = want * 1.0001 + 0.5 if k % 2 else want - 0.25
    got = np.asarray(chain(x))
    np.testing.assert_allclose(got, want, rtol=1e-4)
    np.testing.assert_allclose(got, np.asarray(chain.reference(x)), rtol=1e-5)
