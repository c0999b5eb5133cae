"""Findings 6 and 7: a specialisation is chosen by the parameters' types as well as their
values, and by the argument dtypes as the current x64 mode canonicalises them."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from probes import assert_ran, run_python

import jaxtile as jt


def _scaler(runs=None):
    @jt.kernel
    def scale(x, *, factor=1):
        if runs is not None:
            runs.append(factor)
        out = jt.empty(x.shape, (x[...] * factor).dtype)
        out[...] = x[...] * factor
        return out

    return scale


@pytest.mark.parametrize("order", [(2, 2.0, True), (2.0, 2, True), (True, 2.0, 2)])
def test_equal_parameters_of_other_types_do_not_share(order):
    k = _scaler()
    x = jnp.arange(4, dtype=jnp.int32)
    for factor in order:
        got = k(x, factor=factor)
        want = x * factor
        assert got.dtype == want.dtype, (factor, got.dtype, want.dtype)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        # The checked path (jit) as well as the eager fast path.
        assert jax.jit(lambda a, f=factor: k(a, factor=f))(x).dtype == want.dtype


def test_signed_zero_parameters_do_not_share():
    k = _scaler()
    x = jnp.ones(4, jnp.float32)
    np.testing.assert_array_equal(np.signbit(np.asarray(k(x, factor=0.0))), False)
    np.testing.assert_array_equal(np.signbit(np.asarray(k(x, factor=-0.0))), True)


def test_nan_parameter_traces_once():
    runs = []
    k = _scaler(runs)
    x = jnp.ones(4, jnp.float32)
    for _ in range(3):
        assert np.isnan(np.asarray(k(x, factor=float("nan")))).all()
        assert np.isnan(np.asarray(jax.jit(lambda a: k(a, factor=math.nan))(x))).all()
    # One trace runs the body once (its allocations made at its top level).
    assert len(runs) == 1, f"the body was traced {len(runs)} times for one NaN"


def test_enabling_x64_gives_a_new_specialisation():
    # x64 is process-wide configuration: probe it in a child process.
    proc = run_python("""
        import jax, jax.numpy as jnp, numpy as np
        import jaxtile as jt

        @jt.kernel
        def twice(x):
            out = jt.empty(x.shape, x.dtype)
            out[...] = x[...] * 2
            return out

        a = np.arange(4, dtype=np.float64)
        first = twice(a)
        assert first.dtype == jnp.float32, first.dtype
        jax.config.update("jax_enable_x64", True)
        second = twice(a)
        assert second.dtype == jnp.float64, second.dtype
        np.testing.assert_array_equal(np.asarray(second), a * 2)
        third = jax.jit(twice)(a)
        assert third.dtype == jnp.float64, third.dtype
        jax.config.update("jax_enable_x64", False)
        assert twice(a).dtype == jnp.float32
        print("ok")
    """)
    assert_ran(proc)
    assert "ok" in proc.stdout
