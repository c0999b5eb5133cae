"""hip_math.h, the math functions of AMD device code (no device library with -nogpulib):
compiled for the host by the same clang and checked against the C library (Python's math)
in ulps, over each function's domain and at its special values."""

import ctypes
import math
import re
import subprocess

import ml_dtypes
import numpy as np
import pytest

from jaxtile.compiler.emulator.build import DEVICE_INCLUDE
from jaxtile.compiler.hip import toolchain

pytestmark = [
    pytest.mark.skipif(toolchain.clang_path() is None,
                       reason=f"no clang for AMD GPUs: {toolchain.INSTALL_HINT}"),
    # The C library's double results past float's range become inf in float, as they should.
    pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning"),
]

UNARY = ["exp", "exp2", "log", "log1p", "expm1", "sin", "cos", "tan", "asin", "acos", "atan",
         "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "sqrt", "floor",
         "ceil", "trunc", "rint", "round", "fabs"]
BINARY = ["pow", "atan2", "fmod"]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """hip_math.h's functions in a host library: ``f64_<name>`` and ``f32_<name>`` evaluate
    the double and float forms over arrays."""
    lines = ["#define JT_DEVICE inline", "#include <jaxtile/hip_math.h>",
             'extern "C" {']
    for name in UNARY:
        lines += [f"void f64_{name}(const double* x, const double*, double* o, int n) "
                  f"{{ for (int i = 0; i < n; ++i) o[i] = jaxtile::{name}(x[i]); }}",
                  f"void f32_{name}(const float* x, const float*, float* o, int n) "
                  f"{{ for (int i = 0; i < n; ++i) o[i] = jaxtile::{name}f(x[i]); }}"]
    for name in BINARY:
        lines += [f"void f64_{name}(const double* x, const double* y, double* o, int n) "
                  f"{{ for (int i = 0; i < n; ++i) o[i] = jaxtile::{name}(x[i], y[i]); }}",
                  f"void f32_{name}(const float* x, const float* y, float* o, int n) "
                  f"{{ for (int i = 0; i < n; ++i) o[i] = jaxtile::{name}f(x[i], y[i]); }}"]
    lines += ["void bf16_bits(const float* x, unsigned short* o, int n) "
              "{ for (int i = 0; i < n; ++i) o[i] = jaxtile::math_::bf16_rne_bits(x[i]); }",
              "void tf32_bits(const float* x, unsigned* o, int n) "
              "{ for (int i = 0; i < n; ++i) o[i] = jaxtile::math_::tf32_rna_bits(x[i]); }"]
    lines.append("}")
    tmp = tmp_path_factory.mktemp("hip_math")
    src, so = tmp / "hip_math.cc", tmp / "hip_math.so"
    src.write_text("\n".join(lines) + "\n")
    # -ffp-contract=off: the host must round each operation as written (the GPU's fused
    # operations are the explicit fma calls).
    subprocess.run([toolchain.clang_path(), "-x", "c++", "-std=c++17", "-O2", "-fPIC",
                    "-shared", "-ffp-contract=off", f"-I{DEVICE_INCLUDE}", "-o", str(so),
                    str(src)], check=True, capture_output=True)
    return ctypes.CDLL(str(so))


def _call(lib, name, dtype, x, y=None):
    x = np.ascontiguousarray(x, dtype)
    y = np.ascontiguousarray(x if y is None else y, dtype)
    out = np.empty_like(x)
    prefix = "f64" if dtype == np.float64 else "f32"
    ptrs = [ctypes.c_void_p(a.ctypes.data) for a in (x, y, out)]
    getattr(lib, f"{prefix}_{name}")(*ptrs, ctypes.c_int(x.size))
    return out


def _libm(name, *args):
    """The C library's value (via Python), NaN for a domain error, inf for an overflow."""
    fn = {"exp2": lambda v: 2.0 ** v, "rint": lambda v: float(np.rint(v)),
          "round": lambda v: float(np.copysign(math.floor(abs(v) + 0.5), v)),
          "fabs": math.fabs}.get(name) or getattr(math, name)
    try:
        return float(fn(*args))
    except ValueError:
        return math.nan
    except OverflowError:
        return math.inf


def _ulps(got, want, dtype):
    """|got - want| in ulps of want's type (0 for equal values, infinities and NaNs)."""
    out = []
    for g, w in zip(got.tolist(), want.tolist()):
        if (math.isnan(g) and math.isnan(w)) or g == w:
            out.append(0.0)
        elif math.isinf(w) or math.isnan(g) or math.isnan(w):
            out.append(math.inf)
        else:
            tiny = float(np.finfo(dtype).smallest_subnormal)
            spacing = float(np.spacing(dtype(abs(w)))) if w else tiny
            out.append(abs(g - w) / spacing)
    return np.array(out)


_RNG = np.random.default_rng(0)


def _domain(lo, hi, log=False, n=600):
    if log:
        return np.exp(_RNG.uniform(np.log(lo), np.log(hi), n))
    return _RNG.uniform(lo, hi, n)


DOMAINS = {
    "exp": [(-745, 709.7)], "exp2": [(-1074, 1023.9)], "log": [(1e-300, 1e300, True), (0.5, 2)],
    "log1p": [(-0.999, 1e10), (1e-12, 1e-3, True)], "expm1": [(-50, 709), (1e-12, 1e-3, True)],
    # Past 2^20 pi/2 (1.6e6) the reduction is Payne-Hanek's.
    "sin": [(-1e5, 1e5), (-4, 4), (1e6, 1e300, True)],
    "cos": [(-1e5, 1e5), (-4, 4), (1e6, 1e300, True)],
    "tan": [(-1e5, 1e5), (-1.5, 1.5), (1e6, 1e300, True)],
    "asin": [(-1, 1)], "acos": [(-1, 1)], "atan": [(-1e3, 1e3), (1e-8, 1e20, True)],
    "sinh": [(-710, 710), (-1, 1)], "cosh": [(-710, 710)], "tanh": [(-30, 30), (-1e-3, 1e-3)],
    "asinh": [(-1e3, 1e3), (1e-10, 1e300, True)], "acosh": [(1, 1e3), (1, 1e300, True)],
    "atanh": [(-1, 1)], "erf": [(-7, 7)], "erfc": [(-7, 27)], "sqrt": [(1e-300, 1e300, True)],
    "floor": [(-1e6, 1e6)], "ceil": [(-1e6, 1e6)], "trunc": [(-1e6, 1e6)], "rint": [(-1e6, 1e6)],
    "round": [(-1e6, 1e6)], "fabs": [(-1e6, 1e6)],
}


def _points(name, dtype):
    pts = np.concatenate([_domain(*d) for d in DOMAINS[name]])
    if dtype == np.float32:
        pts = pts[(np.abs(pts) < 3e38) & ((np.abs(pts) > 1e-37) | (pts == 0))]
    return pts.astype(dtype)


# Within 4 ulp in double (8 for erf and erfc), 1 in float (a double rounded once), as
# hip_math.h says.
@pytest.mark.parametrize("name", UNARY)
def test_unary_functions_match_the_c_library(lib, name):
    double_bound = 8.0 if name in ("erf", "erfc") else 4.0
    for dtype, bound in ((np.float64, double_bound), (np.float32, 1.0)):
        x = _points(name, dtype)
        got = _call(lib, name, dtype, x)
        want = np.array([_libm(name, float(v)) for v in x], np.float64)
        if dtype == np.float32:
            want = want.astype(np.float32)
        err = _ulps(got.astype(np.float64), want.astype(np.float64), dtype)
        worst = int(np.argmax(err))
        assert err[worst] <= bound, (name, dtype.__name__, x[worst], got[worst], want[worst])


def test_binary_functions_match_the_c_library(lib):
    cases = {
        "pow": (np.concatenate([_domain(1e-3, 100, log=True), -_domain(1e-3, 100, log=True)]),
                np.concatenate([_domain(-40, 40), np.round(_domain(-40, 40))])),
        "atan2": (_domain(-1e3, 1e3, n=1200), _domain(-1e3, 1e3, n=1200)),
        "fmod": (_domain(-1e12, 1e12, n=1200), _domain(-1e3, 1e3, n=1200)),
    }
    for name, (x, y) in cases.items():
        for dtype, bound in ((np.float64, 4.0), (np.float32, 1.0)):
            xs, ys = x.astype(dtype), y.astype(dtype)
            got = _call(lib, name, dtype, xs, ys)
            want = np.array([_libm(name, float(a), float(b)) for a, b in zip(xs, ys)])
            err = _ulps(got.astype(np.float64), want.astype(dtype).astype(np.float64), dtype)
            worst = int(np.argmax(err))
            assert err[worst] <= bound, (name, dtype.__name__, xs[worst], ys[worst], got[worst])


INF, NAN = math.inf, math.nan
SPECIAL = [
    ("exp", (INF,), INF), ("exp", (-INF,), 0.0), ("exp", (NAN,), NAN), ("exp", (710.0,), INF),
    ("log", (0.0,), -INF), ("log", (-1.0,), NAN), ("log", (INF,), INF),
    ("log", (5e-324,), math.log(5e-324)), ("log1p", (-1.0,), -INF), ("log1p", (-0.0,), -0.0),
    ("expm1", (-INF,), -1.0), ("expm1", (-0.0,), -0.0), ("sin", (INF,), NAN),
    ("sin", (-0.0,), -0.0), ("tanh", (INF,), 1.0), ("tanh", (-INF,), -1.0),
    ("atanh", (1.0,), INF), ("atanh", (-1.0,), -INF), ("acosh", (0.5,), NAN),
    ("asinh", (-INF,), -INF), ("erf", (INF,), 1.0), ("erfc", (-INF,), 2.0),
    ("erfc", (INF,), 0.0), ("asin", (1.5,), NAN), ("sqrt", (-1.0,), NAN),
    ("pow", (0.0, -1.0), INF), ("pow", (-0.0, -3.0), -INF), ("pow", (-0.0, 3.0), -0.0),
    ("pow", (-8.0, 1 / 3), NAN), ("pow", (-2.0, 3.0), -8.0), ("pow", (NAN, 0.0), 1.0),
    ("pow", (1.0, NAN), 1.0), ("pow", (-1.0, INF), 1.0), ("pow", (0.5, -INF), INF),
    ("pow", (-INF, 3.0), -INF), ("pow", (-INF, -2.0), 0.0),
    ("atan2", (0.0, -0.0), math.pi), ("atan2", (-0.0, 0.0), -0.0),
    ("atan2", (INF, -INF), 3 * math.pi / 4), ("atan2", (-1.0, -INF), -math.pi),
    ("atan2", (1.0, 0.0), math.pi / 2), ("fmod", (5.0, 0.0), NAN), ("fmod", (INF, 2.0), NAN),
    ("fmod", (-5.5, INF), -5.5), ("fmod", (-0.0, 3.0), -0.0), ("fmod", (1e300, 3.0), 1e300 % 3),
]


@pytest.mark.parametrize("name,args,want", SPECIAL)
def test_special_values(lib, name, args, want):
    for dtype in (np.float64, np.float32):
        cols = [np.array([a], dtype) for a in args]
        if any(not math.isnan(a) and float(c[0]) != a for a, c in zip(args, cols)):
            continue  # not a float32 (1e300, 5e-324)
        got = float(_call(lib, name, dtype, *cols)[0])
        expected = float(dtype(want))
        if math.isnan(expected):
            assert math.isnan(got), (name, args, dtype)
        else:
            assert got == expected and math.copysign(1, got) == math.copysign(1, expected), \
                (name, args, dtype.__name__, got)


def _roundings():
    bits = _RNG.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, 1.00390625,
                        1.01171875, 3.3895314e38, 1e-40, -1e-45], np.float32)
    # Ties of both roundings: exactly half a bfloat16 / tf32 step above a value.
    ties = np.array([0x3F808000, 0x3F818000, 0x3F801000, 0x3F803000], np.uint32)
    return np.concatenate([bits.view(np.float32), special, ties.view(np.float32)])


def test_bfloat16_rounding_is_ml_dtypes(lib):
    x = _roundings()
    got = np.empty(x.size, np.uint16)
    lib.bf16_bits(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(got.ctypes.data),
                  ctypes.c_int(x.size))
    with np.errstate(invalid="ignore"):  # NaN inputs; compared apart below
        want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    # NaNs: quiet (top mantissa bit set), sign kept.
    assert np.all((got[nan] & 0x7FC0) == 0x7FC0)
    assert np.array_equal(got[nan] >> 15, x[nan].view(np.uint32) >> 31)


def test_tf32_rounding(lib):
    x = _roundings()
    got = np.empty(x.size, np.uint32)
    lib.tf32_bits(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(got.ctypes.data),
                  ctypes.c_int(x.size))
    finite = np.isfinite(x)
    assert np.array_equal(got[~finite], x[~finite].view(np.uint32))
    # Independently, in float64: the multiple of the tf32 step (10 mantissa bits; the
    # subnormal step below 2^-126) nearest to |x|, ties away from zero.
    a = np.abs(x[finite].astype(np.float64))
    _, e = np.frexp(a)
    step = np.ldexp(1.0, np.maximum(e - 1, -126) - 10)
    with np.errstate(over="ignore"):  # the largest floats round up to infinity
        want = (np.copysign(np.floor(a / step + 0.5) * step, x[finite])).astype(np.float32)
    assert np.array_equal(got[finite].view(np.float32), want)


def test_the_table_of_two_over_pi():
    # 2/pi's bits, recomputed from Machin's formula in integer arithmetic.
    def atan_inv(n, bits):
        total = term = (1 << bits) // n
        k, sign = 1, -1
        while term:
            term //= n * n
            total += sign * (term // (2 * k + 1))
            sign, k = -sign, k + 1
        return total

    bits = 1400
    pi = 16 * atan_inv(5, bits) - 4 * atan_inv(239, bits)  # pi * 2^bits
    frac = ((2 << (2 * bits)) // pi) >> (bits - 1280)  # 2/pi's first 1280 fraction bits
    want = [(frac >> (32 * (39 - i))) & 0xFFFFFFFF for i in range(40)]
    header = (DEVICE_INCLUDE / "jaxtile" / "hip_math.h").read_text()
    table = header[header.index("kTwoOverPiBits[40] = {"):].split("}")[0]
    got = [int(w.rstrip("u"), 16) for w in re.findall(r"0x[0-9A-F]+u", table)]
    assert got == want
