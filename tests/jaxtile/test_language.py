"""The tile language on the CPU.

Every test compiles a small kernel, runs it under ``jax.jit`` and compares the result with
both the kernel's reference semantics (``kernel.reference``) and an independent ``jnp`` /
numpy formula. Shapes are chosen so that tiles both fit and overhang the edges of the
arrays; inputs carry edge values (NaN, +-inf, huge and tiny magnitudes, negative zero).
"""

import functools
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import jaxtile as jt

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
I32 = np.dtype(np.int32)
BOOL = np.dtype(np.bool_)
FLOATS = [F32, BF16, F16]
FLOAT_IDS = ["f32", "bf16", "f16"]

# Tolerances for approximated functions (exp, tanh, ...). float32: a few ulps, as jaxtile's
# and XLA's polynomial approximations differ. Half precision: both compute in float32 and
# round once, so results differ by at most one ulp of the half type where the float32 values
# straddle a rounding boundary (2**-7 resp. 2**-10 relative). Everything else is exact.
APPROX = {
    F32: {"rtol": 4e-6, "atol": 1e-37},
    BF16: {"rtol": 2 ** -7, "atol": 1e-37},
    F16: {"rtol": 2 ** -10, "atol": 1e-7},
}

# A ragged 2-D shape for 8x16 tiles: full tiles inside, partial tiles at both edges.
RAGGED = (13, 37)
EVEN = (16, 32)


# --- helpers -------------------------------------------------------------------------------

def _is_float(dtype):
    return jnp.issubdtype(dtype, jnp.floating)


def _big(dtype):
    return {F32: 3e38, BF16: 3e38, F16: 6e4}[np.dtype(dtype)]


def _tiny(dtype):
    return {F32: 1e-30, BF16: 1e-30, F16: 1e-4}[np.dtype(dtype)]


def edge_values(dtype):
    """Values every float test sees: specials, huge, tiny, halves (for rounding)."""
    big, tiny = _big(dtype), _tiny(dtype)
    return [np.nan, np.inf, -np.inf, -0.0, 0.0, big, -big, tiny, -tiny,
            0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0]


def data(rng, shape, dtype, *, scale=2.0, edges=True, low=None):
    """Random values of ``dtype``; floats get the edge values at random positions."""
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return jnp.asarray(rng.random(shape) < 0.5)
    if not _is_float(dtype):
        lo = -100 if low is None else low
        return jnp.asarray(rng.integers(lo, 100, size=shape, dtype=np.int64).astype(dtype))
    x = rng.standard_normal(shape) * scale
    if low is not None:
        x = np.abs(x) + low
    if edges:
        vals = edge_values(dtype)
        pos = rng.choice(x.size, size=min(len(vals), x.size), replace=False)
        flat = x.reshape(-1)
        flat[pos] = vals[:len(pos)]
    return jnp.asarray(x.astype(dtype))


def put(x, index, values):
    """``x`` with ``x[index] = values``, done in numpy (no XLA op to compile)."""
    a = np.array(x)
    a[index] = values
    return jnp.asarray(a)


def assert_same(got, want, *, rtol=0.0, atol=0.0, signed_zeros=False, what=""):
    """``got`` equals ``want`` (dtype, shape, values; NaN equals NaN), within a tolerance for
    floats when one is given; with ``signed_zeros`` the sign of every zero must match."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if _is_float(got.dtype):
        g, w = got.astype(np.float64), want.astype(np.float64)
        if rtol or atol:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=what)
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)
        if signed_zeros:
            zeros = w == 0
            np.testing.assert_array_equal(np.signbit(g[zeros]), np.signbit(w[zeros]),
                                          err_msg=f"{what}: sign of zero")
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def run(kernel, *args, **params):
    """The kernel compiled under jax.jit, and its reference semantics."""
    got = jax.jit(functools.partial(kernel, **params))(*args)
    ref = kernel.reference(*args, **params)
    return got, ref


def check(kernel, args, want, params=None, **tol):
    """Run ``kernel`` compiled and as reference; both must match ``want`` (a pytree)."""
    got, ref = run(kernel, *args, **(params or {}))
    got_l, ref_l, want_l = (jax.tree.leaves(t) for t in (got, ref, want))
    assert len(got_l) == len(want_l) == len(ref_l)
    for n, (g, r, w) in enumerate(zip(got_l, ref_l, want_l)):
        assert_same(r, w, what=f"reference vs jnp [{n}]", **tol)
        assert_same(g, r, what=f"compiled vs reference [{n}]", **tol)
        assert_same(g, w, what=f"compiled vs jnp [{n}]", **tol)
    return got


# --- generic kernels -----------------------------------------------------------------------

@jt.kernel
def map1(x, *, fns, rows=8, cols=16, pad=None):
    """Each of ``fns`` applied to each (rows, cols) tile of x (copied into a fragment); one
    output per function, written back through a fragment."""
    m, n = x.shape
    bx, by = jt.grid(jt.cdiv(n, cols), jt.cdiv(m, rows))
    t = jt.fragment((rows, cols), x.dtype)
    jt.copy(x.at[by * rows, bx * cols], t, pad=pad)
    v = t[...]
    outs = []
    for fn in fns:
        r = fn(v)
        out = jt.empty((m, n), r.dtype)
        o = jt.fragment((rows, cols), r.dtype)
        o[...] = r
        jt.copy(o, out.at[by * rows, bx * cols])
        outs.append(out)
    return tuple(outs)


@jt.kernel
def map2(x, y, *, fns, rows=8, cols=16, pad=None):
    """Each of ``fns(x_tile, y_tile)`` over (rows, cols) tiles (x in a fragment, y in shared
    memory); one output per function."""
    m, n = x.shape
    bx, by = jt.grid(jt.cdiv(n, cols), jt.cdiv(m, rows))
    tx = jt.fragment((rows, cols), x.dtype)
    ty = jt.shared((rows, cols), y.dtype)
    jt.copy(x.at[by * rows, bx * cols], tx, pad=pad)
    jt.copy(y.at[by * rows, bx * cols], ty, pad=pad)
    a, b = tx[...], ty[...]
    outs = []
    for fn in fns:
        r = fn(a, b)
        out = jt.empty((m, n), r.dtype)
        o = jt.fragment((rows, cols), r.dtype)
        o[...] = r
        jt.copy(o, out.at[by * rows, bx * cols])
        outs.append(out)
    return tuple(outs)


@jt.kernel
def whole(x, *, fns):
    """Each of ``fns`` of the whole input read with ``x[...]``, stored with ``out[...] =``."""
    v = x[...]
    outs = []
    for fn in fns:
        r = fn(v)
        out = jt.empty(r.shape, r.dtype)
        out[...] = r
        outs.append(out)
    return tuple(outs)


def check_each(kernel, args, cases, params=None):
    """One kernel computing several functions (one output each). ``cases`` is a list of
    ``(name, want, tolerance)``; every output is checked, and all mismatches are reported."""
    got, ref = run(kernel, *args, **(params or {}))
    assert len(got) == len(ref) == len(cases)
    failures = []
    for (name, want, tol), g, r in zip(cases, got, ref):
        try:
            assert_same(r, want, what=f"{name}: reference vs jnp", **tol)
            assert_same(g, r, what=f"{name}: compiled vs reference", **tol)
            assert_same(g, want, what=f"{name}: compiled vs jnp", **tol)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)
    return got


def check_fns(kernel, args, fns, tol, params=None):
    """``check_each`` for a dict of named functions, against the functions applied with jnp."""
    cases = [(name, fn(*args), tol) for name, fn in fns.items()]
    return check_each(kernel, args, cases, {"fns": tuple(fns.values()), **(params or {})})


# --- elementwise math ----------------------------------------------------------------------

def _neg(v):
    return -v


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


@pytest.mark.xfail(reason="TVM's simplifier folds v * 0.0 and v - v to 0.0 (inf * 0 and "
                          "inf - inf are NaN) and, after distributing + over a select, "
                          "-0.0 + 0.0 to -0.0", strict=True)
@pytest.mark.parametrize("name", ["v*0", "v-v", "signed_zero"])
def test_ieee_identities_with_specials(rng, name):
    x = data(rng, RAGGED, F32)
    if name == "signed_zero":
        m = data(rng, RAGGED, BOOL)
        check_fns(map2, [x, m], {"select": _mask_select}, {"signed_zeros": True})
    else:
        fn = {"v*0": _times_zero, "v-v": _minus_self}[name]
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


# --- casts ---------------------------------------------------------------------------------

CAST_VALUES = [np.nan, np.inf, -np.inf, -0.0, 0.0, 0.7, -0.7, 2.5, -2.5, 3e9, -3e9, 2147483520.0,
               2147483648.0, -2147483648.0, 65504.0, 65520.0, 1e5, 1e-8, 1 + 2 ** -8,
               1 + 3 * 2 ** -8, 257.0, 259.0, 3.4e38, -1e-40, 6e-8, 1.00048828125,
               1.0009765625, 100.5, -100.5, 1e30, 123456.789, 0.1]


def _cast_input(src):
    if src == BOOL:
        return jnp.asarray(np.array([True, False] * 8).reshape(2, 8))
    if src == I32:
        vals = np.array([0, 1, -1, 257, 259, 2049, 70000, -70000, 16777217, 2 ** 31 - 1,
                         -2 ** 31, 65519, -65519, 123456789, 33554435, 7], np.int64)
    else:
        vals = np.array(CAST_VALUES, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        arr = vals.astype(src)
    return jnp.asarray(arr.reshape(-1, 8))


def _numpy_cast(x, src, dst):
    """An independent statement of XLA's conversion rules."""
    x = np.asarray(x)
    if dst == BOOL:
        return x != 0
    if _is_float(src) and not _is_float(dst):
        info = np.iinfo(dst)
        w = x.astype(np.float64)
        w = np.nan_to_num(w, nan=0.0, posinf=info.max, neginf=info.min)
        return np.clip(np.trunc(w), info.min, info.max).astype(dst)
    with np.errstate(over="ignore"):
        if src == I32 and dst in (BF16, F16):
            return x.astype(np.float32).astype(dst)    # XLA goes through float32
        return x.astype(dst)


def _cast_fn(dst):
    return functools.partial(lax.convert_element_type, new_dtype=dst)


def _check_casts(src, dsts):
    x = _cast_input(src)
    fns = {dst.name: _cast_fn(dst) for dst in dsts}
    got = check_fns(map1, [x], fns, {"signed_zeros": True})
    for dst, g in zip(dsts, got):
        assert_same(g, _numpy_cast(np.asarray(x), src, dst), signed_zeros=True,
                    what=f"{src.name}->{dst.name} vs numpy")


CASTS = {F32: [I32, BF16, F16], BF16: [F32, F16], F16: [F32, BF16, I32],
         I32: [F32, BF16, F16, BOOL], BOOL: [F32, I32, BF16]}


@pytest.mark.parametrize("src", list(CASTS), ids=[s.name for s in CASTS])
def test_casts(src):
    """Saturating float->int with NaN -> 0, round-to-nearest-even narrowing, overflow to
    inf, bool <-> numbers; against XLA and against numpy."""
    _check_casts(src, CASTS[src])


@pytest.mark.parametrize("src", [F32, BF16], ids=["f32", "bf16"])
def test_cast_float_to_bool(src):
    if src is BF16:
        _check_casts(src, [BOOL])
        return
    # XLA:CPU compares float32 with 0 under flush-to-zero, so subnormals become False where
    # numpy says True: jaxtile follows XLA (its reference semantics).
    x = _cast_input(src)
    (got,) = check_fns(map1, [x], {"bool": _cast_fn(BOOL)}, {"signed_zeros": True})
    normal = np.abs(np.asarray(x)) >= np.finfo(np.float32).tiny
    want = _numpy_cast(np.asarray(x), src, BOOL)
    np.testing.assert_array_equal(np.asarray(got)[normal], want[normal])


def test_cast_bf16_to_int32():
    _check_casts(BF16, [I32])


def _round_trip_back(v):
    return v.astype(jnp.float32).astype(v.dtype)


def _round_trip_via_bf16(v):
    return v.astype(jnp.bfloat16).astype(v.dtype)


def _round_trip_via_f16(v):
    return v.astype(jnp.float16).astype(v.dtype)


def _round_trip_input(rng, src):
    x = (rng.standard_normal(RAGGED) * 100).astype(src)
    with np.errstate(over="ignore"):
        x[0, :8] = np.asarray(CAST_VALUES[:8], src)
        x[1, :8] = np.asarray(CAST_VALUES[18:26], src)
    return jnp.asarray(x)


ROUND_TRIPS = {F32: {"via_bf16": _round_trip_via_bf16, "via_f16": _round_trip_via_f16},
               BF16: {"via_f32": _round_trip_back, "via_f16": _round_trip_via_f16},
               F16: {"via_f32": _round_trip_back}}


@pytest.mark.parametrize("src", FLOATS, ids=FLOAT_IDS)
def test_cast_round_trips_round(rng, src):
    """A narrowing cast inside an expression still rounds (cast pairs are not folded)."""
    x = _round_trip_input(rng, src)
    got = check_fns(map1, [x], ROUND_TRIPS[src], {"signed_zeros": True})
    if src == F32:
        with np.errstate(over="ignore"):
            assert_same(got[0], np.asarray(x).astype(BF16).astype(F32), what="numpy bf16")
            assert_same(got[1], np.asarray(x).astype(F16).astype(F32), what="numpy f16")


def test_cast_round_trip_f16_via_bf16(rng):
    x = _round_trip_input(rng, F16)
    got = check_fns(map1, [x], {"via_bf16": _round_trip_via_bf16}, {"signed_zeros": True})
    assert_same(got[0], np.asarray(x).astype(BF16).astype(F16), what="numpy")


def _half_chain(a, b):
    return (a * b + a) * b - a


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_half_precision_rounds_after_every_op(rng, dtype):
    """Each half-precision op rounds its result (as XLA:CPU does), also inside fused chains."""
    x, y = data(rng, RAGGED, dtype, edges=False), data(rng, RAGGED, dtype, edges=False)
    xs, ys = np.asarray(x, F32), np.asarray(y, F32)
    step = (xs * ys).astype(dtype).astype(F32)
    step = (step + xs).astype(dtype).astype(F32)
    step = (step * ys).astype(dtype).astype(F32)
    want = (step - xs).astype(dtype)
    check_each(map2, [x, y], [("chain", want, {})], {"fns": (_half_chain,)})


# --- reductions ----------------------------------------------------------------------------

def _reducers(names, axes=((0, False), (0, True), (1, False), (1, True), (None, False),
                            (None, True))):
    fns = {}
    for name in names:
        for axis, keep in axes:
            fn = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min}[name]
            fns[f"{name}-{axis}-{keep}"] = functools.partial(fn, axis=axis, keepdims=keep)
    return fns


def test_reductions_sum_f32(rng):
    """Sums over axis 0, axis 1 and all axes, with and without keepdims (0-d outputs too)."""
    x = put(data(rng, (6, 37), F32, edges=False), (4, 3), np.inf)
    check_fns(whole, [x], _reducers(["sum"]), {"rtol": 2e-6, "atol": 1e-5})


def test_reductions_max_min_f32(rng):
    """max/min with NaN (propagates), +-inf, -0.0 and huge values."""
    x = data(rng, (6, 37), F32)
    x = put(x, 5, np.abs(np.asarray(x)[5]))           # one NaN-free row and column
    x = put(x, (slice(None), 36), np.arange(6, dtype=F32))
    x = put(x, (5, 36), -np.inf)
    fns = _reducers(["max"])
    fns.update(_reducers(["min"], axes=((0, True), (1, False), (None, False))))
    check_fns(whole, [x], fns, {})


@pytest.mark.parametrize("dtype", [BF16, F16, I32], ids=["bf16", "f16", "i32"])
def test_reductions_other_dtypes(rng, dtype):
    x = data(rng, (6, 37), dtype, edges=False)
    if _is_float(dtype):
        x = put(put(x, (0, 0), np.nan), (1, 3), -np.inf)
    fns = {"sum-1": functools.partial(jnp.sum, axis=1, keepdims=True),
           "max-0": functools.partial(jnp.max, axis=0, keepdims=True),
           "min-1": functools.partial(jnp.min, axis=1)}
    tol = {} if dtype == I32 else {"rtol": APPROX[dtype]["rtol"], "atol": 1e-3}
    check_fns(whole, [x], fns, tol)


def _prod_rows(v):
    return jnp.prod(v, axis=1)


def _any_all(v):
    return jnp.any(v > 1.0, axis=0) & ~jnp.all(v < 1.5, axis=0)


def _mean_var(v):
    mu = jnp.mean(v, axis=1, keepdims=True)
    return jnp.mean((v - mu) ** 2, axis=1)


def test_more_reductions(rng):
    x = jnp.asarray(rng.uniform(0.5, 1.6, (5, 24)).astype(F32))
    check_fns(whole, [x], {"prod": _prod_rows, "any_all": _any_all, "var": _mean_var},
              {"rtol": 2e-6, "atol": 1e-6})


def _argmax(v):
    return jnp.argmax(v, axis=1)


def test_argmax_is_not_supported():
    x = jnp.ones((4, 8), F32)
    with pytest.raises(jt.KernelError, match="argmax"):
        jax.jit(functools.partial(whole, fns=(_argmax,)))(x)
    with pytest.raises(jt.KernelError, match="argmax"):
        whole.lower(x, fns=(_argmax,))


# --- broadcasting, iota, transposes, reshapes ----------------------------------------------

@jt.kernel
def broadcasts(x, c, r, s, *, rows=8):
    """(rows,1), (1,cols) and scalar operands against a (rows, cols) tile."""
    m, n = x.shape
    out = jt.empty((m, n), x.dtype)
    i = jt.grid(jt.cdiv(m, rows))
    t = jt.fragment((rows, n), x.dtype)
    ct = jt.fragment((rows, 1), c.dtype)
    jt.copy(x.at[i * rows, 0], t)
    jt.copy(c.at[i * rows, 0], ct)
    v = t[...]
    w = (v - ct[...]) * r[...] + s[0]
    w = w - 2 * jnp.max(v, axis=1, keepdims=True) + jnp.sum(v, axis=0, keepdims=True) / 4
    t[...] = w * 0.5 + 1
    jt.copy(t, out.at[i * rows, 0])
    return out


def _broadcasts_formula(x, c, r, s, rows):
    """The same computation in float64 numpy (rounded once to x's dtype at the end)."""
    x, c, r, s = (np.asarray(a, np.float64) for a in (x, c, r, s))
    m, n = x.shape
    nb = -(-m // rows)
    # The tile's zero padding joins the column sum: pad, then work on (blocks, rows, n).
    full = np.pad(x, ((0, nb * rows - m), (0, 0))).reshape(nb, rows, n)
    cv = np.pad(c, ((0, nb * rows - m), (0, 0))).reshape(nb, rows, 1)
    w = (full - cv) * r + s[0]
    w = w - 2 * np.max(full, axis=2, keepdims=True) + np.sum(full, axis=1, keepdims=True) / 4
    return (w * 0.5 + 1).reshape(nb * rows, n)[:m]


@pytest.mark.parametrize("dtype,m", [(F32, 13), (BF16, 16)], ids=["f32-13", "bf16-16"])
def test_broadcasting(rng, dtype, m):
    n = 20
    x = data(rng, (m, n), dtype, edges=False)
    c = data(rng, (m, 1), dtype, edges=False)
    r = data(rng, (1, n), dtype, edges=False)
    s = data(rng, (1,), dtype, edges=False)
    want = _broadcasts_formula(x, c, r, s, 8).astype(dtype)
    tol = {"rtol": 1e-5, "atol": 1e-4} if dtype == F32 else {"rtol": 2e-2, "atol": 0.1}
    check(broadcasts, [x, c, r, s], want, **tol)


@jt.kernel
def causal(x, *, bm=8, bn=16, offset=0):
    """A causal mask from broadcasted_iota: x where col <= row + offset, else -inf; then the
    row-wise masked softmax of each tile."""
    m, n = x.shape
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    t = jt.fragment((bm, bn), jnp.float32)
    jt.copy(x.at[by * bm, bx * bn], t)
    row = lax.broadcasted_iota(jnp.int32, (bm, bn), 0) + by * bm
    col = lax.broadcasted_iota(jnp.int32, (bm, bn), 1) + bx * bn
    masked = jnp.where(col <= row + offset, t[...], -jnp.inf)
    out = jt.empty((m, n), x.dtype)
    probs = jt.empty((m, n), jnp.float32)
    t[...] = masked
    jt.copy(t, out.at[by * bm, bx * bn])
    mx = jnp.max(masked, axis=1, keepdims=True)
    e = jnp.exp(masked - jnp.where(jnp.isneginf(mx), 0.0, mx))
    t[...] = e / jnp.maximum(jnp.sum(e, axis=1, keepdims=True), 1e-30)
    jt.copy(t, probs.at[by * bm, bx * bn])
    return out, probs


@pytest.mark.parametrize("shape,offset", [((13, 37), 5)], ids=["ragged"])
def test_iota_causal_mask(rng, shape, offset):
    x = data(rng, shape, F32, edges=False)
    m, n = shape
    keep = jnp.arange(n)[None, :] <= jnp.arange(m)[:, None] + offset
    masked = jnp.where(keep, x, -jnp.inf)
    # The softmax is per (8, 16) tile, and the tile's padding (zeros) joins it where the
    # mask keeps it: compute it on the padded array, tile by tile.
    gm, gn = -(-m // 8), -(-n // 16)
    xp = jnp.pad(x, ((0, gm * 8 - m), (0, gn * 16 - n)))
    keep_p = jnp.arange(gn * 16)[None, :] <= jnp.arange(gm * 8)[:, None] + offset
    tiles = jnp.where(keep_p, xp, -jnp.inf).reshape(gm, 8, gn, 16)
    mx = jnp.max(tiles, axis=3, keepdims=True)
    e = jnp.exp(tiles - jnp.where(jnp.isneginf(mx), 0.0, mx))
    p = e / jnp.maximum(jnp.sum(e, axis=3, keepdims=True), 1e-30)
    probs = p.reshape(gm * 8, gn * 16)[:m, :n]
    check(causal, [x], (masked, probs), {"offset": offset}, rtol=2e-6, atol=1e-7)


@jt.kernel
def transpose_tiles(x, *, bm=8, bn=16):
    """out = x.T, one (bm, bn) tile at a time."""
    m, n = x.shape
    out = jt.empty((n, m), x.dtype)
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    t = jt.fragment((bm, bn), x.dtype)
    jt.copy(x.at[by * bm, bx * bn], t)
    tt = jt.shared((bn, bm), x.dtype)
    tt[...] = t[...].T
    jt.copy(tt, out.at[bx * bn, by * bm])
    return out


@pytest.mark.parametrize("shape,dtype", [(RAGGED, F32), (EVEN, BF16)],
                         ids=["ragged-f32", "even-bf16"])
def test_transpose(rng, shape, dtype):
    x = data(rng, shape, dtype)
    check(transpose_tiles, [x], x.T, signed_zeros=True)


def _reshape_a(v):
    return v.reshape(v.shape[1], v.shape[0])


def _reshape_b(v):
    return v.reshape(-1).reshape(2, -1) * 2


def _group_sum(v):
    return v.reshape(v.shape[0], -1, 4).sum(axis=-1)


def _transpose_3d(v):
    return jnp.transpose(v.reshape(2, v.shape[0] // 2, -1), (1, 2, 0)).reshape(v.shape[0] // 2, -1)


def _sum_3d_axes(v):
    return jnp.max(v.reshape(2, 3, 8), axis=(0, 2)) + jnp.sum(v.reshape(2, 3, 8), axis=(0, 2))


def test_reshapes(rng):
    x = data(rng, (6, 8), F32, edges=False)
    check_fns(whole, [x], {"swap_dims": _reshape_a, "flatten": _reshape_b,
                           "group_sum": _group_sum, "transpose_3d": _transpose_3d,
                           "reduce_3d": _sum_3d_axes},
              {"rtol": 1e-6})


# --- refs ----------------------------------------------------------------------------------

def _affine(v):
    return v * 2 - 1


@pytest.mark.parametrize("shape,dtype", [((1,), I32), ((2, 3, 5), F32)],
                         ids=["1d-i32", "3d-f32"])
def test_whole_ref_read_write(rng, shape, dtype):
    x = data(rng, shape, dtype)
    check_fns(whole, [x], {"affine": _affine, "neg": _neg}, {"signed_zeros": True})


@jt.kernel
def ds_rows(x, *, b=4):
    """Row blocks through ref[jt.ds(i * b, b), :]: the last block is clamped into range."""
    m, n = x.shape
    out = jt.empty((m, n), x.dtype)
    i = jt.grid(jt.cdiv(m, b))
    out[jt.ds(i * b, b), :] = x[jt.ds(i * b, b), :] * 2 + 1
    return out


@pytest.mark.parametrize("m", [8, 10])
def test_dynamic_slices_cover_with_clamping(rng, m):
    x = data(rng, (m, 6), F32, edges=False)
    b = min(4, m)
    check(ds_rows, [x], x * 2 + 1, {"b": b})


@jt.kernel
def window(x, *, b, step, shift, nb):
    """out[i, :] = x[i * step + shift : ... + b], clamped like lax.dynamic_slice."""
    out = jt.empty((nb, b), x.dtype)
    i = jt.grid(nb)
    out[i, :] = x[jt.ds(i * step + shift, b)]
    return out


@pytest.mark.parametrize("shift", [7, -3])
def test_dynamic_slice_clamps_like_lax(shift):
    x = jnp.arange(10, dtype=F32) * 1.5
    nb = 4
    want = jnp.stack([lax.dynamic_slice(x, (i * 3 + shift,), (4,)) for i in range(nb)])
    check(window, [x], want, {"b": 4, "step": 3, "shift": shift, "nb": nb})


@jt.kernel
def row_reads(x, idx):
    """Single-row reads ref[i, :] at data-dependent rows, and ref[i, j] scalars."""
    m, n = x.shape
    (k,) = idx.shape
    out = jt.empty((k, n), x.dtype)
    corner = jt.empty((k,), x.dtype)
    i = jt.grid(k)
    r = idx[i]
    out[i, :] = x[r, :] + x[0, :]
    corner[i] = x[r, n - 1] * 2
    return out, corner


def test_single_row_reads(rng):
    x = data(rng, (7, 12), F32, edges=False)
    idx = jnp.asarray([3, 0, 6, 6, 1], I32)
    want = (x[idx] + x[0], x[idx, 11] * 2)
    check(row_reads, [x, idx], want)


@jt.kernel
def accumulate_rows(x):
    """ref[...] += v on an output and on a fragment, over a device loop."""
    m, n = x.shape
    total = jt.empty((n,), x.dtype)
    total[...] = jnp.zeros((n,), x.dtype)
    acc = jt.fragment((n,), x.dtype)
    acc[...] = jnp.zeros((n,), x.dtype)

    @jt.loop(m)
    def _(k):
        total[...] += x[k, :]
        acc[...] += x[k, :] * x[k, :]

    sq = jt.empty((n,), x.dtype)
    sq[...] = acc[...]
    return total, sq


@pytest.mark.parametrize("dtype", [F32, I32], ids=["f32", "i32"])
def test_add_update(rng, dtype):
    x = data(rng, (5, 12), dtype, edges=False)
    tol = {"rtol": 1e-6} if dtype == F32 else {}
    check(accumulate_rows, [x], (x.sum(0), (x * x).sum(0)), **tol)


# --- jt.copy -------------------------------------------------------------------------------

@jt.kernel
def heads(q, *, bs=8, scale=2.0):
    """A 3-D tensor read one (bs, D) tile at a time: leading index selects the batch."""
    B, S, D = q.shape
    out = jt.empty((B, S, D), q.dtype)
    s, b = jt.grid(jt.cdiv(S, bs), B)
    t = jt.fragment((bs, D), q.dtype)
    jt.copy(q.at[b, s * bs, 0], t)
    t[...] = t[...] * scale
    jt.copy(t, out.at[b, s * bs, 0])
    return out


@pytest.mark.parametrize("S,dtype", [(13, F32), (16, F16)], ids=["13-f32", "16-f16"])
def test_copy_leading_selected_index(rng, S, dtype):
    q = data(rng, (3, S, 16), dtype)
    check(heads, [q], q * 2, signed_zeros=True)


@jt.kernel
def padded_row_reduce(x, *, fn, pad, cols=64, rows=4):
    """Whole rows in a (rows, cols) tile; columns past the end read ``pad``."""
    m, n = x.shape
    r = jt.grid(jt.cdiv(m, rows))
    t = jt.fragment((rows, cols), x.dtype)
    jt.copy(x.at[r * rows, 0], t, pad=pad)
    red = fn(t[...], axis=1, keepdims=True)
    out = jt.empty((m, 1), red.dtype)
    o = jt.fragment((rows, 1), red.dtype)
    o[...] = red
    jt.copy(o, out.at[r * rows, 0])
    return out


@pytest.mark.parametrize("fn,pad,dtype,low", [
    (jnp.max, -np.inf, F32, None), (jnp.min, np.inf, F32, 0.5), (jnp.prod, 1, F32, 0.9),
    (jnp.max, -2 ** 31, I32, -100),
], ids=["max-inf", "min+inf", "prod1", "imax"])
def test_copy_pad_values(rng, fn, pad, dtype, low):
    if _is_float(dtype):
        x = rng.standard_normal((10, 37))
        if low is not None:
            x = low + np.abs(x) * 0.1 if fn is jnp.prod else low + np.abs(x)
        elif fn is jnp.max:
            x = -np.abs(x) - 1                  # every value below the default pad of 0
        x = jnp.asarray(x.astype(dtype))
    elif fn is jnp.max:
        x = -jnp.abs(data(rng, (10, 37), dtype)) - 1     # below the default pad of 0
    else:
        x = data(rng, (10, 37), dtype, low=low)
    want = fn(x, axis=1, keepdims=True)
    tol = {"rtol": 2e-6} if dtype == F32 and fn in (jnp.prod, jnp.sum) else {}
    if dtype == F16 and fn is jnp.prod:
        tol = {"rtol": 2e-2}
    check(padded_row_reduce, [x], want, {"fn": fn, "pad": pad}, **tol)


@jt.kernel
def stencil(x, *, b=16):
    """out[j] = x[j-1] + 2 x[j] + x[j+1] from a halo tile whose origin starts at -1."""
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, b))
    h = jt.fragment((b + 2,), x.dtype)
    jt.copy(x.at[i * b - 1], h)
    o = jt.fragment((b,), x.dtype)
    o[...] = h[jt.ds(0, b)] + 2 * h[jt.ds(1, b)] + h[jt.ds(2, b)]
    jt.copy(o, out.at[i * b])
    return out


@pytest.mark.parametrize("n", [37, 5])
def test_copy_negative_origin_reads_pad(rng, n):
    x = data(rng, (n,), F32, edges=False)
    xp = jnp.pad(x, 1)
    check(stencil, [x], xp[:-2] + 2 * xp[1:-1] + xp[2:], rtol=1e-6)


@jt.kernel
def shift_left(x, *, b=16, pad=7.0):
    """Writes before the start of the output are dropped: out[j] = x[j + 1], out[-1] = pad."""
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n + 1, b))
    t = jt.fragment((b,), x.dtype)
    jt.copy(x.at[i * b], t, pad=pad)
    jt.copy(t, out.at[i * b - 1])
    return out


@pytest.mark.parametrize("n", [32, 37])
def test_copy_drops_writes_outside(rng, n):
    x = data(rng, (n,), F32)
    want = jnp.concatenate([x[1:], jnp.asarray([7.0], F32)])
    check(shift_left, [x], want, signed_zeros=True)


@jt.kernel
def shift_right(x, *, b=16):
    """out[0] = -1 and out[j] = x[j - 1]: written by two different kinds of write."""
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, b))
    t = jt.fragment((b,), x.dtype)
    jt.copy(x.at[i * b], t)
    out[0] = jnp.asarray(-1, x.dtype)
    jt.copy(t, out.at[i * b + 1])
    return out


def test_copy_shifted_output_covered_by_two_writes(rng):
    x = data(rng, (37,), F32)
    check(shift_right, [x], jnp.concatenate([jnp.asarray([-1.0], F32), x[:-1]]))


@jt.kernel
def on_chip_copies(x):
    """Copies between shared, fragment and local tiles, with sub-regions and origins."""
    out = jt.empty((8, 16), x.dtype)
    s = jt.shared((8, 16), x.dtype)
    f = jt.fragment((8, 16), x.dtype)
    loc = jt.local((4, 8), x.dtype)
    jt.copy(x, s)
    jt.copy(s.at[jt.ds(4, 4), :], f.at[jt.ds(0, 4), :])      # bottom half -> top
    jt.copy(s.at[jt.ds(0, 4), :], f.at[jt.ds(4, 4), :])      # top half -> bottom
    jt.copy(f.at[2, 4], loc)                                 # origin on a fragment
    loc[...] = loc[...] + 1
    jt.copy(loc, s.at[0, 8])                                 # origin on a shared tile
    jt.copy(s.at[jt.ds(0, 4), jt.ds(8, 8)], f.at[4, 0])
    jt.copy(f, out)
    return out


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_copies_between_on_chip_buffers(rng, dtype):
    x = data(rng, (8, 16), dtype, edges=False)
    xs = np.asarray(x)
    f = np.concatenate([xs[4:], xs[:4]])
    loc = (f[2:6, 4:12].astype(np.float64) + 1).astype(dtype)
    s = xs.copy()
    s[0:4, 8:16] = loc
    f[4:8, 0:8] = s[0:4, 8:16]
    check(on_chip_copies, [x], f)


@jt.kernel
def cast_copy(x, *, mid, rows=8, cols=16):
    """Global -> fragment of dtype ``mid`` -> shared of x's dtype -> global: casting copies."""
    m, n = x.shape
    bx, by = jt.grid(jt.cdiv(n, cols), jt.cdiv(m, rows))
    t = jt.fragment((rows, cols), mid)
    jt.copy(x.at[by * rows, bx * cols], t)
    out = jt.empty((m, n), mid)
    jt.copy(t, out.at[by * rows, bx * cols])
    back = jt.empty((m, n), x.dtype)
    s = jt.shared((rows, cols), x.dtype)
    jt.copy(t, s)
    jt.copy(s, back.at[by * rows, bx * cols])
    return out, back


def _copy_cast_check(rng, src, mid):
    x = data(rng, RAGGED, src)
    if src == F32:
        x = put(x, (5, slice(0, 16)), np.asarray(CAST_VALUES[:16], F32))
    conv = x.astype(mid)
    got, _ = check(cast_copy, [x], (conv, conv.astype(src)), {"mid": mid}, signed_zeros=True)
    assert_same(got, _numpy_cast(np.asarray(x), src, mid), signed_zeros=True, what="numpy")


@pytest.mark.parametrize("src,mid", [(F32, BF16), (F32, I32), (BF16, F32)],
                         ids=["f32-bf16", "f32-i32", "bf16-f32"])
def test_copy_casts(rng, src, mid):
    """Copies cast to the destination dtype, on the fast path and at the ragged edges."""
    _copy_cast_check(rng, src, mid)


def test_copy_cast_f32_to_bool(rng):
    _copy_cast_check(rng, F32, BOOL)


@jt.kernel
def uninitialised_scratch(x, *, b=8):
    """Reads a fragment before writing it: the reference gives zeros (scratch is fresh in
    every block)."""
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, b))
    acc = jt.fragment((b,), x.dtype)
    t = jt.fragment((b,), x.dtype)
    jt.copy(x.at[i * b], t)
    acc[...] += t[...]
    jt.copy(acc, out.at[i * b])
    return out


def test_scratch_is_fresh_in_every_block(rng):
    x = data(rng, (32,), F32, edges=False)
    check(uninitialised_scratch, [x], x)


def test_copy_with_two_origins_is_an_error():
    @jt.kernel
    def two_origins(x):
        out = jt.empty(x.shape, x.dtype)
        jt.copy(x.at[0, 0], out.at[0, 0])
        return out

    with pytest.raises(jt.KernelError, match="tile origins"):
        two_origins(jnp.ones((4, 4), F32))


# --- jt.gemm -------------------------------------------------------------------------------

@jt.kernel
def gemm_k(a, b, *, ta=False, tb=False, bm=16, bn=16, bk=8, acc_dtype=jnp.float32):
    """c = op(a) @ op(b), tiled, with operands stored transposed when asked."""
    M, K = a.shape[::-1] if ta else a.shape
    N = b.shape[0] if tb else b.shape[1]
    c = jt.empty((M, N), acc_dtype)
    bx, by = jt.grid(jt.cdiv(N, bn), jt.cdiv(M, bm))
    a_s = jt.shared((bk, bm) if ta else (bm, bk), a.dtype)
    b_s = jt.shared((bn, bk) if tb else (bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), acc_dtype)
    acc[...] = jnp.zeros((bm, bn), acc_dtype)

    @jt.pipelined(jt.cdiv(K, bk), stages=2)
    def _(k):
        jt.copy(a.at[k * bk, by * bm] if ta else a.at[by * bm, k * bk], a_s)
        jt.copy(b.at[bx * bn, k * bk] if tb else b.at[k * bk, bx * bn], b_s)
        jt.gemm(a_s, b_s, acc, transpose_a=ta, transpose_b=tb)

    jt.copy(acc, c.at[by * bm, bx * bn])
    return c


def _exact_matmul(a, b, ta, tb):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a.T if ta else a) @ (b.T if tb else b)


@pytest.mark.parametrize("mkn,ta,tb", [
    ((20, 19, 27), True, False), ((20, 19, 27), False, True), ((20, 19, 27), True, True),
], ids=["ragged-aT", "ragged-bT", "ragged-aT-bT"])
def test_gemm_transposes_f32(rng, mkn, ta, tb):
    m, k, n = mkn
    a = data(rng, (k, m) if ta else (m, k), F32, edges=False)
    b = data(rng, (n, k) if tb else (k, n), F32, edges=False)
    want = jnp.matmul(a.T if ta else a, b.T if tb else b, precision=lax.Precision.HIGHEST)
    got = check(gemm_k, [a, b], want, {"ta": ta, "tb": tb}, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got, np.float64), _exact_matmul(a, b, ta, tb),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,ta,tb", [(BF16, True, True)], ids=["bf16-aT-bT"])
def test_gemm_half_operands_accumulate_in_f32(rng, dtype, ta, tb):
    m, k, n = 20, 40, 27
    a = data(rng, (k, m) if ta else (m, k), dtype, edges=False)
    b = data(rng, (n, k) if tb else (k, n), dtype, edges=False)
    exact = _exact_matmul(a, b, ta, tb)
    # Products of half-precision values are exact in float32; only the sums round.
    got = check(gemm_k, [a, b], exact.astype(F32), {"ta": ta, "tb": tb}, rtol=1e-5,
                atol=1e-4)
    assert got.dtype == F32


def test_gemm_int32_is_exact(rng):
    a = data(rng, (20, 19), I32, low=-5)
    b = data(rng, (19, 27), I32, low=-5)
    check(gemm_k, [a, b], a @ b, {"acc_dtype": jnp.int32})


@jt.kernel
def two_gemms(a1, b1, a2, b2, *, bm=16, bn=16, bk=8):
    """acc = a1 @ b1 + a2 @ b2.T, both accumulated into one fragment inside @jt.loop."""
    M, K = a1.shape
    N = b1.shape[1]
    c = jt.empty((M, N), jnp.float32)
    bx, by = jt.grid(jt.cdiv(N, bn), jt.cdiv(M, bm))
    a_s = jt.shared((bm, bk), a1.dtype)
    b_s = jt.shared((bk, bn), b1.dtype)
    a2_s = jt.fragment((bm, bk), a2.dtype)
    b2_s = jt.local((bn, bk), b2.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.loop(jt.cdiv(K, bk))
    def _(k):
        jt.copy(a1.at[by * bm, k * bk], a_s)
        jt.copy(b1.at[k * bk, bx * bn], b_s)
        jt.gemm(a_s, b_s, acc)
        jt.copy(a2.at[by * bm, k * bk], a2_s)
        jt.copy(b2.at[bx * bn, k * bk], b2_s)
        jt.gemm(a2_s, b2_s, acc, transpose_b=True)

    jt.copy(acc, c.at[by * bm, bx * bn])
    return c


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_multiple_gemms_accumulate_in_a_loop(rng, dtype):
    m, k, n = 20, 21, 18
    a1, a2 = data(rng, (m, k), dtype, edges=False), data(rng, (m, k), dtype, edges=False)
    b1, b2 = data(rng, (k, n), dtype, edges=False), data(rng, (n, k), dtype, edges=False)
    exact = _exact_matmul(a1, b1, False, False) + _exact_matmul(a2, b2, False, True)
    check(two_gemms, [a1, b1, a2, b2], exact.astype(F32), rtol=1e-5, atol=1e-4)


# --- control flow --------------------------------------------------------------------------

@jt.kernel
def row_sums(x, *, bk=8, rows=4, start=0, kind="loop", stages=2, unroll=False):
    """Row sums over column tiles [start, cdiv(n, bk)) accumulated in a fragment."""
    m, n = x.shape
    nk = jt.cdiv(n, bk)
    out = jt.empty((m, 1), x.dtype)
    r = jt.grid(jt.cdiv(m, rows))
    t = jt.shared((rows, bk), x.dtype)
    acc = jt.fragment((rows, 1), x.dtype)
    acc[...] = jnp.zeros((rows, 1), x.dtype)

    def body(k):
        jt.copy(x.at[r * rows, k * bk], t)
        acc[...] += jnp.sum(t[...], axis=1, keepdims=True)

    if kind == "pipelined":
        jt.pipelined(nk - start, stages=stages)(lambda k: body(k + start))
    elif start:
        jt.loop(start, nk, unroll=unroll)(body)
    else:
        jt.loop(nk, unroll=unroll)(body)
    jt.copy(acc, out.at[r * rows, 0])
    return out


LOOP_VARIANTS = {
    "loop_start_stop-i32": (I32, {"start": 2}),
    "unrolled-f32": (F32, {"unroll": True}),
    "pipelined3-f32": (F32, {"kind": "pipelined", "stages": 3}),
    "pipelined_start-i32": (I32, {"kind": "pipelined", "stages": 2, "start": 1}),
}


@pytest.mark.parametrize("variant", list(LOOP_VARIANTS))
def test_loops_accumulate_in_fragments(rng, variant):
    dtype, p = LOOP_VARIANTS[variant]
    x = data(rng, (10, 37), dtype, edges=False)
    start = p.get("start", 0)
    want = jnp.sum(x[:, start * 8:], axis=1, keepdims=True)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == F32 else {}
    check(row_sums, [x], want, p, **tol)


@jt.kernel
def nested(x, *, bj=4):
    """Nested loops: out = sum_i sum_j x[i, j*bj:(j+1)*bj] * (i + 1) * (j + 1)."""
    m, n = x.shape
    out = jt.empty((bj,), x.dtype)
    acc = jt.fragment((bj,), x.dtype)
    acc[...] = jnp.zeros((bj,), x.dtype)

    @jt.loop(m)
    def _(i):
        @jt.loop(n // bj)
        def _(j):
            w = ((i + 1) * (j + 1)).astype(x.dtype)
            acc[...] += x[i, jt.ds(j * bj, bj)] * w

    out[...] = acc[...]
    return out


@pytest.mark.parametrize("dtype", [I32, F32], ids=["i32", "f32"])
def test_nested_loops(rng, dtype):
    x = data(rng, (5, 12), dtype, edges=False)
    w = (jnp.arange(5)[:, None, None] + 1) * (jnp.arange(3)[None, :, None] + 1)
    want = jnp.sum(x.reshape(5, 3, 4) * w.astype(dtype), axis=(0, 1))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == F32 else {}
    check(nested, [x], want, **tol)


@jt.kernel
def guarded(x, s, *, b=8):
    """@jt.when on the block index (first/last block write flags), on the loop index
    (initialise a running max on the first tile) and on data (negate some rows)."""
    m, n = x.shape
    nb = jt.cdiv(m, b)
    i = jt.grid(nb)
    flags = jt.empty((2,), jnp.int32)
    rowmax = jt.empty((m,), x.dtype)
    signed = jt.empty((m, n), x.dtype)

    @jt.when(i == 0)
    def _():
        flags[0] = jnp.int32(11)

    @jt.when(i == nb - 1)
    def _():
        flags[1] = (i + 1) * 100

    run_max = jt.fragment((b,), x.dtype)
    t = jt.fragment((b, 4), x.dtype)

    @jt.loop(n // 4)
    def _(k):
        jt.copy(x.at[i * b, k * 4], t)
        tile_max = jnp.max(t[...], axis=1)

        @jt.when(k == 0)
        def _():
            run_max[...] = tile_max

        @jt.when(k > 0)
        def _():
            run_max[...] = jnp.maximum(run_max[...], tile_max)

    jt.copy(run_max, rowmax.at[i * b])

    @jt.loop(b)
    def _(r):
        row = jnp.minimum(i * b + r, m - 1)

        @jt.when(s[row] > 0)
        def _():
            signed[row, :] = x[row, :]

        @jt.when(s[row] <= 0)
        def _():
            signed[row, :] = -x[row, :]

    @jt.when(True)
    def _():
        pass

    @jt.when(False)
    def _():
        flags[0] = jnp.int32(-5)

    return flags, rowmax, signed


@pytest.mark.parametrize("m", [13])
def test_when(rng, m):
    n = 12
    x = data(rng, (m, n), F32, edges=False)
    s = data(rng, (m,), I32)
    nb = -(-m // 8)
    want = (jnp.asarray([11, nb * 100], I32), jnp.max(x, axis=1),
            jnp.where((s > 0)[:, None], x, -x))
    check(guarded, [x, s], want, signed_zeros=True)


@jt.kernel
def grid3(x, *, bm=4, bn=8):
    """A 3-D grid over (N tiles, M tiles, batch); each block also writes its block ids."""
    B, M, N = x.shape
    bx, by, bz = jt.grid(jt.cdiv(N, bn), jt.cdiv(M, bm), B)
    out = jt.empty((B, M, N), x.dtype)
    ids = jt.empty((B, jt.cdiv(M, bm), jt.cdiv(N, bn)), jnp.int32)
    t = jt.fragment((bm, bn), x.dtype)
    jt.copy(x.at[bz, by * bm, bx * bn], t)
    t[...] = t[...] + (bz * 100 + by * 10 + bx).astype(x.dtype)
    jt.copy(t, out.at[bz, by * bm, bx * bn])
    ids[bz, by, bx] = bz * 100 + by * 10 + bx
    return out, ids


@pytest.mark.parametrize("shape", [(3, 7, 19)])
def test_3d_grid(rng, shape):
    B, M, N = shape
    x = data(rng, shape, F32, edges=False)
    gm, gn = -(-M // 4), -(-N // 8)
    blk = (jnp.arange(B)[:, None, None] * 100 + jnp.arange(gm)[None, :, None] * 10
           + jnp.arange(gn)[None, None, :]).astype(I32)
    per_elem = jnp.repeat(jnp.repeat(blk, 4, axis=1), 8, axis=2)[:, :M, :N]
    check(grid3, [x], (x + per_elem.astype(F32), blk))


# --- outputs and specialisations -----------------------------------------------------------

@jt.kernel
def three_outputs(x, *, b=8):
    """Three outputs of different dtypes, created in one order and returned in another."""
    (n,) = x.shape
    first = jt.empty((n,), jnp.int32)
    second = jt.empty((n,), x.dtype)
    third = jt.empty((n,), jnp.bool_)
    i = jt.grid(jt.cdiv(n, b))
    t = jt.fragment((b,), x.dtype)
    jt.copy(x.at[i * b], t)
    v = t[...]
    o1 = jt.fragment((b,), jnp.int32)
    o1[...] = jnp.floor(v).astype(jnp.int32)
    o3 = jt.fragment((b,), jnp.bool_)
    o3[...] = v > 0
    t[...] = v * v
    jt.copy(o1, first.at[i * b])
    jt.copy(t, second.at[i * b])
    jt.copy(o3, third.at[i * b])
    return third, (first, second)


@pytest.mark.parametrize("n", [21])
def test_multiple_outputs_in_another_order(rng, n):
    x = data(rng, (n,), F32, edges=False)
    third, (first, second) = check(three_outputs, [x],
                                   (x > 0, (jnp.floor(x).astype(I32), x * x)))
    assert (third.dtype, first.dtype, second.dtype) == (BOOL, I32, F32)


def _twice_minus_one(v):
    return v * 2 - 1


def test_specialisations_per_shape_and_params(rng):
    """One kernel, several shapes/dtypes/params: each call gets its own specialisation."""
    fns = (_twice_minus_one,)
    calls = [((13, 37), F32, {}), ((16, 32), F32, {"rows": 4}),
             ((5, 3), BF16, {"rows": 2, "cols": 2}), ((13, 37), F32, {})]
    keys = []
    for shape, dtype, p in calls:
        x = data(rng, shape, dtype)
        check(map1, [x], (x * 2 - 1,), {"fns": fns, **p}, signed_zeros=True)
        keys.append(map1.lower(jax.ShapeDtypeStruct(shape, dtype), fns=fns, **p).key)
    assert len(set(keys)) == 3 and keys[0] == keys[-1]


def test_kernel_inside_a_larger_jit(rng):
    x = data(rng, RAGGED, F32, edges=False)

    @jax.jit
    def f(x):
        (y,) = map1(x * 2, fns=(jnp.tanh,))
        (z,) = map1(y, fns=(_twice_minus_one,))
        return z.sum() + map1(x, fns=(jnp.tanh,), rows=4)[0].sum()

    want = (jnp.tanh(x * 2) * 2 - 1).sum() + jnp.tanh(x).sum()
    np.testing.assert_allclose(f(x), want, rtol=1e-5)


# --- hazards -------------------------------------------------------------------------------

@jt.kernel
def in_place(x, *, which):
    """In-place updates of one tile whose result depends on reading before writing."""
    (n, n2) = x.shape
    out = jt.empty((n, n2), x.dtype)
    t = jt.fragment((n, n2), x.dtype)
    jt.copy(x, t)
    if which == "transpose":
        t[...] = t[...].T
    elif which == "transpose_add":
        t[...] = t[...] + t[...].T
    elif which == "repeat_double":
        t[...] = t[...] * 2
        t[...] = t[...] * 2
        t[...] = t[...] * 2
    elif which == "read_overwrite_use":
        v = t[...]
        t[...] = jnp.zeros_like(v)
        t[...] = v + 1
    elif which == "scalar_then_overwrite":
        s = t[0, 0]
        t[...] = t[...] * 0 + 5
        t[...] = t[...] + s
    elif which == "shift_rows":
        t[jt.ds(1, n - 1), :] = t[jt.ds(0, n - 1), :]
    elif which == "normalise_by_first_col":
        t[...] = t[...] - t[:, 0:1]
    elif which == "subtract_row_max":
        t[...] = t[...] - jnp.max(t[...], axis=1, keepdims=True)
    elif which == "copy_overlap":
        jt.copy(t.at[jt.ds(0, n - 1), :], t.at[jt.ds(1, n - 1), :])
    elif which == "gemm_alias":
        jt.gemm(t, t, t)
    jt.copy(t, out)
    return out


def _hazard_want(x, which):
    x = np.asarray(x, np.float64)
    if which == "transpose":
        return x.T
    if which == "transpose_add":
        return x + x.T
    if which == "repeat_double":
        return x * 8
    if which == "read_overwrite_use":
        return x + 1
    if which == "scalar_then_overwrite":
        return np.full_like(x, 5) + x[0, 0]
    if which in ("shift_rows", "copy_overlap"):
        return np.concatenate([x[:1], x[:-1]])
    if which == "normalise_by_first_col":
        return x - x[:, :1]
    if which == "subtract_row_max":
        return x - x.max(axis=1, keepdims=True)
    if which == "gemm_alias":
        return x + x @ x
    raise AssertionError(which)


HAZARDS = ["transpose", "transpose_add", "repeat_double", "read_overwrite_use",
           "scalar_then_overwrite", "shift_rows", "normalise_by_first_col", "subtract_row_max",
           "copy_overlap", "gemm_alias"]


@pytest.mark.parametrize("which,n", [
    pytest.param(w, n, id=f"{w}-{n}")
    for w, n in [(w, 5) for w in HAZARDS] + [("transpose", 8)]
])
def test_read_write_hazards(rng, which, n):
    x = jnp.asarray(rng.integers(-8, 8, (n, n)).astype(F32))   # exact in every formula
    check(in_place, [x], _hazard_want(x, which).astype(F32), {"which": which})
