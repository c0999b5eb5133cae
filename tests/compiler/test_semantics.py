"""The per-element rules of compiler/semantics.py, checked against XLA itself."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from jaxtile.compiler import semantics

INTS = [np.int8, np.int32, np.uint8, np.uint32]


@pytest.mark.parametrize("dtype", INTS)
def test_integer_division_by_zero(dtype):
    x = jnp.array([7, 0, 3], dtype)
    zero = jnp.zeros(3, dtype)
    expected = semantics.int_div_by_zero(np.dtype(dtype))
    np.testing.assert_array_equal(jax.jit(lax.div)(x, zero), np.full(3, expected, dtype))
    np.testing.assert_array_equal(jax.jit(lax.rem)(x, zero), x)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16])
def test_integer_overflowing_quotient(dtype):
    rule = semantics.int_overflow_quotient(np.dtype(dtype))
    if np.iinfo(dtype).min == 0:
        assert rule is None
        return
    lo = np.iinfo(dtype).min
    with jax.enable_x64(np.dtype(dtype).itemsize == 8):
        x, m1 = jnp.array([lo], dtype), jnp.array([-1], dtype)
        assert int(jax.jit(lax.div)(x, m1)[0]) == rule[0]
        assert int(jax.jit(lax.rem)(x, m1)[0]) == 0


@pytest.mark.parametrize("dtype", INTS)
def test_float_to_int_saturates_and_nan_is_zero(dtype):
    lo, hi = semantics.saturation_bounds(np.dtype(dtype))
    x = jnp.array([1e30, -1e30, np.nan, np.inf, -np.inf], jnp.float32)
    got = jax.jit(lambda v: v.astype(dtype))(x)
    np.testing.assert_array_equal(got, np.array([hi, lo, semantics.NAN_TO_INT, hi, lo],
                                                dtype))


@pytest.mark.parametrize("fn", sorted(semantics.UNORDERED_RESULT))
def test_comparisons_with_nan(fn):
    op = getattr(lax, fn)
    x, nan = jnp.float32(1.0), jnp.float32(np.nan)
    expected = semantics.UNORDERED_RESULT[fn]
    assert bool(jax.jit(op)(x, nan)) == expected == bool(jax.jit(op)(nan, nan))


def test_min_max_propagate_nan_and_float_to_bool():
    x, nan = jnp.float32(1.0), jnp.float32(np.nan)
    assert np.isnan(jax.jit(lax.max)(x, nan)) and np.isnan(jax.jit(lax.min)(nan, x))
    assert bool(jax.jit(lambda v: v.astype(bool))(nan))


@pytest.mark.parametrize("fn,reducer", [("sum", lax.reduce_sum_p), ("max", lax.reduce_max_p),
                                        ("min", lax.reduce_min_p),
                                        ("prod", lax.reduce_prod_p)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
def test_reduction_identities(fn, reducer, dtype):
    empty = jnp.zeros((0,), dtype)
    got = jax.jit(lambda v: reducer.bind(v, axes=(0,), out_sharding=None))(empty)
    assert got.item() == semantics.reduce_identity(fn, np.dtype(dtype))


def test_bool_sum_combines_with_or():
    assert semantics.reduce_combiner("sum", np.dtype(bool)) == "or"
    assert semantics.reduce_combiner("sum", np.dtype(np.float32)) == "add"
    assert semantics.reduce_identity("and", np.dtype(bool)) is True


def test_half_precision_is_computed_in_float32():
    for dtype in (np.float16, ml_dtypes.bfloat16):
        assert semantics.compute_dtype(np.dtype(dtype)) == np.float32
    assert semantics.compute_dtype(np.dtype(np.float64)) == np.float64
