"""The converter from traced bodies to Tile IR (compiler/from_jaxpr.py)."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import from_jaxpr, operations_doc


@jt.kernel
def _wrapped_math(x, *, wrap="checkpoint"):
    out = jt.empty(x.shape, x.dtype)
    jt.grid(1)

    def f(v):
        return jnp.sin(v) * 2 + jnp.exp(-v)

    wrapped = {"checkpoint": jax.checkpoint(f), "jit": jax.jit(f),
               "custom_jvp": jax.custom_jvp(f)}[wrap]
    if wrap == "custom_jvp":
        wrapped.defjvp(lambda p, t: (f(*p), t[0]))
    out[...] = wrapped(x[...])
    return out


@pytest.mark.parametrize("wrap", ["checkpoint", "jit", "custom_jvp"])
def test_call_like_primitives_are_inlined(wrap):
    x = jnp.linspace(-2, 2, 24, dtype=jnp.float32).reshape(3, 8)
    expected = np.sin(np.asarray(x, np.float64)) * 2 + np.exp(-np.asarray(x, np.float64))
    np.testing.assert_allclose(jax.jit(lambda v: _wrapped_math(v, wrap=wrap))(x), expected,
                               rtol=1e-5)
    np.testing.assert_allclose(_wrapped_math.reference(x, wrap=wrap), expected, rtol=1e-5)


def test_every_converter_is_registered_by_primitive_name():
    for name in ("remat2", "jit", "get", "swap", "jt_copy", "jt_gemm", "scan", "cond", "add",
                 "exp", "reduce_max"):
        assert name in from_jaxpr.CONVERTERS
    assert "pjit" not in from_jaxpr.CONVERTERS  # jax 0.10 has no such primitive


def test_an_unsupported_primitive_names_itself_and_the_line():
    @jt.kernel
    def top(x):
        out = jt.empty((2, 1), x.dtype)
        jt.grid(1)
        out[...] = jax.lax.population_count(x[...])[:, :1]
        return out

    with pytest.raises(jt.KernelError,
                       match=r"`population_count` is not supported.*test_from_jaxpr.py"):
        top.lower(jnp.ones((2, 8), jnp.int32))


def test_the_operations_table_in_the_docs_is_current():
    path = pathlib.Path(__file__).parents[2] / "docs" / "operations.md"
    assert path.read_text() == operations_doc.operations_markdown(), (
        "docs/operations.md is stale: regenerate it with operations_doc.operations_markdown()")
    assert "| Other |" not in path.read_text()
