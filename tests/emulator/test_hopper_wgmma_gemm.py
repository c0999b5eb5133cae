"""The gemm planner's wgmma path on sm_90a: the plan (instruction, warpgroups, each operand's
swizzle) is IR, the generated code issues wgmma over K between wgmma.fence, commit_group and
wait_group, and tile gemms run in the emulator against the kernel's reference semantics and
jnp; seeded mistakes (a missing wait, a descriptor swizzle other than the copies') are caught."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import ops
from jaxtile.compiler.cuda.emulated import emulator_launch
from jaxtile.compiler.emulator import EmulatedKernel, EmulatorError
from jaxtile.compiler.gpu import gemm_plan
from jaxtile.compiler.gpu.codegen.lower import generate
from jaxtile.compiler.gpu.layout import mma_accumulator, wgmma_accumulator
from jaxtile.compiler.gpu.layout import parse as parse_layout
from jaxtile.compiler.target import parse_target

SM90A = parse_target("cuda:sm_90a")


def _data(shape, dtype, seed):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


# -- the planner ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_planner_picks_wgmma_on_sm90a_only(dtype):
    dt = jnp.dtype(dtype)
    p = gemm_plan.plan_gemm(128, 128, 32, dt, dt, np.float32, 256, target=SM90A)
    assert p.instr == gemm_plan.GemmInstr.WGMMA and p.note == "wgmma.m64n128k16"
    assert p.warps == (2, 1)   # two warpgroups, one m64 step each
    assert p.acc_layout == wgmma_accumulator((128, 128), (2, 1), 256)
    # A [128, 32] K-major: 64-byte rows; B [32, 128] MN-major: 128-byte blocks of 64 columns.
    assert (p.a_tile.span, p.b_tile.span) == (64, 128)
    # plain sm_90 (no "a" features) keeps mma.sync
    q = gemm_plan.plan_gemm(128, 128, 32, dt, dt, np.float32, 256,
                            target=parse_target("cuda:sm_90"))
    assert q.instr == gemm_plan.GemmInstr.MMA16
    assert q.acc_layout == mma_accumulator((128, 128), q.warps, 256, "m16n8k16")


@pytest.mark.parametrize("shape, threads, why", [
    ((32, 64, 32), 128, "M is not a multiple of 64"),
    ((64, 48, 32), 128, "N per warpgroup is not 64, 128 or 256"),
    ((64, 64, 24), 128, "K is not a multiple of 16"),
    ((64, 64, 32), 96, "threads are not whole warpgroups"),
])
def test_planner_keeps_mma_sync_where_wgmma_does_not_fit(shape, threads, why):
    p = gemm_plan.plan_gemm(*shape, np.float16, np.float16, np.float32, threads, target=SM90A)
    assert p.instr != gemm_plan.GemmInstr.WGMMA, why


def test_planner_tf32_wgmma_takes_k_major_operands_only():
    f32 = gemm_plan.plan_gemm(64, 64, 32, np.float32, np.float32, np.float32, 128, target=SM90A,
                              trans_b=True)
    assert f32.instr == gemm_plan.GemmInstr.WGMMA and f32.note == "wgmma.m64n64k8"
    assert (f32.a_tile.span, f32.b_tile.span) == (128, 128)   # 32 f32 of K per row
    # the accumulator's label names the tf32 instruction's k8; the printed form parses back
    text = f32.acc_layout.text()
    assert text == "#wgmma(m64n64k8, warpgroups 1x1)"
    assert parse_layout(text, (64, 64), 128) == f32.acc_layout
    for ta, tb in ((False, False), (True, True)):   # an MN-major operand: mma.sync tf32
        p = gemm_plan.plan_gemm(64, 64, 32, np.float32, np.float32, np.float32, 128,
                                target=SM90A, trans_a=ta, trans_b=tb)
        assert p.instr == gemm_plan.GemmInstr.MMA_TF32


def test_planner_takes_register_a_on_wgmma_and_sm90_keeps_mma_sync():
    rs = gemm_plan.plan_gemm(64, 64, 32, np.float16, np.float16, np.float32, 128,
                             target=SM90A, a_in_registers=True)
    assert rs.instr == gemm_plan.GemmInstr.WGMMA and rs.a_tile is None
    assert rs.a_layout == wgmma_accumulator((64, 32), (1, 1), 128)
    old = gemm_plan.plan_gemm(64, 64, 32, np.float16, np.float16, np.float32, 128,
                              target=parse_target("cuda:sm_90"), a_in_registers=True)
    assert old.instr == gemm_plan.GemmInstr.MMA16


def _canonical_byte(tile, mn, k, mn_major):
    """The byte wgmma reads element (mn, k) from, by the canonical layouts' formulas (CUTLASS
    GMMA Layout_K_SW / Layout_MN_SW: LBO, SBO as the device header's descriptors set them),
    independent of SharedTile.offset; swizzled by the absolute address."""
    span, size = tile.span, tile.dtype.itemsize
    per_row = span // size
    if mn_major:   # rows are k: k-rows of `span` bytes, LBO between blocks of mn
        lbo, sbo = tile.rows * span, 8 * span
        at = (mn % per_row) * size + (mn // per_row) * lbo + (k % 8) * span + (k // 8) * sbo
    else:          # rows are mn; a k block of `per_row` columns is a whole rows x span block
        sbo = 8 * span
        at = (k // per_row) * tile.rows * span + (mn % 8) * span + (mn // 8) * sbo \
            + (k % per_row) * size
    mask = span // 16 - 1
    return at ^ (((at >> 7) & mask) << 4)


@pytest.mark.parametrize("rows, cols, mn_major", [
    (64, 16, False), (64, 32, False), (128, 64, False), (64, 128, False),
    (16, 64, True), (32, 128, True), (48, 256, True)])
def test_wgmma_tile_is_the_canonical_layout(rows, cols, mn_major):
    tile = gemm_plan.wgmma_tile(np.float16, rows, cols)
    offsets = tile.offsets()
    assert sorted(offsets.ravel()) == list(range(rows * cols))   # a permutation
    for r in range(rows):
        for c in range(cols):
            mn, k = (c, r) if mn_major else (r, c)
            assert 2 * offsets[r, c] == _canonical_byte(tile, mn, k, mn_major), (r, c)


# -- lowering ---------------------------------------------------------------------------------

def test_lowered_ir_and_source_show_the_wgmma_plan():
    a, b = _data((128, 96), jnp.float16, 0), _data((96, 64), jnp.float16, 1)
    low = ops.matmul.lower(a, b, target="cuda:sm_90a")
    text = low.lowered_ir
    assert "instr='wgmma.m64n64k16'" in text and "warpgroups=(1, 1)" in text
    assert "wgmma_swizzle=64" in text and "wgmma_swizzle=128" in text   # A K-major, B MN-major
    assert "#wgmma(m64n64k16, warpgroups 1x1)" in text
    src = low.source
    order = ["jaxtile::wgmma_fence();", "jaxtile::gemm_wgmma<64, 64, 32, 1, 1, false, false",
             "jaxtile::wgmma_commit_group();", "jaxtile::wgmma_wait_group<0>();",
             "jaxtile::wgmma_acc_store("]
    at = [src.index(s) for s in order]
    assert at == sorted(at)
    # one warpgroup: the plain ring (warp specialisation is inferred from two), whose set-up
    # (ring_setup.py) fences earlier generic writes before the first TMA load
    assert src.index("fence_proxy_async();") < at[0] and "setmaxnreg" not in src
    # the planned offsets are 1024-aligned
    for line in text.splitlines():
        if "wgmma_swizzle" in line:
            offset = int(line.split("offset=")[1].split(",")[0].split("}")[0])
            assert offset % gemm_plan.WGMMA_ALIGN == 0, line
    # plain sm_90 lowers the same kernel to mma.sync
    assert "wgmma" not in ops.matmul.lower(a, b, target="cuda:sm_90").source.split(
        "#include <jaxtile/tile_gemm.h>")[1]


# -- emulator runs ----------------------------------------------------------------------------

def _check(got, ref, exact, tol):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref, np.float32), **tol)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(exact, np.float32), **tol)


_TOL = {"float16": dict(rtol=2e-2, atol=5e-2), "bfloat16": dict(rtol=5e-2, atol=2e-1)}


def _matmul_case(m, k, n, dtype, ta, tb, seed):
    a = _data((k, m) if ta else (m, k), dtype, seed)
    b = _data((n, k) if tb else (k, n), dtype, seed + 1)
    got = jax.jit(lambda x, y: ops.matmul(x, y, transpose_a=ta, transpose_b=tb))(a, b)
    ref = ops.matmul.reference(a, b, transpose_a=ta, transpose_b=tb)
    x = a.T if ta else a
    y = b.T if tb else b
    exact = jnp.dot(x.astype(jnp.float32), y.astype(jnp.float32))
    _check(got, ref, exact, _TOL[dtype])


def test_matmul_f16_ragged_on_sm90a(hopper):
    # 64x64x32 block tiles: nothing divides (edge tiles read zeros, drop writes past the end)
    _matmul_case(70, 40, 90, "float16", False, False, 3)


@pytest.mark.slow   # the default run's emulator case is the f16 one above
def test_matmul_tf32_ragged_on_sm90a(hopper):
    # f32 with B stored [N, K]: both operands K-major, wgmma m64n64k8 on tf32 (inputs keep 10
    # mantissa bits: tf32 tolerances)
    a, b = _data((70, 40), jnp.float32, 4), _data((90, 40), jnp.float32, 5)
    assert "wgmma.m64n64k8" in ops.matmul.lower(a, b, transpose_b=True,
                                                 target="cuda:sm_90a").lowered_ir
    got = jax.jit(lambda x, y: ops.matmul(x, y, transpose_b=True))(a, b)
    ref = ops.matmul.reference(a, b, transpose_b=True)
    exact = jnp.dot(a, b.T, precision=jax.lax.Precision.HIGHEST)
    _check(got, ref, exact, dict(rtol=1e-2, atol=3e-2))
    # and not f32-exact: the products are of tf32 inputs
    assert not np.allclose(np.asarray(got), np.asarray(exact), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("ta, tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("m, k, n", [(128, 64, 128), (67, 77, 65)])
def test_matmul_on_sm90a(hopper, dtype, ta, tb, m, k, n):
    _matmul_case(m, k, n, dtype, ta, tb, m + k + n)


@jt.kernel(threads=256)
def _gemm_two_warpgroups(a, b, *, bm=128, bn=128, bk=32):
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)
    for kk in range(jt.cdiv(k, bk)):
        jt.copy(a.at[by * bm, kk * bk], a_s, pad=0)
        jt.copy(b.at[kk * bk, bx * bn], b_s, pad=0)
        jt.gemm(a_s, b_s, acc)
    jt.copy(acc, c.at[by * bm, bx * bn])
    return c


@pytest.mark.slow
def test_language_gemm_two_warpgroups_bf16_on_sm90a(hopper):
    a, b = _data((130, 70), jnp.bfloat16, 5), _data((70, 120), jnp.bfloat16, 6)
    assert "wgmma.m64n128k16" in _gemm_two_warpgroups.lower(a, b, target="cuda:sm_90a").lowered_ir
    got = jax.jit(lambda x, y: _gemm_two_warpgroups(x, y))(a, b)
    exact = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32))
    _check(got, _gemm_two_warpgroups.reference(a, b), exact, dict(rtol=1e-4, atol=1e-3))


# -- mutations: the emulator catches a plan the code does not follow --------------------------

def _run_source(low, mutate, a, b):
    """Runs the sm_90a code of ``low`` (a matmul), edited by ``mutate``, in the emulator."""
    code = generate(low._gpu_ir, SM90A)
    source = mutate(code.source)
    assert source != code.source
    params, launch = emulator_launch(code)     # with the tensor maps of its TMA loads
    kern = EmulatedKernel.build(source, code.symbol, params, launch, file="mutant.cu")
    c = np.full((a.shape[0], b.shape[1]), np.nan, np.float16)
    report = kern.run(np.asarray(a), np.asarray(b), c)
    return c, report


def _operands():
    a = np.random.default_rng(7).standard_normal((64, 32)).astype(np.float16)
    b = np.random.default_rng(8).standard_normal((32, 64)).astype(np.float16)
    return a, b, ops.matmul.lower(jnp.asarray(a), jnp.asarray(b), target="cuda:sm_90a")


def test_missing_wait_group_is_reported():
    a, b, low = _operands()
    with pytest.raises(EmulatorError, match="wgmma accumulator accessed too early"):
        _run_source(low, lambda s: s.replace("jaxtile::wgmma_wait_group<0>();", ""), a, b)


def test_descriptor_swizzle_other_than_the_copies_gives_wrong_numbers():
    a, b, low = _operands()
    # B [32, 64] is written with the 128-byte swizzle; the gemm reads it as 64-byte.
    src_b = "jaxtile::WgmmaTile<jaxtile::half, 32, 64, 128>>"
    assert src_b in low.source

    def mutate(s):
        head, call, tail = s.partition("jaxtile::gemm_wgmma<")
        return head + call + tail.replace(src_b, "jaxtile::WgmmaTile<jaxtile::half, 32, 64, 64>>",
                                          1)

    expected = a.astype(np.float32) @ b.astype(np.float32)
    # the harness itself: a no-op edit runs clean and right
    c, report = _run_source(low, lambda s: s + "\n", a, b)
    assert report["findings"] == []
    np.testing.assert_allclose(c.astype(np.float32), expected, rtol=2e-2, atol=5e-2)
    c, report = _run_source(low, mutate, a, b)
    assert not np.allclose(c.astype(np.float32), expected, rtol=2e-2, atol=5e-2)


# -- ptxas ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [jnp.float16, pytest.param(jnp.bfloat16, marks=pytest.mark.slow),
                                   pytest.param(jnp.float32, marks=pytest.mark.slow)],
                         ids=["f16", "bf16", "tf32"])
def test_generated_wgmma_gemm_compiles_for_sm90a_without_spills(dtype):
    from jaxtile.compiler import build
    from jaxtile.compiler.cuda import compile as cuda_compile
    from jaxtile.compiler.cuda import nvrtc, toolchain
    from jaxtile.compiler.cuda.sass import sass_counts

    if not nvrtc.available() and toolchain.nvcc_path() is None:
        pytest.skip("no CUDA compiler: neither NVRTC (pip install 'jaxtile[cuda]') nor nvcc")
    spec = jax.ShapeDtypeStruct((1024, 1024), dtype)
    tb = dtype == jnp.float32   # tf32 wgmma wants B stored [N, K]
    low = ops.matmul.lower(spec, spec, transpose_b=tb, target="cuda:sm_90a")
    assert "instr='wgmma." in low.lowered_ir
    kernel = build.lowered_ir(low.kernel, SM90A)
    compiled = cuda_compile.compile_to_library(kernel, SM90A)
    p = compiled.ptxas
    assert p.spill_stores == p.spill_loads == 0, p
    counts = sass_counts(compiled.cubin)
    if counts is not None:   # cuobjdump installed: the tensor-core work is HGMMA, not HMMA
        assert counts.get("HGMMA", 0) > 0 and counts.get("HMMA", 0) == 0, counts


def test_plot_layout_draws_a_wgmma_tile():
    a, b = _data((64, 32), jnp.float16, 0), _data((32, 64), jnp.float16, 1)
    svg = ops.matmul.lower(a, b, target="cuda:sm_90a").plot_layout("b_s")
    tile = gemm_plan.wgmma_tile(np.float16, 32, 64)
    # element [3, 9]: row 3's chunk 1 lands in chunk 1 ^ 3 = 2 of its 128-byte row
    assert tile.offset(3, 9) == 3 * 64 + 2 * 8 + 1
    assert "[3, 9]: offset 209, bank" in svg and "16-byte chunk 2 of its row" in svg
