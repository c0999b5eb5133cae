"""8-bit floats (float8_e4m3fn, float8_e5m2): conversions as ml_dtypes and XLA define them,
on every backend, and their uses in kernels (copies at ragged edges, gemm with per-tensor
scales, arithmetic refused).

Three implementations of the conversions, written apart: the GPUs' integer C++
(``ffi/device/jaxtile/float8.h``, compiled here for the host, and in every CUDA/HIP
kernel), the emulator's floating-point one (``device_emu.h``) and the CPU's integer TIR
(``compiler/cpu/float8.py``). Each is checked on all 256 bit patterns and on a sweep of
float32 and float64 values around every rounding boundary."""

import ctypes
import subprocess

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler.emulator.build import DEVICE_INCLUDE

FORMATS = [np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)]
IDS = ["e4m3fn", "e5m2"]
GPU_BACKENDS = ["cuda-emulator", "hip-emulator"]


def _all_values(fmt):
    """The 256 bit patterns of ``fmt``."""
    return np.arange(256, dtype=np.uint8).view(fmt)


def _sweep(fmt, wide=np.float32):
    """Values of ``wide`` around every rounding decision of ``fmt``: each value, each tie
    between neighbours and the nearest ``wide`` values on both sides of it, past the largest
    finite value (ties to overflow), subnormals and below, inf, NaN, -0 and random values
    over the whole range."""
    finite = _all_values(fmt).astype(np.float64)
    finite = np.unique(finite[np.isfinite(finite)])
    step = np.diff(finite)
    top = finite[-1] + step[-1]  # the next value the format would have
    ties = np.concatenate([(finite[:-1] + finite[1:]) / 2, [(finite[-1] + top) / 2]])
    points = np.concatenate([finite, ties, [top, 2 * top, 1e6, 3e38]]).astype(wide)
    inf = wide(np.inf)
    near = np.concatenate([np.nextafter(points, inf), np.nextafter(points, -inf), points])
    rng = np.random.default_rng(8)
    scale = float(finite[-1])
    rand = (rng.uniform(-1, 1, 2000) * np.exp2(rng.uniform(-30, np.log2(scale) + 2, 2000)))
    special = np.array([np.inf, np.nan, 0.0, 1e-45, 1e-40, np.finfo(wide).tiny], wide)
    values = np.concatenate([near, rand.astype(wide), special])
    if wide == np.float64:
        # just past a tie by far less than float32 resolves: rounding through float32 to
        # nearest would make the tie and round it to even, the wrong way half the time
        values = np.concatenate([values, ties * (1 + 2.0 ** -40), ties * (1 - 2.0 ** -40)])
    return np.concatenate([values, -values]).astype(wide)


def _want(x, fmt):
    """``x`` converted by ml_dtypes."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x).astype(fmt)


def _same_bits(got, want, what):
    """Equal bits, except that any NaN may stand for any NaN (XLA itself gives float8_e5m2
    NaN payloads that differ between its conversion paths)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, what
    g, w = got.astype(np.float32), want.astype(np.float32)
    nan = np.isnan(w)
    bad = np.flatnonzero((np.isnan(g) != nan) | (~nan & (got.view(np.uint8)
                                                          != want.view(np.uint8))))
    assert bad.size == 0, f"{what}: {bad.size} differ, e.g. at {bad[:5]}: got " \
        f"{got.view(np.uint8)[bad[:5]]}, want {want.view(np.uint8)[bad[:5]]}"


def _same_floats(got, want, what):
    """Equal float32 values, signed zeros and NaNs included (a NaN's sign is not compared:
    the GPUs' float32 -> float16 conversion gives the canonical NaN, as cvt.rn.f16.f32
    does)."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    signed = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[signed]), np.signbit(want[signed]),
                                  err_msg=what)
    np.testing.assert_array_equal(got, want, err_msg=what)


# --- the reference: XLA agrees with ml_dtypes ------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_xla_rounds_as_ml_dtypes(fmt):
    """The reference semantics are JAX's; the tests below compare with ml_dtypes, which is
    what XLA computes (checked here, so that a difference would show)."""
    for wide in (np.float32, np.float64):
        x = _sweep(fmt, wide)
        with jax.enable_x64(True):
            got = np.asarray(jax.jit(lambda v: v.astype(fmt))(x))
        _same_bits(got, _want(x, fmt), f"XLA {wide.__name__} -> {fmt}")
    v = _all_values(fmt)
    _same_floats(np.asarray(jax.jit(lambda a: a.astype(jnp.float32))(v)), v.astype(np.float32),
                 f"XLA {fmt} -> float32")


# --- the GPUs' header, compiled for the host -----------------------------------------------

_HOST = r"""
#include <stdint.h>
#define JT_DEVICE inline
namespace jaxtile {
struct fp8e4m3 { uint8_t bits; };
struct fp8e5m2 { uint8_t bits; };
}
#include <jaxtile/float8.h>
using namespace jaxtile;
extern "C" {
void e4m3_to_f32(const uint8_t* b, float* o, int n) {
  for (int i = 0; i < n; ++i) o[i] = to_float(fp8e4m3{b[i]}); }
void e5m2_to_f32(const uint8_t* b, float* o, int n) {
  for (int i = 0; i < n; ++i) o[i] = to_float(fp8e5m2{b[i]}); }
void f32_to_e4m3(const float* x, uint8_t* o, int n) {
  for (int i = 0; i < n; ++i) o[i] = to_fp8e4m3(x[i]).bits; }
void f32_to_e5m2(const float* x, uint8_t* o, int n) {
  for (int i = 0; i < n; ++i) o[i] = to_fp8e5m2(x[i]).bits; }
void f64_to_e4m3(const double* x, uint8_t* o, int n) {
  for (int i = 0; i < n; ++i) o[i] = to_fp8e4m3(x[i]).bits; }
void f64_to_e5m2(const double* x, uint8_t* o, int n) {
  for (int i = 0; i < n; ++i) o[i] = to_fp8e5m2(x[i]).bits; }
}
"""


@pytest.fixture(scope="module")
def host_float8(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("float8")
    src, so = tmp / "float8.cc", tmp / "float8.so"
    src.write_text(_HOST)
    subprocess.run(["g++", "-x", "c++", "-std=c++17", "-O2", "-fPIC", "-shared",
                    f"-I{DEVICE_INCLUDE}", "-o", str(so), str(src)], check=True,
                   capture_output=True)
    return ctypes.CDLL(str(so))


def _call(lib, name, x, out_dtype):
    x = np.ascontiguousarray(x)
    out = np.empty(x.shape, out_dtype)
    getattr(lib, name)(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                       ctypes.c_int(x.size))
    return out


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_device_header_conversions(host_float8, fmt):
    """float8.h, the conversions every CUDA and AMD kernel uses: all 256 patterns to
    float32, and float32 and float64 sweeps to 8 bits, bit for bit as ml_dtypes."""
    short = "e4m3" if fmt.name == "float8_e4m3fn" else "e5m2"
    bits = np.arange(256, dtype=np.uint8)
    _same_floats(_call(host_float8, f"{short}_to_f32", bits, np.float32),
                 bits.view(fmt).astype(np.float32), f"{fmt} -> float32")
    for wide in (np.float32, np.float64):
        x = _sweep(fmt, wide)
        got = _call(host_float8, f"f{np.dtype(wide).itemsize * 8}_to_{short}", x, np.uint8)
        _same_bits(got.view(fmt), _want(x, fmt), f"{wide.__name__} -> {fmt}")


# --- kernels: conversions on every backend -------------------------------------------------

@jt.kernel
def _converts(x, *, tos, cols=128):
    """``x.astype(to)`` for each of ``tos``, through fragments, in tiles of ``cols`` (the
    last one ragged)."""
    (n,) = x.shape
    i = jt.grid(jt.cdiv(n, cols))
    t = jt.fragment((cols,), x.dtype)
    jt.copy(x.at[i * cols], t)
    outs = []
    for to in tos:
        out = jt.empty((n,), to)
        o = jt.fragment((cols,), to)
        o[...] = t[...].astype(to)
        jt.copy(o, out.at[i * cols])
        outs.append(out)
    return tuple(outs)


def _convert(x, *, to):
    return _converts(x, tos=(np.dtype(to),))[0]


def _on(backend, f, *args):
    before = jt.backend()
    jax.clear_caches()
    jt.set_backend(backend)
    try:
        out = jax.jit(f)(*args)
        return tuple(map(np.asarray, out)) if isinstance(out, tuple) else np.asarray(out)
    finally:
        jt.set_backend(before)
        jax.clear_caches()


_WIDE = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _check_from_float8(backend):
    """All 256 patterns of each format to float32, float16, bfloat16 and the other format."""
    for fmt, other in zip(FORMATS, FORMATS[::-1]):
        v = _all_values(fmt)
        tos = (*_WIDE, other)
        got = _on(backend, lambda a, tos=tos: _converts(a, tos=tos), jnp.asarray(v))
        for to, g in zip(_WIDE, got):
            _same_floats(g.astype(np.float32), v.astype(to).astype(np.float32),
                         f"{backend}: {fmt} -> {to}")
        _same_bits(got[-1], _want(v.astype(np.float32), other), f"{fmt} -> {other}")


def _check_to_float8(backend, sources):
    """Sweeps of both formats' boundaries, in each of ``sources``, to both formats."""
    x = np.concatenate([_sweep(fmt) for fmt in FORMATS])
    for src in sources:
        xs = x.astype(src)
        got = _on(backend, lambda a: _converts(a, tos=tuple(FORMATS)), jnp.asarray(xs))
        for fmt, g in zip(FORMATS, got):
            _same_bits(g, _want(xs.astype(np.float32), fmt),
                       f"{backend}: {np.dtype(src).name} -> {fmt}")


def test_conversions_on_the_cpu():
    """In compiled CPU kernels, as ml_dtypes: all 256 patterns of each format to the wider
    floats and to the other format; float32 values around every rounding boundary to both."""
    _check_from_float8("cpu")
    _check_to_float8("cpu", _WIDE[:1])


@pytest.mark.slow
def test_conversions_from_16_bit_floats_on_the_cpu():
    _check_to_float8("cpu", _WIDE[1:])


@pytest.mark.slow
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_conversions_on_the_gpu_emulators(backend):
    """The emulator's own conversions (its floating-point implementation, not float8.h's),
    in CUDA kernels and in wave64 (AMD) kernels."""
    _check_from_float8(backend)
    _check_to_float8(backend, _WIDE)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda-emulator", marks=pytest.mark.slow)])
def test_float64_rounds_once(backend):
    """float64 -> 8 bits is one rounding (float32 in between would round some values just
    past a tie to the tie, then to even), as XLA does."""
    fmt = FORMATS[0]
    with jax.enable_x64(True):
        x = _sweep(fmt, np.float64)
        got = _on(backend, lambda a: _convert(a, to=fmt), jnp.asarray(x))
    _same_bits(got, _want(x, fmt), f"{backend}: float64 -> {fmt}")


# --- kernels: copies at ragged edges --------------------------------------------------------

@jt.kernel
def _copy_pad(x, *, pad, rows=8, cols=16):
    """Tiles of x through shared memory and a fragment, edges padded with ``pad``; every
    padded tile is written whole to an output of whole tiles."""
    m, n = x.shape
    gm, gn = jt.cdiv(m, rows), jt.cdiv(n, cols)
    out = jt.empty((gm * rows, gn * cols), x.dtype)
    same = jt.empty((m, n), x.dtype)
    bx, by = jt.grid(gn, gm)
    s = jt.shared((rows, cols), x.dtype)
    jt.copy(x.at[by * rows, bx * cols], s, pad=pad)
    t = jt.fragment((rows, cols), x.dtype)
    jt.copy(s, t)
    jt.copy(t, out.at[by * rows, bx * cols])
    jt.copy(t, same.at[by * rows, bx * cols])
    return out, same


def _check_copies(backend, fmt, shapes):
    rng = np.random.default_rng(1)
    for shape in shapes:
        bits = rng.integers(0, 256, shape).astype(np.uint8)
        x = jnp.asarray(bits.view(fmt))
        out, same = _on(backend, lambda a: _copy_pad(a, pad=-1.5), x)
        want = np.full(out.shape, -1.5, fmt)
        want[:shape[0], :shape[1]] = bits.view(fmt)
        if backend == "cpu":
            # the CPU moves bits: NaN patterns too
            np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8),
                                          err_msg=str(shape))
            np.testing.assert_array_equal(same.view(np.uint8), bits, err_msg=str(shape))
        # GPU tiles hold float32 values in registers: a NaN stays a NaN but
        # gets the header's NaN payload, as XLA's own copies do
        _same_bits(out.ravel(), want.ravel(), f"{backend} {shape}")
        _same_bits(same.ravel(), bits.view(fmt).ravel(), f"{backend} {shape}")
        # (XLA's own copies may change a NaN's payload: the reference is compared as values)
        ref_out, ref_same = _copy_pad.reference(x, pad=-1.5)
        _same_bits(np.asarray(ref_out).ravel(), want.ravel(), f"reference {shape}")
        _same_bits(np.asarray(ref_same).ravel(), bits.view(fmt).ravel(), f"reference {shape}")


_SHAPES = ((16, 32), (13, 21), (1, 5))


def test_copies_at_ragged_edges_on_the_cpu():
    """Every bit pattern moved unchanged through shared memory and a fragment, the edges of
    a ragged shape padded (default run: one format, one shape; the rest under ``slow``)."""
    _check_copies("cpu", FORMATS[0], _SHAPES[1:2])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", *GPU_BACKENDS])
@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_copies_at_every_shape(backend, fmt):
    _check_copies(backend, fmt, _SHAPES)


# --- gemm and scales --------------------------------------------------------------------------

def _fp8_operands(fmt, m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)) * 4
    b = rng.standard_normal((k, n)) * 4
    return jnp.asarray(a.astype(fmt)), jnp.asarray(b.astype(fmt))


def _check_scaled_matmul(backend, fmt, m, k, n, tiles):
    a, b = _fp8_operands(fmt, m, k, n)
    sa, sb = np.float32(0.375), np.float32(1.0 / 48)
    got = _on(backend, lambda x, y: jt.ops.scaled_matmul(x, y, sa, sb, **tiles), a, b)
    # independently: exact products in float64, scaled as the stated semantics say
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    want = (exact.astype(np.float32) * np.float32(sa * sb)).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    xla = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32)) * sa * sb
    np.testing.assert_allclose(got, np.asarray(xla), rtol=1e-5, atol=1e-5)
    ref = jt.ops.scaled_matmul_kernel.reference(a, b, jnp.array([sa, sb]),
                                               out_dtype=np.dtype(np.float32), **tiles)
    np.testing.assert_allclose(got, np.asarray(ref), rtol=1e-5, atol=1e-5)


_TILES = {"bm": 32, "bn": 32, "bk": 32}


def test_scaled_matmul_on_the_cpu():
    """Per-tensor scales on the float32 accumulator of an FP8 gemm, at a shape that does
    not divide the tiles, against the exact products, jnp and the reference."""
    _check_scaled_matmul("cpu", FORMATS[0], 50, 70, 37, _TILES)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_scaled_matmul_on_the_cpu_more(fmt):
    _check_scaled_matmul("cpu", fmt, 64, 64, 64, _TILES)
    _check_scaled_matmul("cpu", fmt, 50, 70, 37, _TILES)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_scaled_matmul_in_the_cuda_emulator(fmt):
    """The FMA gemm of the GPU planner, operands converted as they are read."""
    _check_scaled_matmul("cuda-emulator", fmt, 40, 48, 24,
                         {"bm": 32, "bn": 16, "bk": 16, "stages": 2})
    _check_scaled_matmul("cuda-emulator", fmt, 32, 32, 32,
                         {"bm": 32, "bn": 16, "bk": 16, "stages": 2})


def test_scaled_matmul_converts_the_output():
    """``out_dtype``: the scaled float32 result rounded once into it."""
    fmt = FORMATS[0]
    a, b = _fp8_operands(fmt, 32, 32, 32, seed=3)
    got = _on("cpu", lambda x, y: jt.ops.scaled_matmul(x, y, 0.5, 0.25, out_dtype=fmt,
                                                       bm=32, bn=32, bk=32), a, b)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    want = (exact.astype(np.float32) * np.float32(0.125)).astype(fmt)
    _same_bits(got.ravel(), want.ravel(), "float32 -> e4m3fn output")


def test_scaled_matmul_checks_its_operands():
    a, b = _fp8_operands(FORMATS[0], 8, 8, 8)
    with pytest.raises(ValueError, match="per-tensor scale"):
        jt.ops.scaled_matmul(a, b, jnp.ones(3), 1.0)
    with pytest.raises(TypeError, match="cast them"):
        jt.ops.scaled_matmul(a, b.astype(jnp.float8_e5m2), 1.0, 1.0)


# --- what 8-bit floats refuse -------------------------------------------------------------

@jt.kernel
def _add_fp8(x):
    out = jt.empty(x.shape, x.dtype)
    t = jt.fragment(x.shape, x.dtype)
    jt.copy(x, t)
    t[...] = t[...] + t[...]
    jt.copy(t, out)
    return out


@jt.kernel
def _gemm_into_fp8(x):
    out = jt.empty(x.shape, x.dtype)
    a = jt.shared(x.shape, x.dtype)
    jt.copy(x, a)
    c = jt.fragment(x.shape, x.dtype)
    c[...] = jnp.zeros(x.shape, x.dtype)
    jt.gemm(a, a, c)
    jt.copy(c, out)
    return out


def test_arithmetic_on_float8_is_refused_at_the_users_line():
    x = jnp.zeros((16, 16), jnp.float8_e4m3fn)
    for target in ("cpu", "cuda:sm_80"):
        with pytest.raises(jt.KernelError, match=r"elementwise add on float8_e4m3fn: 8-bit "
                           r"floats are storage types.*astype\(jnp.float32\)") as e:
            _add_fp8.lower(x, target=target)
        assert "test_float8.py" in str(e.value)
        with pytest.raises(jt.KernelError, match="accumulates in float32"):
            _gemm_into_fp8.lower(x, target=target)


# --- the real GPU toolchains compile float8.h -------------------------------------------------

@jt.kernel
def _convert_pair(x, y, *, rows=16, cols=32):
    """An 8-bit float tile times a float64 one, rounded to the other 8-bit format."""
    m, n = x.shape
    bx, by = jt.grid(jt.cdiv(n, cols), jt.cdiv(m, rows))
    t = jt.fragment((rows, cols), x.dtype)
    jt.copy(x.at[by * rows, bx * cols], t)
    u = jt.fragment((rows, cols), y.dtype)
    jt.copy(y.at[by * rows, bx * cols], u)
    out = jt.empty((m, n), jnp.float8_e5m2)
    o = jt.fragment((rows, cols), jnp.float8_e5m2)
    o[...] = (t[...].astype(y.dtype) * u[...]).astype(jnp.float8_e5m2)
    jt.copy(o, out.at[by * rows, bx * cols])
    return out


@pytest.mark.slow
def test_cuda_and_hip_compile_the_conversions():
    """ptxas (sm_80, sm_90a) and clang for gfx942 build the header's conversions, from
    float and from double, without spills (where the toolchain is installed)."""
    from jaxtile.compiler.cuda import toolchain as cuda_toolchain
    from jaxtile.compiler.hip import toolchain as hip_toolchain

    with jax.enable_x64(True):
        x = jnp.zeros((40, 70), jnp.float8_e4m3fn)
        y = jnp.zeros((40, 70), jnp.float64)
        ran = 0
        if cuda_toolchain.nvcc_path() is not None:
            for target in ("cuda:sm_80", "cuda:sm_90a"):
                low = _convert_pair.lower(x, y, target=target)
                assert "to_fp8e5m2(" in low.source or "round_f8e5m2(" in low.source
                assert low.ptxas.spill_stores == 0
                ran += 1
        if hip_toolchain.clang_path() is not None:
            res = _convert_pair.lower(x, y, target="hip:gfx942").hip_resources
            assert res.vgpr_spills == 0 and res.scratch_bytes == 0
            ran += 1
    if not ran:
        pytest.skip("neither nvcc nor clang for AMD GPUs is installed")


@jt.kernel
def _dot(a, b, *, pref):
    jt.grid(1)
    out = jt.empty((a.shape[0], b.shape[1]), jnp.float32)
    out[...] = jnp.dot(a[...], b[...], preferred_element_type=pref).astype(jnp.float32)
    return out


def test_dot_of_float8_tile_values():
    """``jnp.dot`` of 8-bit float tiles is the gemm into float32 when asked for a float32
    result, and a KernelError saying so otherwise."""
    a, b = _fp8_operands(FORMATS[1], 16, 24, 8, seed=5)
    got = _on("cpu", lambda x, y: _dot(x, y, pref=jnp.float32), a, b)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    np.testing.assert_allclose(got, exact.astype(np.float32), rtol=1e-6)
    with pytest.raises(jt.KernelError, match="preferred_element_type=jnp.float32"):
        _dot.lower(a, b, pref=None, target="cpu")
