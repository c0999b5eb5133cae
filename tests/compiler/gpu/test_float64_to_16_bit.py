"""float64 -> float16 / bfloat16 on the GPUs is one rounding, as XLA (ml_dtypes) makes it.
Through float32 it is two: a value just past a tie between two 16-bit neighbours, by less
than float32 resolves, becomes the tie and then rounds to even, the wrong way half the time.

The implementations, written apart: the GPUs' in the device header (CUDA: ``cvt.rn.f16.f64``
for float16, and for bfloat16 a narrowing to float32 rounding to odd before the float32
conversion; AMD: that narrowing for both, ``device_hip.h``) and the emulator's, in floating
point (``device_emu.h``)."""

import ctypes
import re
import subprocess

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import build
from jaxtile.compiler.cuda import nvrtc
from jaxtile.compiler.cuda import toolchain as cuda_toolchain
from jaxtile.compiler.cuda.compile import compile_to_library
from jaxtile.compiler.emulator.build import DEVICE_INCLUDE
from jaxtile.compiler.hip import toolchain as hip_toolchain
from jaxtile.compiler.target import parse_target

SIXTEEN = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
IDS = ["float16", "bfloat16"]


def _sweep(fmt):
    """float64 values at every rounding decision of ``fmt`` (a sample of the binades for
    bfloat16): each value, each tie between neighbours, the ties moved by 2^-40 relative
    (float32 would make them ties), the nearest doubles around each, past the largest
    finite value, subnormals and below, inf, NaN and -0."""
    with np.errstate(invalid="ignore"):
        bits = np.arange(1 << 16, dtype=np.uint16).view(fmt).astype(np.float64)
    finite = np.unique(np.abs(bits[np.isfinite(bits)]))
    if fmt == np.dtype(ml_dtypes.bfloat16):
        # every binade's first and last values and a sample between: 65536 ties otherwise
        keep = np.zeros(finite.size, bool)
        keep[::37] = keep[:300] = keep[-300:] = True
        mant = (finite.view(np.uint64) >> 45) & 0xff
        keep |= (mant <= 2) | (mant >= 0xfd)
        finite = finite[keep]
    step = np.diff(finite)
    top = finite[-1] + step[-1]
    ties = np.concatenate([(finite[:-1] + finite[1:]) / 2, [(finite[-1] + top) / 2]])
    points = np.concatenate([finite, ties, ties * (1 + 2.0 ** -40), ties * (1 - 2.0 ** -40),
                             [top, 2 * top, 1e300, 1e-300, 5e-324]])
    near = np.concatenate([np.nextafter(points, np.inf), np.nextafter(points, -np.inf), points])
    values = np.concatenate([near, [np.inf, np.nan, 0.0]])
    return np.concatenate([values, -values])


def _want(x, fmt):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x).astype(fmt)


def _through_float32(x, fmt):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x).astype(np.float32).astype(fmt)


def _check(got, x, fmt, what):
    """``got`` (16-bit values of ``fmt``) is ml_dtypes' single rounding of ``x``; the sweep
    holds values where rounding through float32 differs (so the check can fail)."""
    want = _want(x, fmt)
    assert (_through_float32(x, fmt).view(np.uint16) != want.view(np.uint16)).sum() > 100
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(np.asarray(got).astype(np.float32)), nan), what
    bad = np.flatnonzero(~nan & (np.asarray(got).view(np.uint16) != want.view(np.uint16)))
    assert bad.size == 0, f"{what}: {bad.size} differ, e.g. at x = {x[bad[:3]]!r}: got " \
        f"{np.asarray(got).view(np.uint16)[bad[:3]]}, want {want.view(np.uint16)[bad[:3]]}"


# --- the GPUs' narrowing, compiled for the host ---------------------------------------------

# device_hip.h's conversions from double, built from the same pieces on the host: float8.h's
# narrowing to odd, then the float32 conversions (v_cvt_f16_f32's round to nearest even is
# the host's _Float16 conversion; bfloat16, hip_math.h's integer rounding). CUDA's bfloat16
# is the same narrowing before cvt.rn.bf16.f32.
_HOST = r"""
#include <stdint.h>
#define JT_DEVICE inline
namespace jaxtile {
struct fp8e4m3 { uint8_t bits; };
struct fp8e5m2 { uint8_t bits; };
}
#include <jaxtile/float8.h>
#include <jaxtile/hip_math.h>
using namespace jaxtile;
extern "C" {
void f64_to_f16(const double* x, uint16_t* o, int n) {
  for (int i = 0; i < n; ++i)
    o[i] = __builtin_bit_cast(uint16_t, static_cast<_Float16>(f8_::narrow_to_odd(x[i])));
}
void f64_to_bf16(const double* x, uint16_t* o, int n) {
  for (int i = 0; i < n; ++i) o[i] = math_::bf16_rne_bits(f8_::narrow_to_odd(x[i]));
}
}
"""


@pytest.fixture(scope="module")
def host_narrowing(tmp_path_factory):
    if hip_toolchain.clang_path() is None:
        pytest.skip(f"no clang for AMD GPUs (it builds hip_math.h): {hip_toolchain.INSTALL_HINT}")
    tmp = tmp_path_factory.mktemp("narrowing")
    src, so = tmp / "narrowing.cc", tmp / "narrowing.so"
    src.write_text(_HOST)
    subprocess.run([hip_toolchain.clang_path(), "-x", "c++", "-std=c++20", "-O2", "-fPIC",
                    "-shared", "-ffp-contract=off", f"-I{DEVICE_INCLUDE}", "-o", str(so),
                    str(src)], check=True, capture_output=True)
    return ctypes.CDLL(str(so))


@pytest.mark.parametrize("fmt", SIXTEEN, ids=IDS)
def test_the_gpus_narrowing_rounds_once(host_narrowing, fmt):
    x = np.ascontiguousarray(_sweep(fmt))
    out = np.empty(x.shape, np.uint16)
    fn = getattr(host_narrowing, "f64_to_f16" if fmt == np.float16 else "f64_to_bf16")
    fn(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
       ctypes.c_int(x.size))
    _check(out.view(fmt), x, fmt, f"float64 -> {fmt} (GPU header, on the host)")


# --- generated code -------------------------------------------------------------------------

@jt.kernel
def _to_16_bit(x, *, cols=256):
    """``x`` as float16 and as bfloat16, in tiles of ``cols`` (the last one ragged)."""
    (n,) = x.shape
    i = jt.grid(jt.cdiv(n, cols))
    t = jt.fragment((cols,), x.dtype)
    jt.copy(x.at[i * cols], t)
    outs = []
    for to in SIXTEEN:
        out = jt.empty((n,), to)
        o = jt.fragment((cols,), to)
        o[...] = t[...].astype(to)
        jt.copy(o, out.at[i * cols])
        outs.append(out)
    return tuple(outs)


@pytest.mark.skipif(not nvrtc.available() and cuda_toolchain.nvcc_path() is None,
                    reason="no CUDA compiler: neither NVRTC (pip install 'jaxtile[cuda]') nor nvcc")
def test_cuda_converts_from_the_double_itself():
    """The PTX of the generated CUDA rounds the double to float16 in one instruction,
    ``cvt.rn.f16.f64`` (its result is then stored through ``cvt.rn.f16.f32``, exactly)."""
    target = parse_target("cuda:sm_80")
    with jax.enable_x64(True):
        low = _to_16_bit.lower(jax.ShapeDtypeStruct((1000,), jnp.float64), target="cuda:sm_80")
        ptx = compile_to_library(build.lowered_ir(low.kernel, target), target).ptx.decode()
    assert "cvt.rn.f16.f64" in ptx


@pytest.mark.slow
def test_the_cuda_emulator_rounds_once():
    """The emulator's own conversion (floating point, not the header's), in a CUDA kernel."""
    with jax.enable_x64(True):
        # a sample: the emulator runs a thread per element on the CPU
        x = np.concatenate([_sweep(f)[::16] for f in SIXTEEN])
        before = jt.backend()
        jax.clear_caches()
        jt.set_backend("cuda-emulator")
        try:
            got = jax.jit(_to_16_bit)(jnp.asarray(x))
        finally:
            jt.set_backend(before)
            jax.clear_caches()
    for fmt, g in zip(SIXTEEN, got):
        _check(np.asarray(g), x, fmt, f"cuda-emulator: float64 -> {fmt}")


def test_the_generated_source_rounds_the_double():
    """Every GPU dialect's source converts the double itself (``round_f16(double)``), not
    ``float(x)`` first."""
    x = jax.ShapeDtypeStruct((1000,), jnp.float64)
    with jax.enable_x64(True):
        for target in ("cuda:sm_80", "hip:gfx942"):
            src = _to_16_bit.lower(x, target=target).source
            for fn in ("round_f16", "round_bf16"):
                calls = re.findall(rf"{fn}\(([^()]*(?:\([^()]*\))?[^()]*)\)", src)
                assert calls and not any(c.startswith("float(") for c in calls), (target, fn,
                                                                                  calls)
