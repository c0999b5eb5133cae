"""Shared helpers for the tile-language tests (``test_language_*.py``): dtypes,
tolerances, input generators, comparisons and generic kernels.

Every test compiles a small kernel, runs it under ``jax.jit`` and compares the result with
both the kernel's reference semantics (``kernel.reference``) and an independent ``jnp`` /
numpy formula. Shapes are chosen so that tiles both fit and overhang the edges of the
arrays; inputs carry edge values (NaN, +-inf, huge and tiny magnitudes, negative zero).
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

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


def aligned(a):
    """A copy of numpy array ``a`` at a 64-byte aligned address, as compiled kernels assume
    (numpy promises 16): for calling them directly through ``_ffi.call_kernel``."""
    a = np.asarray(a)
    raw = np.empty(a.size + 64 // a.dtype.itemsize, a.dtype)
    start = (-raw.ctypes.data % 64) // a.dtype.itemsize
    out = raw[start:start + a.size].reshape(a.shape)
    out[...] = a
    return out


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

def _store_each(results, m, n, rows, cols, bx, by):
    """Kernel-body helper: one (m, n) output per tile value, written through a fragment."""
    outs = []
    for r in results:
        out = jt.empty((m, n), r.dtype)
        o = jt.fragment((rows, cols), r.dtype)
        o[...] = r
        jt.copy(o, out.at[by * rows, bx * cols])
        outs.append(out)
    return tuple(outs)


@jt.kernel
def map1(x, *, fns, rows=8, cols=16, pad=None):
    """Each of ``fns`` applied to each (rows, cols) tile of x (copied into a fragment); one
    output per function, written back through a fragment."""
    m, n = x.shape
    bx, by = jt.grid(jt.cdiv(n, cols), jt.cdiv(m, rows))
    t = jt.fragment((rows, cols), x.dtype)
    jt.copy(x.at[by * rows, bx * cols], t, pad=pad)
    v = t[...]
    return _store_each([fn(v) for fn in fns], m, n, rows, cols, bx, by)


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
    return _store_each([fn(a, b) for fn in fns], m, n, rows, cols, bx, by)


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


# --- shared elementwise functions and cast rules -------------------------------------------

def _neg(v):
    return -v


CAST_VALUES = [np.nan, np.inf, -np.inf, -0.0, 0.0, 0.7, -0.7, 2.5, -2.5, 3e9, -3e9, 2147483520.0,
               2147483648.0, -2147483648.0, 65504.0, 65520.0, 1e5, 1e-8, 1 + 2 ** -8,
               1 + 3 * 2 ** -8, 257.0, 259.0, 3.4e38, -1e-40, 6e-8, 1.00048828125,
               1.0009765625, 100.5, -100.5, 1e30, 123456.789, 0.1]


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
