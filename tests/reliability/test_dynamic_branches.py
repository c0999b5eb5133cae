"""A Python decision on a dynamic size is an error at the body's line, never a silent branch.

With ``dynamic={"x": 0}`` the compiled kernel comes from a trace in which ``x.shape[0]`` is
a JAX symbolic dimension. JAX answers an ``==`` it cannot decide with False and a truth test
with True, so ``if n % 8 == 0:`` took the same branch for every size, unlike the reference
semantics (traced with the concrete size), with no warning."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt


def _doubling_kernel(decide):
    """A kernel that doubles its input where ``decide(n)`` holds (a Python decision)."""
    @jt.kernel(dynamic={"x": 0})
    def k(x):
        n = x.shape[0]
        out = jt.empty((n,), x.dtype)
        t = jt.fragment((8,), x.dtype)
        i = jt.grid(jt.cdiv(n, 8))
        jt.copy(x.at[i * 8], t, pad=0)
        if decide(n):
            t[...] = t[...] * 2
        jt.copy(t, out.at[i * 8])
        return out
    return k


@pytest.mark.parametrize("decide, what", [
    (lambda n: n % 8 == 0, "mod(x_0, 8) == 0"),
    (lambda n: n == 16, "x_0 == 16"),
    (lambda n: n != 16, "x_0 == 16"),
    (lambda n: n % 8, "bool(mod(x_0, 8))"),
    (lambda n: n > 16, "JAX: Symbolic dimension comparison"),
    (lambda n: max(n, 16) == n, "JAX: Symbolic dimension comparison"),
], ids=["mod-eq", "eq", "ne", "truth", "gt", "max"])
def test_python_decision_on_a_dynamic_size_is_an_error(decide, what):
    k = _doubling_kernel(decide)
    with pytest.raises(jt.KernelError) as info:
        k(jnp.ones((16,), jnp.float32))
    msg = str(info.value)
    assert "a Python decision depends on a dynamic size" in msg and what in msg
    # The line of the decision: the lambda's, called from the body's `if`.
    assert f"{__file__}:" in msg and "jnp.where" in msg and "dynamic=" in msg


def test_decisions_jax_can_make_for_every_size_still_work():
    """``n >= 1`` and ``n == 0`` hold (or fail) for every size of a dimension."""
    k = _doubling_kernel(lambda n: n >= 1 and n != 0)
    x = jnp.arange(12, dtype=jnp.float32)
    np.testing.assert_array_equal(k(x), 2 * np.arange(12))


@jt.kernel(dynamic={"x": 0})
def _double_when_multiple_of_8(x):
    n = x.shape[0]
    out = jt.empty((n,), x.dtype)
    t = jt.fragment((8,), x.dtype)
    i = jt.grid(jt.cdiv(n, 8))
    jt.copy(x.at[i * 8], t, pad=0)
    t[...] = jnp.where(jnp.asarray(n) % 8 == 0, t[...] * 2, t[...])
    jt.copy(t, out.at[i * 8])
    return out


def test_the_device_side_decision_the_error_suggests():
    for n in (16, 12):
        x = jnp.arange(n, dtype=jnp.float32)
        want = np.arange(n) * (2 if n % 8 == 0 else 1)
        np.testing.assert_array_equal(_double_when_multiple_of_8(x), want)
        np.testing.assert_array_equal(_double_when_multiple_of_8.reference(x), want)
        np.testing.assert_array_equal(jnp.where(n % 8 == 0, 2 * x, x), want)


def test_export_with_a_symbolic_shape_is_a_clear_error():
    """It failed with JAX's raw InconclusiveDimensionOperation from the element-count
    check."""
    x = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b"), jnp.float32)
    with pytest.raises(jt.KernelError, match=r"argument 'x' has the symbolic shape \(b,\).*"
                       r"export one program per shape"):
        jax.export.export(jax.jit(_double_when_multiple_of_8),
                          disabled_checks=jt.export_checks())(x)
