"""bfloat16 GEMMs on the CPU: ``vdpbf16ps`` where the target has AVX512-BF16
(``compiler/cpu/gemm_bf16.py``), float32 FMAs on widened operands elsewhere
(``compiler/cpu/gemm.py``). Every test runs on both paths: the second builds for this
machine described without ``avx512_bf16``.

Results are checked against the kernel's reference semantics and a float64 numpy formula.
Tolerance: each output is a sum of K products of bfloat16 values (each exact in float32
while in its range), added in float32 (round to nearest): whatever the order, the error is
at most ``K * 2**-24 * sum_k |a_ik * b_kj|`` (the classic bound for recursive summation,
with a margin of 1 in the constant: ``(K - 1) u`` is the sharp one). XLA:CPU and
``vdpbf16ps`` both treat float32 subnormals as zero (inputs and results), so the formula
flushes subnormal inputs too, and each flushed product adds at most ``2**-126``. Where a
product is beyond float32's range, whether the sum overflows depends on the order and on
the rounding of products, so only the next check applies there. On the ``vdpbf16ps`` path
the result is bitwise that of the instruction's definition (see ``_vdpbf16ps``).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from described_cpu import describe_host
from gemm_kernels import transposed_matmul
from language_helpers import BF16, data

from jaxtile.compiler import build, target
from jaxtile.compiler.cpu import bf16_dot
from jaxtile.compiler.target import parse_target

# Whether the host can run vdpbf16ps (on an Intel CPU without AMX the GEMMs do not take it).
HAS_DOT = "avx512_bf16" in parse_target("cpu").caps.isa
TINY = np.float32(2.0 ** -126)
F32_MAX = float(np.finfo(np.float32).max)


@pytest.fixture(params=["dot", "fma"])
def path(request, monkeypatch):
    """The GEMM path kernels compile for: ``dot`` (this machine, if it has AVX512-BF16) or
    ``fma`` (this machine described without it). Both describe it without AMX, whose
    tiles would take the GEMMs over (``tests/compiler/cpu/test_gemm_amx.py`` has them), and
    as an AMD CPU, whose GEMMs dot where it has the instruction (``CpuCaps.bf16_dot``)."""
    if request.param == "dot" and not HAS_DOT:
        pytest.skip("the host CPU has no AVX512-BF16 (vdpbf16ps)")
    describe_host(monkeypatch, remove=target.AMX_FLAGS | (
        {"avx512_bf16"} if request.param == "fma" else set()), vendor="AuthenticAMD")
    caps = parse_target("cpu").caps
    assert caps.bf16_dot == (request.param == "dot") and not caps.amx_bf16
    return request.param


matmul = transposed_matmul


def _flush(x):
    """Subnormals to (signed) zero, as DAZ/FTZ do."""
    return np.where(np.abs(x) < TINY, np.copysign(0, x), x)


def _exact_and_bound(a, b):
    """``a @ b`` in float64 on DAZ inputs, the error bound of the module doc, and where
    some product is beyond float32's range (whether the sum overflows there depends on the
    order of the additions and on whether products are rounded before they are added)."""
    a, b = (_flush(np.asarray(x, np.float64)) for x in (a, b))
    k = a.shape[1]
    with np.errstate(invalid="ignore", over="ignore"):
        products = a[:, :, None] * b[None, :, :]
        exact = products.sum(axis=1)
        bound = k * 2.0 ** -24 * np.abs(products).sum(axis=1) + k * float(TINY)
    return exact, bound, (np.abs(products) > F32_MAX).any(axis=1)


def _vdpbf16ps(a, b):
    """``a @ b`` the way ``vdpbf16ps`` computes it (see the module doc): per pair of K, the
    odd product, then the even one, is added to the float32 accumulator and the sum
    rounded once (the product itself is never rounded: measured on Zen 4, where
    ``-3e38 + 2.98e38 * 2`` gives ``2.95e38``, not infinity); subnormal inputs and results
    are zero. float64 holds every product of two bfloat16 values and every such sum
    exactly, or within far less than half a float32 ulp of it, so one rounding to float32
    is the instruction's."""
    a, b = (_flush(np.asarray(x, np.float64)) for x in (a, b))
    if a.shape[1] % 2:
        a, b = np.pad(a, ((0, 0), (0, 1))), np.pad(b, ((0, 1), (0, 0)))
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for p in range(a.shape[1] // 2):
            for kk in (2 * p + 1, 2 * p):
                acc = _flush((acc + a[:, kk:kk + 1] * b[kk:kk + 1, :]).astype(np.float32))
    return acc


def _check(path, a, b, **params):
    """Compile, run and compare with the reference, the float64 formula and (on the dot
    path) the instruction's definition; ``a``, ``b`` as the kernel takes them."""
    a_op = np.asarray(a).T if params.get("ta") else np.asarray(a)
    b_op = np.asarray(b).T if params.get("tb") else np.asarray(b)
    got = np.asarray(jax.jit(lambda x, y: matmul(x, y, **params))(a, b))
    ref = np.asarray(matmul.reference(a, b, **params))
    exact, bound, overflows = _exact_and_bound(a_op, b_op)
    for name, value, want, slack in (("compiled", got, exact, 1),
                                     ("reference", ref, exact, 1),
                                     ("compiled vs reference", got, ref, 2)):
        with np.errstate(invalid="ignore"):
            err = np.abs(value.astype(np.float64) - want)
            close = np.where(np.isfinite(want), err <= slack * bound,
                             (value == want) | np.isnan(value) & np.isnan(want))
            # A finite sum past float32's range is an infinity of its sign.
            close |= (np.abs(want) > F32_MAX) & (value == np.sign(want) * np.inf)
        ok = close | overflows
        assert ok.all(), f"{name}: at {np.argwhere(~ok)[:5].tolist()}: {value[~ok][:5]}, " \
                         f"want {want[~ok][:5]}"
    # (AMX's bitwise model is tests/compiler/cpu/test_gemm_amx.py's.)
    if path == "dot":
        np.testing.assert_array_equal(got, _vdpbf16ps(a_op, b_op))
    return got


def _operands(rng, m, k, n, ta=False, tb=False, edges=False):
    a = data(rng, (k, m) if ta else (m, k), BF16, edges=edges)
    b = data(rng, (n, k) if tb else (k, n), BF16, edges=edges)
    return a, b


@pytest.mark.parametrize("mkn, tiles", [
    ((64, 64, 64), dict(bm=32, bn=32, bk=16)),       # tiles divide the shape
    ((37, 29, 45), dict(bm=16, bn=32, bk=8)),        # ragged edges, odd K
    ((20, 45, 19), dict(bm=8, bn=16, bk=5)),         # odd bk: an odd panel
    ((9, 1, 70), dict(bm=8, bn=64, bk=1)),           # K = 1
    ((70, 300, 33), dict(bm=64, bn=16, bk=32)),      # several panels, a partial vector
    ((30, 33, 50), dict(bm=8, bn=24, bk=9)),         # tile width not a whole vector
], ids=["even", "ragged", "odd_bk", "k1", "panels", "width24"])
def test_bf16_gemm_matches_numpy(rng, path, mkn, tiles):
    _check(path, *_operands(rng, *mkn), **tiles)


@pytest.mark.parametrize("ta, tb", [(True, False), (False, True), (True, True)],
                         ids=["ta", "tb", "ta_tb"])
def test_bf16_gemm_transposed_operands(rng, path, ta, tb):
    a, b = _operands(rng, 37, 29, 45, ta, tb)
    _check(path, a, b, bm=16, bn=32, bk=8, ta=ta, tb=tb)


def test_bf16_gemm_edge_values(rng, path):
    """NaN, infinities (times positive, negative and zero), huge products that stay
    finite, products and inputs below float32's normal range (flushed), and the random
    edge values of ``language_helpers.data``."""
    m, k, n = 12, 24, 20
    a = np.asarray(data(rng, (m, k), BF16, edges=False)).astype(np.float32)
    b = np.asarray(data(rng, (k, n), BF16, edges=False)).astype(np.float32)
    a[0, 3] = np.nan
    a[1, :] = 0.5
    a[1, 5] = np.inf
    b[5, :] = np.tile([2.0, -3.0, 0.0, 1.0], n // 4)
    a[2, :] = 0.0
    a[2, :3] = 1e38
    b[:3, :] = np.abs(b[:3, :]) / (1 + np.abs(b[:3, :]))   # sums below 3e38: finite
    a[3, :] = 1e-20
    b[7, :] = 1e-19                                       # products of 1e-39: subnormal
    a[4, :] = 1e-39                                       # bfloat16 subnormal inputs
    a16, b16 = (jnp.asarray(x.astype(BF16)) for x in (a, b))
    got = _check(path, a16, b16, bm=8, bn=16, bk=8)
    assert np.isnan(got[0]).all()
    assert (got[1, 0::4] == np.inf).all() and (got[1, 1::4] == -np.inf).all()
    assert np.isnan(got[1, 2::4]).all()
    assert np.isfinite(got[2]).all() and np.abs(got[2]).max() > 1e37
    assert (got[4] == 0).all()                            # DAZ: 1e-39 * b counts as 0
    _check(path, *_operands(rng, 19, 17, 23, edges=True), bm=8, bn=16, bk=8)


def test_the_dot_path_uses_vdpbf16ps(monkeypatch):
    """The generated code of a bfloat16 gemm calls ``vdpbf16ps`` on this machine (if it has
    it; described without AMX, whose tiles would take the gemm over, and as an AMD CPU),
    and a float32 gemm does not."""
    if not HAS_DOT:
        pytest.skip("the host CPU has no AVX512-BF16 (vdpbf16ps)")
    from jaxtile.compiler.cpu import lower, tir_emit

    describe_host(monkeypatch, remove=target.AMX_FLAGS, vendor="AuthenticAMD")
    cpu = parse_target("cpu")
    for dtype, uses in ((BF16, True), (np.float32, False)):
        x = jnp.zeros((40, 40), dtype)
        kernel = build.lowered_ir(matmul.lower(x, x).kernel, cpu)
        module = bf16_dot.resolve(tir_emit.build(lower.to_tir(kernel, cpu),
                                                 tir_emit.host_cpu()))
        assert ("vdpbf16ps" in module.inspect_source("asm")) == uses
    # LLVM's name for the CPU need not imply AVX512-BF16 (one it does not know is generic):
    # the rewrite adds the feature to the functions, so the code still compiles.
    x = jnp.zeros((40, 40), BF16)
    kernel = build.lowered_ir(matmul.lower(x, x).kernel, cpu)
    module = bf16_dot.resolve(tir_emit.build(lower.to_tir(kernel, cpu), "x86-64-v4"))
    assert "vdpbf16ps" in module.inspect_source("asm")


def test_an_intel_cpu_without_amx_widens_for_fmas(monkeypatch, rng):
    """On Intel's cores one ``vdpbf16ps`` port matches two FMA ports, so without AMX the
    bfloat16 gemm widens its operands for float32 FMAs (1.6x faster than the dot path on a
    Sapphire Rapids with AMX off): no ``vdpbf16ps`` in its code, the FMA path's results.
    Described so on any x86 host; run where the host has AVX-512."""
    from jaxtile.compiler.cpu import lower, tir_emit

    describe_host(monkeypatch, remove=target.AMX_FLAGS, vendor="GenuineIntel",
                  add={*target.ISA_LEVELS["x86-64-v4"], "avx512_bf16"})
    described = parse_target("cpu")
    assert not described.caps.bf16_dot and not described.caps.amx_bf16
    x = jnp.zeros((40, 40), BF16)
    kernel = build.lowered_ir(matmul.lower(x, x).kernel, described)
    asm = bf16_dot.resolve(tir_emit.build(lower.to_tir(kernel, described),
                                          "x86-64-v4")).inspect_source("asm")
    assert "vdpbf16ps" not in asm and "vfmadd" in asm
    if "avx512f" in set(target.host_isa()):
        _check("fma", *_operands(rng, 37, 29, 45, edges=True), bm=16, bn=32, bk=16)


def test_the_dot_path_is_checked_on_any_x86_host(monkeypatch):
    """Structurally, where the host lacks AVX512-BF16 too (a Zen 3): a CPU described with
    it (AVX-512 and AVX512-BF16 flags) compiles a bfloat16 gemm to ``vdpbf16ps`` on zmm
    registers, for LLVM's generic x86-64-v4 CPU (the rewrite adds the feature)."""
    from jaxtile.compiler.cpu import lower, tir_emit

    describe_host(monkeypatch, remove=target.AMX_FLAGS,
                  add={*target.ISA_LEVELS["x86-64-v4"], "avx512_bf16"}, vendor="AuthenticAMD")
    described = parse_target("cpu")
    assert described.caps.bf16_dot
    x = jnp.zeros((40, 40), BF16)
    kernel = build.lowered_ir(matmul.lower(x, x).kernel, described)
    asm = bf16_dot.resolve(tir_emit.build(lower.to_tir(kernel, described),
                                          "x86-64-v4")).inspect_source("asm")
    assert re.search(r"vdpbf16ps\s+.*%zmm", asm)
