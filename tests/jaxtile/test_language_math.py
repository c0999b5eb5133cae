"""The tile language on the CPU: elementwise float math, integer and boolean ops.

Shared helpers and the testing approach: ``language_helpers``.
"""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from language_helpers import (
    APPROX,
    BF16,
    BOOL,
    F16,
    F32,
    FLOAT_IDS,
    FLOATS,
    I32,
    RAGGED,
    _is_float,
    _neg,
    assert_same,
    check_each,
    check_fns,
    data,
    edge_values,
    map1,
    map2,
    put,
)

# --- elementwise math ----------------------------------------------------------------------

def _inv(v):
    return v ** -1


def _sq(v):
    return v ** 2


def _cube(v):
    return v ** 3


def _pow4(v):
    return v ** 4


def _round_away(v):
    return lax.round(v, lax.RoundingMethod.AWAY_FROM_ZERO)


EXACT_UNARY = {"neg": _neg, "abs": jnp.abs, "sign": jnp.sign, "floor": jnp.floor,
               "ceil": jnp.ceil, "round_even": jnp.round, "round_away": _round_away,
               "sqrt": jnp.sqrt, "square": _sq}

APPROX_UNARY = {"exp": jnp.exp, "log": jnp.log, "tanh": jnp.tanh, "rsqrt": lax.rsqrt,
                "sigmoid": jax.nn.sigmoid, "cube": _cube, "inverse": _inv, "pow4": _pow4,
                "sin": jnp.sin, "log1p": jnp.log1p}
# JAX/XLA expand these into several half-precision ops, each rounded (logistic: neg, exp,
# add, div; x**4: two squarings), where jaxtile computes in float32 and rounds once: the two
# may differ by two ulps (jaxtile's result is the more accurate one).
HALF_TWO_ULPS = ("sigmoid", "pow4")
F32_ONLY = ("sin", "log1p")


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_unary_exact(rng, dtype):
    """Correctly rounded ops: bit-exact, signs of zeros included (sqrt(-0) = -0 ...)."""
    x = data(rng, RAGGED, dtype)
    check_fns(map1, [x], EXACT_UNARY, {"signed_zeros": True})


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_unary_approx(rng, dtype):
    x = data(rng, RAGGED, dtype)
    fns = {k: f for k, f in APPROX_UNARY.items() if dtype == F32 or k not in F32_ONLY}
    cases = []
    for name, fn in fns.items():
        tol = dict(APPROX[dtype])
        if dtype != F32 and name in HALF_TWO_ULPS:
            tol["rtol"] *= 2
        cases.append((name, fn(x), tol))
    check_each(map1, [x], cases, {"fns": tuple(fns.values())})


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_exp2(rng, dtype):
    """exp2 is within an ulp of the truth. JAX lowers a half-precision exp2 as
    exp(ln2 * x) with ln2 and the product rounded to the half type (2.5% error in bfloat16),
    so the reference and jnp are only held to that."""
    x = data(rng, RAGGED, dtype)
    loose = {F32: APPROX[F32], BF16: {"rtol": 3e-2, "atol": 1e-37},
             F16: {"rtol": 4e-3, "atol": 1e-7}}[dtype]
    (got,) = check_fns(map1, [x], {"exp2": jnp.exp2}, loose)
    with np.errstate(over="ignore"):
        truth = np.exp2(np.asarray(x, np.float64)).astype(dtype)
    assert_same(got, truth, what="exp2 vs float64 numpy", **APPROX[dtype])


def _np_sigmoid(v):
    return 1 / (1 + np.exp(-v))


ACCURACY = {"tanh": (jnp.tanh, np.tanh), "exp": (jnp.exp, np.exp),
            "sigmoid": (jax.nn.sigmoid, _np_sigmoid), "log1p": (jnp.log1p, np.log1p)}


def _accuracy_check(fns):
    """Relative accuracy for tiny inputs (against float64 numpy) and clean saturation."""
    vals = np.concatenate([np.geomspace(1e-30, 0.3, 40), -np.geomspace(1e-30, 0.3, 40),
                           np.linspace(-120, 120, 48)]).astype(F32).reshape(8, 16)
    x = jnp.asarray(vals)
    got = check_fns(map1, [x], {k: f for k, (f, _) in fns.items()}, APPROX[F32])
    for (name, (_, np_fn)), g in zip(fns.items(), got):
        with np.errstate(all="ignore"):
            want = np_fn(vals.astype(np.float64)).astype(F32).astype(np.float64)
        np.testing.assert_allclose(np.asarray(g, np.float64), want, rtol=4e-6, atol=1e-37,
                                   err_msg=name)


def test_unary_accuracy_near_zero_and_saturation():
    _accuracy_check(ACCURACY)


def test_expm1_accuracy():
    _accuracy_check({"expm1": (jnp.expm1, np.expm1)})


def _add(a, b):
    return a + b


def _sub(a, b):
    return a - b


def _mul(a, b):
    return a * b


def _div(a, b):
    return a / b


def _where_clip(a, b):
    return jnp.where((a > b) & ~(a > 1.0), a, jnp.where(b < -1.0, -1.0, b))


def _lt(a, b):
    return a < b


def _le(a, b):
    return a <= b


def _gt(a, b):
    return a > b


def _ge(a, b):
    return a >= b


def _eq(a, b):
    return a == b


def _ne(a, b):
    return a != b


FLOAT_BINARY = {"add": _add, "sub": _sub, "mul": _mul, "div": _div, "max": jnp.maximum,
                "min": jnp.minimum, "where": _where_clip, "lt": _lt, "le": _le, "gt": _gt,
                "eq": _eq}


def _binary_inputs(rng, dtype):
    x, y = data(rng, RAGGED, dtype), data(rng, RAGGED, dtype)
    if _is_float(dtype):
        # Line NaN/inf/zero of x up against every kind of y value, and vice versa; one row
        # of equal values, and -0.0 == 0.0, NaN != NaN.
        edges = np.asarray(edge_values(dtype), dtype)
        y = put(y, (0, slice(0, 16)), edges)
        x = put(x, (1, slice(0, 16)), edges)
        x = put(x, (3, slice(0, 4)), np.asarray([-0.0, 0.0, np.nan, np.inf], dtype))
        y = put(y, (3, slice(0, 4)), np.asarray([0.0, -0.0, np.nan, np.inf], dtype))
    return put(x, 2, np.asarray(y)[2]), y


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_binary_float(rng, dtype):
    """+ - * / max min, comparisons (bool tiles) and where: all exact."""
    x, y = _binary_inputs(rng, dtype)
    check_fns(map2, [x, y], FLOAT_BINARY, {})


@pytest.mark.parametrize("dtype", [F32], ids=["f32"])
def test_not_equal_with_nan(rng, dtype):
    x, y = _binary_inputs(rng, dtype)
    check_fns(map2, [x, y], {"ne": _ne}, {})


def test_max_min_propagate_nan():
    x = jnp.asarray(np.array([[np.nan, 1.0, np.nan, -np.inf, np.inf, np.nan, 2.0, -1.0]], F32))
    y = jnp.asarray(np.array([[0.0, np.nan, np.nan, np.nan, -np.inf, -np.inf, 3.0, -3.0]], F32))
    got = check_fns(map2, [x, y], {"max": jnp.maximum, "min": jnp.minimum}, {},
                    {"rows": 1, "cols": 8})
    for g in got:
        assert np.isnan(np.asarray(g)[0, :6]).sum() == 5


def test_pow_float(rng):
    x = jnp.asarray(np.abs(rng.standard_normal(RAGGED)).astype(F32) * 3)
    y = jnp.asarray(rng.uniform(-3, 3, RAGGED).astype(F32))
    x = put(x, (0, slice(0, 6)), np.asarray([-8.0, -2.0, 0.0, 0.0, np.inf, np.nan], F32))
    y = put(y, (0, slice(0, 6)), np.asarray([1 / 3, 2.0, -1.0, 0.0, -0.5, 0.0], F32))
    check_fns(map2, [x, y], {"pow": jnp.power}, APPROX[F32])


def _isnan_to_zero(v):
    return jnp.where(jnp.isnan(v), jnp.zeros_like(v), v)


def test_isnan(rng):
    x = data(rng, RAGGED, F32)
    check_fns(map1, [x], {"isnan": jnp.isnan, "nan_to_zero": _isnan_to_zero},
              {"signed_zeros": True})


def _times_zero(v):
    return v * 0.0


def _minus_self(v):
    return v - v


def _mask_select(a, m):
    return jnp.where(m, a, -a) + m.astype(a.dtype)


def _mask_count(a, m):
    return jnp.where(m & (a > 0), a * 2, jnp.zeros_like(a))


def _over_self(v):
    return v / v


# Identities of real numbers that IEEE floats lack (a simplifier that applies them gives 0
# or 1 where XLA gives NaN or a signed zero). TVM's simplifier applied the first three, and
# its bfloat16 legalisation folded v * 0.0.
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", ["v*0", "v-v", "signed_zero", "v/v"])
def test_ieee_identities_with_specials(rng, name, dtype):
    x = data(rng, RAGGED, dtype)
    if name == "signed_zero":
        m = data(rng, RAGGED, BOOL)
        check_fns(map2, [x, m], {"select": _mask_select}, {"signed_zeros": True})
    else:
        fn = {"v*0": _times_zero, "v-v": _minus_self, "v/v": _over_self}[name]
        check_fns(map1, [x], {name: fn}, {})


# --- integers and booleans -----------------------------------------------------------------

def _floordiv(a, b):
    return a // b


def _mod(a, b):
    return a % b


def _bit_and(a, b):
    return a & b


def _bit_or(a, b):
    return a | b


def _bit_xor(a, b):
    return a ^ b


INT_BINARY = {"add": _add, "sub": _sub, "mul": _mul, "max": jnp.maximum, "min": jnp.minimum,
              "lax_div": lax.div, "lax_rem": lax.rem, "floordiv": _floordiv, "and": _bit_and,
              "or": _bit_or, "xor": _bit_xor, "lt": _lt, "ge": _ge, "eq": _eq, "ne": _ne}


def _int_inputs(rng):
    x = data(rng, RAGGED, I32)
    y = data(rng, RAGGED, I32)
    y = jnp.asarray(np.where(np.asarray(y) == 0, 7, np.asarray(y)))   # no division by zero
    # Negative operands both ways, and wrapping sums and products.
    x = put(x, (0, slice(0, 10)), np.asarray([7, -7, 7, -7, 1, -1, 0, 9, 2 ** 31 - 1, -2 ** 31],
                                             I32))
    y = put(y, (0, slice(0, 10)), np.asarray([2, 2, -2, -2, 3, 3, 5, -4, 2, 3], I32))
    return put(x, 2, np.asarray(y)[2]), y


def test_int32_binary(rng):
    x, y = _int_inputs(rng)
    got = check_fns(map2, [x, y], INT_BINARY, {}, {"pad": 1})
    # lax.div / lax.rem truncate towards zero, like C.
    xs, ys = np.asarray(x, np.int64), np.asarray(y, np.int64)
    q = np.trunc(xs / ys).astype(np.int64)
    names = list(INT_BINARY)
    np.testing.assert_array_equal(got[names.index("lax_div")], q.astype(I32))
    np.testing.assert_array_equal(got[names.index("lax_rem")], (xs - q * ys).astype(I32))
    np.testing.assert_array_equal(np.asarray(got[names.index("lax_div")])[0, :8],
                                  [3, -3, -3, 3, 0, 0, 0, -2])


def test_int32_python_modulo(rng):
    x, y = _int_inputs(rng)
    check_fns(map2, [x, y], {"mod": _mod}, {}, {"pad": 1})


def test_int32_division_by_zero_and_overflow():
    # Run in a child process: the failure mode is a hardware trap.
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from jax import lax
        import jaxtile as jt

        @jt.kernel
        def divrem(x, y):
            q = jt.empty(x.shape, x.dtype)
            r = jt.empty(x.shape, x.dtype)
            q[...] = lax.div(x[...], y[...])
            r[...] = lax.rem(x[...], y[...])
            return q, r

        x = jnp.asarray(np.array([5, -5, 0, -2**31, -2**31, 7, 1, 2], np.int32))
        y = jnp.asarray(np.array([0, 0, 0, -1, 1, 0, 1, 1], np.int32))
        q, r = jax.jit(divrem)(x, y)
        np.testing.assert_array_equal(q, lax.div(x, y))
        np.testing.assert_array_equal(r, lax.rem(x, y))
        print("OK")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, (proc.returncode, proc.stderr[-2000:])


def _invert(v):
    return ~v


INT_UNARY = {"neg": _neg, "abs": jnp.abs, "sign": jnp.sign, "square": _sq, "cube": _cube,
             "invert": _invert}


def test_int32_unary(rng):
    x = put(data(rng, RAGGED, I32), (0, slice(0, 4)),
            np.asarray([0, -1, 2 ** 31 - 1, -2 ** 31], I32))
    check_fns(map1, [x], INT_UNARY, {})


def test_int32_pow4(rng):
    x = data(rng, RAGGED, I32)
    check_fns(map1, [x], {"pow4": _pow4}, {})


def _logical_not(a, b):
    return jnp.logical_not(a)


def _and_not(a, b):
    return (a & ~b) | (b & ~a)


def test_bool_masks(rng):
    x, y = data(rng, RAGGED, BOOL), data(rng, RAGGED, BOOL)
    check_fns(map2, [x, y], {"and": _bit_and, "or": _bit_or, "not": _logical_not,
                             "and_not": _and_not}, {})


@pytest.mark.parametrize("name", ["xor", "eq", "ne", "lt"])
def test_bool_mask_compare(rng, name):
    x, y = data(rng, RAGGED, BOOL), data(rng, RAGGED, BOOL)
    fn = {"xor": _bit_xor, "eq": _eq, "ne": _ne, "lt": _lt}[name]
    check_fns(map2, [x, y], {name: fn}, {})


@pytest.mark.parametrize("dtype", [F32, I32], ids=["f32", "i32"])
def test_bool_mask_input_selects(rng, dtype):
    x, m = data(rng, RAGGED, dtype), data(rng, RAGGED, BOOL)
    check_fns(map2, [x, m], {"select": _mask_select, "count": _mask_count}, {})
