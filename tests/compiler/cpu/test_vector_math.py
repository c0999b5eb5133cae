"""The CPU backend's float32 exp, tanh and erfc (``compiler/cpu/vector_math.py``: ``exp_f32``,
Cephes' reduction and polynomial, ``tanh_f32``, an odd rational approximation, and
``erfc_f32``, exp(-x^2) times a rational function) against
float64 references and against XLA:CPU's own functions, which are the semantic reference: on
millions of inputs spanning all of float32, and exactly at the edges (signed zeros,
subnormals, saturation, infinities, NaN), both compiled alone and inside a kernel under
``jax.jit`` (where XLA's thread flushes subnormals)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import scipy.special
import tvm

import jaxtile as jt
from jaxtile.compiler.cpu import tir_emit
from jaxtile.compiler.cpu import vector_math as vm

N = 1 << 22
LANES = 16
EDGES = np.array(
    [0.0, -0.0, 1e-45, -1e-45, 1e-39, -1e-39, 1.1754942e-38, 1e-30, -1e-8, 2.0**-12,
     -(2.0**-12), 2.4e-4, 0.0004, 0.625, 1.0, 4.0, 7.9, 9.0, 9.0109, 9.011, 9.02, 9.0201,
     -9.0201, 44.0, 89.0, 1e30, 3.4028235e38, -3.4028235e38, np.inf, -np.inf, np.nan, -np.nan],
    np.float32,
)  # fmt: skip


def _ordered(v: np.ndarray) -> np.ndarray:
    """float32 bit patterns mapped to integers monotone in the value (ulp distance)."""
    bits = v.view(np.int32).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(11)
    quarter = N // 4
    magnitudes = 10.0 ** rng.uniform(-40, 1.3, quarter) * rng.choice([-1.0, 1.0], quarter)
    bits = rng.integers(0, 2**32, N - 3 * quarter - len(EDGES), dtype=np.uint32)
    with np.errstate(invalid="ignore"):  # the NaN edges
        return np.concatenate([
            EDGES, rng.uniform(-10, 10, quarter), rng.uniform(-1, 1, quarter),
            magnitudes, bits.view(np.float32),  # every exponent, NaNs, infs, subnormals
        ]).astype(np.float32)  # fmt: skip


def _compile(fn, name, tmp_path_factory, cpu=None):
    """``y = fn(x)`` over ``N`` elements in vectors of ``LANES``, compiled for the LLVM CPU
    ``cpu`` (the host's by default)."""
    kb = tir_emit.KernelBuilder(name, [("x", (N,), "float32"), ("y", (N,), "float32")])
    x, y = kb.buffers
    with kb.block_loop() as b:
        with kb.loop("i", LANES, kind="vectorized") as i:
            kb.store(y, [b * LANES + i], fn(x[b * LANES + i]))
    lib = tir_emit.build(kb.finish(), cpu or tir_emit.host_cpu())
    path = str(tmp_path_factory.mktemp(name) / f"{name}.so")
    tir_emit.export(lib, path)
    return lib, tvm.runtime.load_module(path)[name]


@pytest.fixture(scope="module")
def tanh_kernel(tmp_path_factory):
    return _compile(vm.tanh_f32, "tanh", tmp_path_factory)


@pytest.fixture(scope="module")
def erfc_kernel(tmp_path_factory):
    return _compile(vm.erfc_f32, "erfc", tmp_path_factory)


def _run(fn, xs: np.ndarray) -> np.ndarray:
    out = tvm.runtime.tensor(np.zeros(len(xs), np.float32))
    fn(0, len(xs) // LANES, tvm.runtime.tensor(xs), out)
    return out.numpy()


# exp's own edges: the clamps, where exp overflows (88.72284) and leaves the normal
# (-87.33655) and subnormal (-103.97208) range, NaNs with payloads of either sign.
EXP_EDGES = np.array(
    [88.0, 88.72283, 88.72284, 88.7229, 89.0, 89.01, 100.0, -87.33654, -87.33655, -100.0,
     -103.27893, -103.97207, -103.97208, -103.9721, -104.0, -104.01, -1e30],
    np.float32,
)  # fmt: skip
NAN_PAYLOADS = np.array([0x7F800001, 0x7FC12345, 0x7FFFFFFF, 0xFF800001, 0xFFC00000,
                         0xFFFFFFFF], np.uint32).view(np.float32)


def _exp_inputs() -> np.ndarray:
    """Every 1024th float32 of [-104.0, 89.0] (both signs, subnormal results included), the
    points halfway between multiples of ln 2 (where the reduction's n changes) and just
    beside them, and the edges."""
    pos = np.arange(0, 0x42B20000, 1024, dtype=np.uint32)
    neg = np.arange(0x80000000, 0xC2D00000, 1024, dtype=np.uint32)
    ties = (np.arange(-151, 130) + 0.5) * np.log(2.0)
    ties = np.concatenate([ties, np.nextafter(ties, -np.inf), np.nextafter(ties, np.inf)])
    xs = np.concatenate([EDGES, EXP_EDGES, NAN_PAYLOADS, ties.astype(np.float32),
                         pos.view(np.float32), neg.view(np.float32)]).astype(np.float32)
    return np.concatenate([xs, np.zeros(-len(xs) % N, np.float32)])  # whole runs


@pytest.mark.parametrize("cpu", ["x86-64-v3", "host"])
def test_exp_f32_within_one_ulp_on_both_isas(tmp_path_factory, cpu):
    """exp_f32 compiled for AVX2 (8 lanes a vector, 16 registers) and for the host: within
    1 ulp of the float64 exp everywhere, subnormal results included; inf past 88.72284, 0
    below -103.97208 and for -inf, NaN for every NaN (a payload must not reach the result's
    exponent bits), and nothing else NaN."""
    _, fn = _compile(vm.exp_f32, f"exp_{cpu.replace('-', '_')}", tmp_path_factory,
                     None if cpu == "host" else cpu)
    xs = _exp_inputs()
    got = np.concatenate([_run(fn, xs[i:i + N]) for i in range(0, len(xs), N)])
    with np.errstate(over="ignore", invalid="ignore"):  # to inf; NaN cast to float32
        want = np.exp(xs.astype(np.float64)).astype(np.float32)
    nan = np.isnan(xs)
    np.testing.assert_array_equal(np.isnan(got), nan)
    ok = ~nan
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    np.testing.assert_array_equal(got[ok & (want == 0)], 0.0)
    err = np.abs(_ordered(got[ok]) - _ordered(want[ok]))
    assert err.max() <= 1, (err.max(), xs[ok][err.argmax()])
    assert np.count_nonzero(err) < 0.01 * len(err)  # about 0.8% of them


def test_tanh_f32_is_one_division_and_no_exp(tanh_kernel):
    """The point of the rational form: one vector division, multiply-adds, no exp."""
    lib, _ = tanh_kernel
    ll = lib.inspect_source("ll")
    assert ll.count("fdiv <16 x float>") + ll.count("fdiv <8 x float>") >= 1
    assert "@expf" not in ll and "@tanhf" not in ll and "floor" not in ll
    assert "<16 x float>" in ll or "<8 x float>" in ll, "the loop was not vectorised"


def test_tanh_f32_against_float64_and_xla(tanh_kernel):
    _, fn = tanh_kernel
    xs = _inputs()
    got = _run(fn, xs)
    want = np.tanh(xs.astype(np.float64)).astype(np.float32)
    xla = np.asarray(jax.jit(jnp.tanh)(xs))
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(np.isnan(xla), nan)
    ok = ~nan
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))
    assert np.all(np.abs(got[ok]) <= 1.0)
    # XLA's own tanh is 5 ulp off float64 at worst, ours 5 too on these inputs (6 on one
    # in millions elsewhere), and 0.4 ulp on average against XLA's 0.5.
    err = np.abs(_ordered(got[ok]) - _ordered(want[ok]))
    assert err.max() <= 6 and err.mean() < 0.5, (err.max(), err.mean())
    assert np.abs(_ordered(got[ok]) - _ordered(xla[ok])).max() <= 8
    # Exactly +-1 where tanh rounds to it, x itself where tanh(x) rounds to x.
    big = ok & (np.abs(xs) >= 9.0201)
    np.testing.assert_array_equal(got[big], np.sign(xs[big]))
    np.testing.assert_array_equal(got[big], xla[big])
    tiny = np.abs(xs) < 2.0**-12
    np.testing.assert_array_equal(got[tiny].view(np.uint32), xs[tiny].view(np.uint32))


@jt.kernel
def _tanh_tiles(x, *, rows=8, cols=32):
    out = jt.empty(x.shape, x.dtype)
    j, i = jt.grid(jt.cdiv(x.shape[1], cols), jt.cdiv(x.shape[0], rows))
    t = jt.fragment((rows, cols), x.dtype)
    jt.copy(x.at[i * rows, j * cols], t)
    t[...] = jnp.tanh(t[...])
    jt.copy(t, out.at[i * rows, j * cols])
    return out


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16],
                         ids=["f32", "bf16", "f16"])
def test_tanh_kernel_under_jit_matches_xla(dtype):
    """Inside a kernel under jax.jit (XLA's thread, subnormals flushed), on a shape the tiles
    do not divide: bit-exact to XLA on the edges (subnormals kept, signed zeros, +-1, NaN),
    within XLA's own accuracy elsewhere; bfloat16 and float16 round the float32 result once,
    like XLA."""
    rng = np.random.default_rng(5)
    vals = np.concatenate([EDGES, rng.normal(0, 3, 37 * 45 - len(EDGES))]).astype(np.float32)
    with np.errstate(over="ignore"):  # 1e30 and 3.4e38 become inf in float16
        x = jnp.asarray(vals.reshape(37, 45).astype(dtype))
    got = np.asarray(jax.jit(_tanh_tiles)(x)).astype(np.float32)
    want = np.asarray(jax.jit(jnp.tanh)(x)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))
    xs = np.asarray(x).astype(np.float32)
    exact = ok & ((np.abs(xs) < 2.0**-12) | (np.abs(xs) >= 9.0201))
    np.testing.assert_array_equal(got[exact].view(np.uint32), want[exact].view(np.uint32))
    ref = np.asarray(_tanh_tiles.reference(x)).astype(np.float32)
    for what, other in (("compiled", got), ("reference", ref)):
        np.testing.assert_array_equal(np.isnan(other), np.isnan(want), err_msg=what)
        if dtype == np.float32:
            ulps = np.abs(_ordered(other[ok]) - _ordered(want[ok])).max()
            assert ulps <= 8, (what, ulps)
        else:  # one ulp of the half type where the float32 values straddle a rounding edge
            rtol = 2.0**-7 if dtype == ml_dtypes.bfloat16 else 2.0**-10
            np.testing.assert_allclose(other[ok], want[ok], rtol=rtol, atol=0, err_msg=what)


def test_erfc_f32_is_vectorised(erfc_kernel):
    lib, _ = erfc_kernel
    ll = lib.inspect_source("ll")
    assert "@erfcf" not in ll and "@expf" not in ll
    assert "fdiv <16 x float>" in ll or "fdiv <8 x float>" in ll


def test_erfc_f32_against_float64_and_xla(erfc_kernel):
    _, fn = erfc_kernel
    rng = np.random.default_rng(12)
    edges = np.array([0.0, -0.0, 1e-30, -1e-30, 0.5, 1.0, -1.0, 9.0, 10.0, 10.05, 10.1, 10.2,
                      -10.2, 30.0, -30.0, np.inf, -np.inf, np.nan], np.float32)
    with np.errstate(invalid="ignore"):
        xs = np.concatenate([
            edges, rng.uniform(-10.5, 10.5, N // 2), rng.uniform(-1, 1, N // 4),
            rng.integers(0, 2**32, N - N // 2 - N // 4 - len(edges), dtype=np.uint32)
            .view(np.float32)]).astype(np.float32)  # fmt: skip
    got = _run(fn, xs)
    want = scipy.special.erfc(xs.astype(np.float64)).astype(np.float32)
    xla = np.asarray(jax.jit(jax.lax.erfc)(xs))
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[:6], [1, 1, 1, 1, want[4], want[5]])
    np.testing.assert_array_equal(got[xs >= 10.1], 0.0)
    np.testing.assert_array_equal(got[xs <= -4], 2.0)
    normal = ~nan & (want >= np.finfo(np.float32).tiny)
    err = np.abs(_ordered(got[normal]) - _ordered(want[normal]))
    xla_err = np.abs(_ordered(xla[normal]) - _ordered(want[normal]))
    # XLA:CPU's erfc is 65 ulp off at worst here (2 on average), ours 10 (0.4).
    assert err.max() <= 12 and err.mean() < 0.6, (err.max(), err.mean())
    assert xla_err.max() > err.max()
    # Results below the normal range: XLA gives 0, ours the subnormal (0 where XLA's thread
    # flushes them).
    tiny = ~nan & ~normal
    assert np.abs(got[tiny] - want[tiny]).max() <= np.finfo(np.float32).tiny


@jt.kernel
def _map_tiles(x, *, fn, rows=8, cols=32):
    out = jt.empty(x.shape, x.dtype)
    j, i = jt.grid(jt.cdiv(x.shape[1], cols), jt.cdiv(x.shape[0], rows))
    t = jt.fragment((rows, cols), x.dtype)
    jt.copy(x.at[i * rows, j * cols], t)
    t[...] = fn(t[...])
    jt.copy(t, out.at[i * rows, j * cols])
    return out


def _exact_gelu(v):
    return jax.nn.gelu(v, approximate=False)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16],
                         ids=["f32", "bf16", "f16"])
def test_erfc_and_exact_gelu_under_jit_match_xla(dtype):
    """erfc, and for float32 the exact (erfc) GELU, in a kernel on a ragged shape against
    XLA's and float64 formulas. Half types compute erfc in float32 and round once, like XLA;
    the GELU chain is float32 only (in half types each of its ops rounds, see
    test_language_more_ops)."""
    rng = np.random.default_rng(6)
    vals = np.concatenate([[0.0, -0.0, np.inf, -np.inf, np.nan, -20.0, 20.0, -14.0],
                           rng.normal(0, 4, 37 * 45 - 8)]).astype(np.float32)
    x = jnp.asarray(vals.reshape(37, 45).astype(dtype))
    fns = [jax.lax.erfc] + ([_exact_gelu] if dtype == np.float32 else [])
    rtol = {np.float32: 2e-6, ml_dtypes.bfloat16: 2.0**-8, np.float16: 2.0**-11}[dtype]
    for fn in fns:
        got = np.asarray(jax.jit(lambda v, fn=fn: _map_tiles(v, fn=fn))(x)).astype(np.float32)
        want = np.asarray(jax.jit(fn)(x)).astype(np.float32)
        ref = np.asarray(_map_tiles.reference(x, fn=fn)).astype(np.float32)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        # XLA's float32 erfc itself is up to 65 ulp (4e-6) off.
        loose = max(rtol, 1e-5)
        for what, other in (("compiled", got), ("reference", ref)):
            np.testing.assert_allclose(other[ok], want[ok], rtol=loose, atol=1e-30,
                                       err_msg=f"{fn.__name__} {what}")
        xf = np.asarray(x).astype(np.float32)
        with np.errstate(invalid="ignore"):
            if fn is jax.lax.erfc:
                truth = scipy.special.erfc(xf.astype(np.float64))
            else:
                # erfc's argument -x / sqrt(2) is rounded to float32 first, as in the
                # formula (far out, erfc magnifies that rounding 2 x^2 times).
                arg = (-xf * np.float32(np.sqrt(0.5))).astype(np.float64)
                truth = 0.5 * xf.astype(np.float64) * scipy.special.erfc(arg)
        truth = truth.astype(dtype).astype(np.float32)
        # float32 subnormals are flushed in XLA's thread.
        tiny = max(float(np.finfo(dtype).smallest_subnormal), float(np.finfo(np.float32).tiny))
        np.testing.assert_allclose(got[ok], truth[ok], rtol=rtol, atol=tiny,
                                   err_msg=f"{fn.__name__} vs float64")
