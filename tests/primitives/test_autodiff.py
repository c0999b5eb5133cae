"""grad/jvp/jacfwd/jacrev of kernels: with a user vjp rule and through reference semantics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxtile as jt


@jt.kernel
def scaled_tanh(x, *, block=64):
    """tanh(2x), elementwise over a 1-D array; no vjp rule: differentiated through its
    reference semantics."""
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, block))
    t = jt.fragment((block,), x.dtype)
    jt.copy(x.at[i * block], t)
    t[...] = jnp.tanh(2 * t[...])
    jt.copy(t, out.at[i * block])
    return out


@jt.kernel
def cube_and_square(x, *, block=64):
    """(x**3, x**2); its vjp rule reuses the saved square and calls another kernel."""
    (n,) = x.shape
    cube = jt.empty((n,), x.dtype)
    square = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, block))
    t = jt.fragment((block,), x.dtype)
    jt.copy(x.at[i * block], t)
    v = t[...]
    t[...] = v * v
    jt.copy(t, square.at[i * block])
    t[...] = v * v * v
    jt.copy(t, cube.at[i * block])
    return cube, square


bwd_calls = []


def _fwd(x, *, block):
    cube, square = cube_and_square(x, block=block)
    return (cube, square), (x, square)


def _bwd(res, cts, *, block):
    bwd_calls.append(block)
    x, square = res
    g_cube, g_square = cts
    # d/dx: 3 x^2 g_cube + 2 x g_square; the x^2 comes from the forward pass
    return (jt.ops.add(3 * square * g_cube, 2 * x * g_square, block=block),)


cube_and_square.defvjp(_fwd, _bwd)


def _loss(f):
    def loss(x):
        cube, square = f(x)
        return jnp.sum(jnp.sin(cube)) + jnp.sum(square * jnp.arange(x.shape[0]))
    return loss


def _jnp_cube_and_square(x):
    return x ** 3, x ** 2


X = jnp.linspace(-1.5, 1.2, 100, dtype=jnp.float32)


def test_grad_uses_the_user_rule():
    bwd_calls.clear()
    got = jax.jit(jax.grad(_loss(cube_and_square)))(X)
    np.testing.assert_allclose(got, jax.grad(_loss(_jnp_cube_and_square))(X), rtol=1e-5,
                               atol=1e-5)
    assert bwd_calls == [64]


@pytest.mark.parametrize("kernel,formula", [
    (scaled_tanh, lambda x: jnp.tanh(2 * x)),
    (lambda x: cube_and_square(x)[0], lambda x: x ** 3),
])
def test_jvp_jacfwd_jacrev(kernel, formula):
    t = jnp.cos(X)
    y, ty = jax.jvp(kernel, (X,), (t,))
    wy, wty = jax.jvp(formula, (X,), (t,))
    np.testing.assert_allclose(y, wy, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ty, wty, rtol=1e-5, atol=1e-5)
    small = X[:10]
    np.testing.assert_allclose(jax.jacfwd(kernel)(small), jax.jacfwd(formula)(small),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jacrev(kernel)(small), jax.jacrev(formula)(small),
                               rtol=1e-5, atol=1e-5)


def test_vmap_and_grad_compose_both_ways():
    xs = jnp.stack([X, -X, X * 0.5])
    loss, ref = _loss(cube_and_square), _loss(_jnp_cube_and_square)
    want = jax.vmap(jax.grad(ref))(xs)
    np.testing.assert_allclose(jax.vmap(jax.grad(loss))(xs), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(loss)))(xs), want, rtol=1e-5,
                               atol=1e-5)
    total = lambda f: lambda xs: jnp.sum(jax.vmap(f)(xs))  # noqa: E731
    np.testing.assert_allclose(jax.grad(total(loss))(xs), jax.grad(total(ref))(xs),
                               rtol=1e-5, atol=1e-5)


def test_second_order():
    f = lambda x: jnp.sum(scaled_tanh(x) ** 2)  # noqa: E731
    ref = lambda x: jnp.sum(jnp.tanh(2 * x) ** 2)  # noqa: E731
    small = X[:8]
    np.testing.assert_allclose(jax.hessian(f)(small), jax.hessian(ref)(small), rtol=1e-4,
                               atol=1e-5)
    g = jax.grad(lambda x: jnp.sum(jax.grad(_loss(cube_and_square))(x)))
    gr = jax.grad(lambda x: jnp.sum(jax.grad(_loss(_jnp_cube_and_square))(x)))
    np.testing.assert_allclose(g(X), gr(X), rtol=1e-4, atol=1e-4)


def test_check_grads():
    x = jnp.linspace(-0.8, 0.8, 40, dtype=jnp.float32)
    check_grads(lambda x: jnp.sum(scaled_tanh(x) ** 2), (x,), order=2, modes=("fwd", "rev"),
                eps=1e-2, atol=2e-2, rtol=2e-2)
    check_grads(lambda x: jnp.sum(cube_and_square(x)[0]), (x,), order=1,
                modes=("fwd", "rev"), eps=1e-2, atol=2e-2, rtol=2e-2)


def test_softmax_grad_matches_jnp():
    x = jax.random.normal(jax.random.key(0), (6, 50))
    w = jnp.arange(50.0)
    got = jax.jit(jax.grad(lambda x: jnp.sum(jt.ops.softmax(x) * w)))(x)
    want = jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, axis=-1) * w))(x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@jt.kernel
def count_positive(x):
    out = jt.empty(x.shape, jnp.int32)
    out[...] = (x[...] > 0).astype(jnp.int32)
    return out


def test_grad_of_an_integer_output_is_a_clear_error():
    with pytest.raises(TypeError, match="real-valued|int32"):
        jax.grad(lambda x: jnp.sum(count_positive(x)))(X)
    # Through a float loss, the integer output simply has no derivative.
    g = jax.grad(lambda x: jnp.sum(count_positive(x).astype(jnp.float32) * x))(X)
    np.testing.assert_allclose(g, (X > 0).astype(jnp.float32))
