"""tile_gemm.h's gemm_ss / gemm_rs, run in the emulator inside the planner's standalone GEMM
kernel (cp.async pipeline, masked edges): results against numpy, no race / bounds findings,
no excess bank-conflict wavefronts, and the accumulator layout the planner states."""

import re

import numpy as np
import pytest
from tile_gemm_helpers import SM80, excess_wavefronts, plan, run, tf32, unswizzled

from jaxtile.compiler.cuda.toolchain import compile_cubin, nvcc_path
from jaxtile.compiler.emulator import Buffer, EmulatedKernel, LaunchConfig
from jaxtile.compiler.emulator.build import DEVICE_INCLUDE
from jaxtile.compiler.gpu.device_rule import device_rule_violations
from jaxtile.compiler.gpu.gemm_kernel import gemm_kernel_source
from jaxtile.compiler.gpu.gemm_plan import GemmInstr, shared_tile

# (M, N, K): one that divides 64x64x32 / 128x128x32 block tiles, one that divides nothing.
DIVIDES = (256, 128, 128)
RAGGED = (200, 136, 72)


def _check(p, shape, ref_fn=None, rtol=1e-4, **kw):
    c, a, b, report = run(p, *shape, **kw)
    ref = (ref_fn or (lambda a, b: a.astype(np.float64) @ b.astype(np.float64)))(a, b)
    scale = np.abs(ref).max()
    np.testing.assert_allclose(c, ref, rtol=0, atol=rtol * scale)
    assert report["findings"] == []
    assert excess_wavefronts(report) == []
    lines = {e["line"] for e in report["bank_conflicts"]}
    return c, lines


SLOW = pytest.mark.slow  # variants of paths the default run covers once


@pytest.mark.parametrize("dtype,shape", [
    ("float16", DIVIDES), ("float16", RAGGED), ("bfloat16", RAGGED),
    pytest.param("bfloat16", DIVIDES, marks=SLOW)])
def test_mma16_gemm_ss(dtype, shape):
    p = plan(128, 128, 32, dtype)
    assert p.instr == GemmInstr.MMA16 and p.warps == (2, 2)
    _, lines = _check(p, shape)
    assert len(lines) == 3  # the cp.async stores and both ldmatrix loads were counted


# (False, False) covers ldmatrix for A and scalar loads for B, (True, True) the reverse.
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True),
                                             pytest.param(True, False, marks=SLOW),
                                             pytest.param(False, True, marks=SLOW)])
def test_tf32_against_tf32_rounded_numpy(trans_a, trans_b):
    p = plan(64, 64, 32, "float32", trans_a=trans_a, trans_b=trans_b)
    assert p.instr == GemmInstr.MMA_TF32
    c, _ = _check(p, RAGGED, lambda a, b: tf32(a).astype(np.float64) @ tf32(b).astype(np.float64),
                  rtol=2e-6)
    # The full-precision product is measurably different: the operands really were rounded.
    _, a, b, _ = run(p, *RAGGED)
    assert np.abs(c - a.astype(np.float64) @ b.astype(np.float64)).max() > 1e-4


@pytest.mark.parametrize("trans_a,trans_b", [(True, True), pytest.param(True, False, marks=SLOW),
                                             pytest.param(False, True, marks=SLOW)])
def test_f16_transposed_operands(trans_a, trans_b):
    _check(plan(64, 128, 32, "float16", trans_a=trans_a, trans_b=trans_b), RAGGED)


@pytest.mark.parametrize("dtype,acc,k", [("float64", "float64", 16), ("int32", "int32", 16),
                                        ("float16", "float32", 8)])
def test_fma_fallback(dtype, acc, k):
    # f16 with a K tile of 8 (below one m16n8k16 step) falls back to FMA too.
    p = plan(64, 64, k, dtype, acc, trans_b=dtype == "int32")
    assert p.instr == GemmInstr.FMA
    c, _ = _check(p, RAGGED, rtol=1e-12 if acc != "float32" else 1e-5)
    if dtype == "int32":
        _, a, b, _ = run(p, *RAGGED)
        np.testing.assert_array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("policy,warps", [("square", (2, 2)), ("rows", (4, 1)),
                                          ("cols", (1, 4))])
def test_warp_policies(policy, warps):
    p = plan(128, 128, 32, "float16", policy=policy)
    assert p.warps == warps and p.policy == policy
    _check(p, RAGGED)


@pytest.mark.parametrize("dtype,policy,warps", [
    ("float16", "auto", (4, 1)), ("bfloat16", "square", (2, 2)),
    pytest.param("float16", "cols", (1, 4), marks=SLOW)])
def test_gemm_rs_a_in_registers(dtype, policy, warps):
    # With several warp columns A's register layout is replicated across them.
    p = plan(64, 64, 32, dtype, a_in_registers=True, policy=policy)
    assert p.warps == warps
    _check(p, RAGGED)


@pytest.mark.parametrize("dtype,trans_b,rs", [
    ("float16", False, False), ("float32", True, False),
    pytest.param("float16", True, False, marks=SLOW),
    pytest.param("float16", False, True, marks=SLOW)])
def test_odd_number_of_n_atoms_per_warp(dtype, trans_b, rs):
    # 24 columns per warp: three n-atoms, the last B fragment loaded with ldmatrix.x2.
    p = plan(64, 48, 32, dtype, trans_b=trans_b, a_in_registers=rs, policy="square")
    assert p.n // p.warps[1] == 24
    ref = (lambda a, b: tf32(a).astype(np.float64) @ tf32(b).astype(np.float64)) \
        if dtype == "float32" else None
    _check(p, RAGGED, ref, rtol=2e-6 if dtype == "float32" else 1e-4)


@pytest.mark.parametrize("make", [
    lambda: plan(128, 128, 32, "float16"),
    lambda: plan(64, 64, 32, "float32", policy="cols"),
    lambda: plan(64, 64, 16, "float64", "float64", policy="rows"),
    lambda: plan(16, 16, 16, "float16", threads=256),  # 2 warps' work, replicated 4 times
], ids=["mma16", "tf32", "fma", "replicas"])
def test_accumulator_layout_is_what_the_device_produces(make):
    p = make()
    shape = (p.m * 2, p.n, p.k * 2)
    c, a, b, _, d = run(p, *shape, dump=True)
    lay = p.acc_layout
    elems = lay.elements()  # [threads, slots, 2]
    d = d.reshape(-1, p.threads, lay.num_local)  # per block (x fastest), thread, slot
    assert d.shape[0] == 2
    for blk in range(2):
        rows, cols = elems[..., 0] + blk * p.m, elems[..., 1]
        np.testing.assert_array_equal(d[blk], c[rows, cols])
    assert p.replicas == (4 if p.threads == 256 else 1)


def test_unswizzled_tiles_have_bank_conflicts():
    # The counter does see conflicts: without the swizzle every ldmatrix phase of A (64-byte
    # rows) hits 2 bank groups and of B (256-byte rows) one, so the zero above means something.
    _, _, _, report = run(unswizzled(plan(128, 128, 32, "float16")), 128, 128, 64)
    excess = excess_wavefronts(report)
    assert len(excess) == 2
    assert sorted(e["wavefronts"] // e["ideal_wavefronts"] for e in excess) == [4, 8]


_OFFSETS_KERNEL = """
#include <jaxtile/device.h>
#include <jaxtile/tile_gemm.h>
template <class L, int R, int C>
JT_DEVICE void dump(jaxtile::ptr<int> out, int tid) {
  for (int i = tid; i < R * C; i += 32) out[i] = L::offset(i / C, i % C);
}
JT_KERNEL void offsets(jaxtile::ptr<int> out) {
  const int tid = jaxtile::thread_idx().x;
  BODY
}
"""


def test_python_offsets_mirror_the_header():
    tiles = [shared_tile("float16", 128, 32), shared_tile("float16", 32, 128),
             shared_tile("float16", 16, 16), shared_tile("float32", 64, 32, 2),
             shared_tile("float32", 32, 8), shared_tile("float64", 16, 16),
             shared_tile("float16", 10, 20), shared_tile("float32", 8, 64, 2),
             shared_tile("float16", 16, 48), shared_tile("float32", 16, 24, 2)]
    assert [t.swizzled for t in tiles] == [True] * 6 + [False] + [True] * 3
    body, base = [], 0
    for t in tiles:
        body.append(f"dump<{t.cpp}, {t.rows}, {t.cols}>(out + {base}, tid);")
        base += t.elems
    src = _OFFSETS_KERNEL.replace("BODY", "\n  ".join(body))
    k = EmulatedKernel.build(src, "offsets", [Buffer("out", "int32")],
                             LaunchConfig((1, 1, 1), (32, 1, 1)), file="offsets.cu")
    out = np.zeros(base, np.int32)
    k.run(out)
    base = 0
    for t in tiles:
        got = out[base:base + t.elems].reshape(t.rows, t.cols)
        np.testing.assert_array_equal(got, t.offsets(), err_msg=t.cpp)
        assert sorted(got.ravel()) == list(range(t.elems))  # a permutation of the tile
        base += t.elems


def test_header_follows_the_device_rule():
    assert device_rule_violations((DEVICE_INCLUDE / "jaxtile" / "tile_gemm.h").read_text()) == []
    assert device_rule_violations(gemm_kernel_source(plan(64, 64, 32, "float16"), "g")) == []


def _bundle(plans) -> str:
    """Several generated kernels in one .cu (one nvcc run): each in its own namespace."""
    parts = ["#include <jaxtile/device.h>", "#include <jaxtile/tile_gemm.h>"]
    for i, (p, stages) in enumerate(plans):
        text = gemm_kernel_source(p, f"gemm_{i}", stages)
        text = re.sub(r"#include <[^>]+>\n", "", text)
        parts.append(f"namespace v{i} {{\n{text}\n}}")
    return "\n".join(parts)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvcc_compiles_every_path(arch):
    plans = [(plan(128, 128, 32, "float16"), 3),
             (plan(64, 64, 32, "bfloat16", a_in_registers=True), 2),
             (plan(64, 64, 32, "float32", trans_a=True), 3),
             (plan(64, 64, 32, "float32", trans_b=True, policy="cols"), 2),
             (plan(64, 64, 16, "float64", "float64", trans_a=True, trans_b=True), 2)]
    cubin = compile_cubin(_bundle(plans), arch, file="tile_gemm_bundle.cu")
    assert sorted(cubin.kernels) == [f"gemm_{i}" for i in range(len(plans))]
    for name, rep in cubin.kernels.items():
        assert rep.spill_stores == 0 and rep.spill_loads == 0, (name, rep)
    assert cubin.kernels["gemm_0"].shared_bytes == 48 * 1024
    assert SM80.caps.static_smem_bytes >= cubin.kernels["gemm_0"].shared_bytes


@pytest.mark.parametrize("stages,k", [
    (1, 136), (2, 24), (4, 24), (4, 136),
    pytest.param(1, 24, marks=SLOW), pytest.param(2, 136, marks=SLOW)])
def test_pipeline_depths_and_short_trip_counts(stages, k):
    # The emulator's race and cp.async-hazard checks judge the schedule of copy_schedule.py,
    # including a trip count (1) below the stages; the K edge is zero-filled by the copies.
    _check(plan(64, 64, 32, "float16"), (72, 64, k), stages=stages)


_ATTENTION_KERNEL = """
#include <jaxtile/device.h>
#include <jaxtile/tile_gemm.h>
// O = f16(Q @ K^T) @ V for one 64-row block: gemm_ss into S, an elementwise cast in the
// accumulator layout, then gemm_rs with P from registers (flash attention's two gemms).
JT_KERNEL JT_LAUNCH_BOUNDS(128) void qkv(jaxtile::ptr<const jaxtile::half> Q,
    jaxtile::ptr<const jaxtile::half> K, jaxtile::ptr<const jaxtile::half> V,
    jaxtile::ptr<float> O) {
  JT_SHARED(jaxtile::half, Qs, LQ::kElems);
  JT_SHARED(jaxtile::half, Ks, LK::kElems);
  JT_SHARED(jaxtile::half, Vs, LV::kElems);
  const int tid = jaxtile::thread_idx().x;
  for (int c = tid; c < BM * D / 8; c += 128)
    jaxtile::cp_async<16>(Qs + LQ::offset(c / (D / 8), c % (D / 8) * 8), Q + c * 8, 16);
  for (int c = tid; c < BN * D / 8; c += 128) {
    jaxtile::cp_async<16>(Ks + LK::offset(c / (D / 8), c % (D / 8) * 8), K + c * 8, 16);
    jaxtile::cp_async<16>(Vs + LV::offset(c / (D / 8), c % (D / 8) * 8), V + c * 8, 16);
  }
  jaxtile::cp_async_commit();
  jaxtile::cp_async_wait<0>();
  jaxtile::sync_threads();
  float s[NS];
  for (int i = 0; i < NS; ++i) s[i] = 0.0f;
  S_CALL
  jaxtile::half p[NS];
  for (int i = 0; i < NS; ++i) p[i] = jaxtile::to_half(s[i]);
  float o[NO];
  for (int i = 0; i < NO; ++i) o[i] = 0.0f;
  O_CALL
  const int tr = O_TR, tc = O_TC;
  TABLES
  for (int i = 0; i < NO; ++i) O[(tr + kRow[i]) * D + tc + kCol[i]] = o[i];
}
"""


@pytest.mark.parametrize("d", [64, 128])
def test_flash_attention_gemms_compose_without_conversion(d):
    bm, bn = 64, 64
    s = plan(bm, bn, d, "float16", trans_b=True, policy="rows")  # S = Q @ K^T
    o = plan(bm, d, bn, "float16", a_in_registers=True)          # O = P @ V
    assert o.a_layout == s.acc_layout
    tr, tc = o.acc_layout.thread_coord_exprs("tid")
    rows = [o.acc_layout.local_coords(i)[0] for i in range(o.acc_layout.num_local)]
    cols = [o.acc_layout.local_coords(i)[1] for i in range(o.acc_layout.num_local)]
    src = (_ATTENTION_KERNEL
           .replace("S_CALL", s.call("Qs", "Ks", "s")).replace("O_CALL", o.call("p", "Vs", "o"))
           .replace("O_TR", tr).replace("O_TC", tc)
           .replace("TABLES", f"constexpr int kRow[] = {{{', '.join(map(str, rows))}}};\n"
                              f"  constexpr int kCol[] = {{{', '.join(map(str, cols))}}};"))
    header = (f"constexpr int BM = {bm}, BN = {bn}, D = {d}, NS = {s.acc_layout.num_local}, "
              f"NO = {o.acc_layout.num_local};\nusing LQ = {s.a_tile.cpp};\n"
              f"using LK = {s.b_tile.cpp};\nusing LV = {o.b_tile.cpp};\n")
    src = src.replace("JT_KERNEL", header + "JT_KERNEL", 1)
    assert device_rule_violations(src) == []
    k = EmulatedKernel.build(src, "qkv", [Buffer(n, "float16") for n in "QKV"]
                             + [Buffer("O", "float32")], LaunchConfig((1, 1, 1), (128, 1, 1)),
                             file="qkv.cu")
    rng = np.random.default_rng(1)
    q, kk, v = (rng.standard_normal((n, d)).astype(np.float16) * 0.5 for n in (bm, bn, bn))
    out = np.zeros((bm, d), np.float32)
    report = k.run(q, kk, v, out)
    p = (q.astype(np.float32) @ kk.astype(np.float32).T).astype(np.float16)
    np.testing.assert_allclose(out, p.astype(np.float64) @ v.astype(np.float64), atol=2e-3)
    assert report["findings"] == [] and excess_wavefronts(report) == []
    if nvcc_path() is not None:
        rep = compile_cubin(src, "sm_80", file="qkv.cu").kernels["qkv"]
        assert rep.spill_stores == rep.spill_loads == 0, rep
