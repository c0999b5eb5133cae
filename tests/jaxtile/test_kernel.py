"""The @jt.kernel decorator: interpret modes, specialisation, inspection."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt


@jt.kernel
def scale(x, *, factor):
    out = jt.empty(x.shape, x.dtype)
    out[...] = x[...] * factor
    return out


def _primitives(fn, *args):
    return {e.primitive.name for e in jax.make_jaxpr(fn)(*args).eqns}


def test_interpret_modes_run_the_reference_semantics():
    x = jnp.arange(6.0)
    assert _primitives(lambda x: scale(x, factor=2.0), x) == {"jaxtile_kernel_call"}
    jt.set_interpret(True)
    try:
        assert jt.interpret_by_default()
        assert "jaxtile_kernel_call" not in _primitives(lambda x: scale(x, factor=2.0), x)
        np.testing.assert_array_equal(scale(x, factor=2.0), x * 2)
    finally:
        jt.set_interpret(False)

    @jt.kernel(interpret=True)
    def twice(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * 2
        return out

    assert "jaxtile_kernel_call" not in _primitives(twice, x)
    np.testing.assert_array_equal(twice(x), x * 2)


def test_one_specialisation_per_shape_dtype_and_parameter():
    x = jnp.arange(6.0)
    keys = {scale.lower(x, factor=2.0).key, scale.lower(x, factor=3.0).key,
            scale.lower(x[:5], factor=2.0).key, scale.lower(x.astype(jnp.float16),
                                                             factor=2.0).key}
    assert len(keys) == 4
    np.testing.assert_array_equal(scale(x, factor=3.0), x * 3)


def test_missing_parameter_is_an_error():
    with pytest.raises(jt.KernelError, match="missing compile-time parameter"):
        scale(jnp.arange(3.0))


def test_lower_shows_tile_ir_and_generated_source():
    lowered = scale.lower(jax.ShapeDtypeStruct((8,), jnp.float32), factor=2.0)
    assert lowered.target == "cpu" and len(lowered.key) == 64
    assert "kernel scale(grid=[1]" in lowered.tile_ir
    assert "T.prim_func" in lowered.source and "jt_scale" in lowered.source
