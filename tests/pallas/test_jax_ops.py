"""JAX's Pallas GPU kernels, unmodified but for their two Pallas imports, compiled by jaxtile
and compared with their modules' own reference functions (``jax.nn.softmax`` for softmax)
and an independent jnp formula, on shapes that are not powers of two."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_ops import load, primitives

TOL = dict(rtol=2e-5, atol=2e-5)


def _compiled_by_jaxtile(f, *args):
    names = primitives(jax.make_jaxpr(f)(*args).jaxpr)
    assert "jaxtile_kernel_call" in names and "pallas_call" not in names, names


def test_softmax(rng, backend):
    softmax = load("softmax").softmax
    x = jnp.asarray(rng.standard_normal((3, 5, 100)) * 4, jnp.float32)
    y = softmax(x)
    np.testing.assert_allclose(y, jax.nn.softmax(x, axis=-1), **TOL)
    e = np.exp(np.asarray(x, np.float64) - np.asarray(x).max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), **TOL)
    _compiled_by_jaxtile(softmax, x)


def _norm_inputs(rng, n=200):
    x = jnp.asarray(rng.standard_normal((2, 3, n)) + 1.5, jnp.float32)
    w = jnp.asarray(rng.standard_normal(n), jnp.float32)
    b = jnp.asarray(rng.standard_normal(n), jnp.float32)
    do = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    return x, w, b, do


def _jnp_layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * w + b


def _jnp_rms_norm(x, w, b, eps=1e-5):
    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * w + b


_NORMS = [("layer_norm", _jnp_layer_norm), ("rms_norm", _jnp_rms_norm)]


@pytest.mark.parametrize("name, formula", _NORMS)
def test_norm_forward(rng, backend, name, formula):
    module = load(name)
    f, reference = getattr(module, name), getattr(module, f"{name}_reference")
    x, w, b, _ = _norm_inputs(rng)
    np.testing.assert_allclose(f(x, w, b), reference(x, w, b), **TOL)
    np.testing.assert_allclose(f(x, w, b), formula(x, w, b), **TOL)
    _compiled_by_jaxtile(f, x, w, b)


@pytest.mark.slow
@pytest.mark.parametrize("name, formula", _NORMS)
def test_norm_backward(rng, backend, name, formula):
    """The backward kernels through the module's custom_vjp: dx per row, dw and db reduced
    over rows by a grid over column blocks (2-D masked loads of an outer product of rows
    and columns)."""
    module = load(name)
    f, reference = getattr(module, name), getattr(module, f"{name}_reference")
    x, w, b, do = _norm_inputs(rng)

    def loss(g):
        return lambda x, w, b: (g(x, w, b) * do).sum()
    grads = jax.grad(loss(f), argnums=(0, 1, 2))(x, w, b)
    for got, want, indep in zip(grads, jax.grad(loss(reference), argnums=(0, 1, 2))(x, w, b),
                                jax.grad(loss(formula), argnums=(0, 1, 2))(x, w, b)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got, indep, rtol=1e-4, atol=1e-4)
    _compiled_by_jaxtile(jax.grad(loss(f)), x, w, b)
