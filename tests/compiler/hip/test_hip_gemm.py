"""jt.gemm on AMD: the planner picks MFMA from HipCaps, its accumulator layout is the MFMA
instructions' (checked against compiler/hip/mfma.py and AMD's calculator tables), its LDS
operand reads are free of bank conflicts under compiler/hip/lds.py's model, the generated
code's disassembly holds the tile math's MFMA count, and the wave64 emulator runs it against
the reference semantics and jnp.dot. Default run: the planner, layouts, banks and one small
emulator case per type; ``-m slow`` the rest."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_hip_lower import matmul, needs_clang
from test_hip_mfma import _table

import jaxtile as jt
from jaxtile import ops
from jaxtile.compiler import build
from jaxtile.compiler.gpu import layout as L
from jaxtile.compiler.gpu.gemm_plan import GemmInstr, plan_gemm, shared_tile
from jaxtile.compiler.hip import lds, mfma
from jaxtile.compiler.hip import lower as hip_lower
from jaxtile.compiler.target import Target, parse_target
from jaxtile.ops import _tiles
from jaxtile.ops.attention import default_tiles

SLOW = pytest.mark.slow
GFX942, GFX90A = parse_target("hip:gfx942"), parse_target("hip:gfx90a")


def _shape(target, label, operand="f16"):
    return next(s for s in target.caps.mfma if f"{s.m}x{s.n}x{s.k}" == label and
                s.operand == operand)


# -- the accumulator layout ------------------------------------------------------------------

@pytest.mark.parametrize("label", ["32x32x8", "16x16x16"])
def test_accumulator_is_the_instruction_layout_transposed(label):
    # gemm_mfma computes C^T, so lane l, register r holds C[col][row] of the instruction's D.
    lay = L.mfma_accumulator((int(label.split("x")[0]),) * 2, (1, 1), 64, label)
    ins = mfma.layout(_shape(GFX942, label))
    calc = _table("cdna3", ins.shape.instruction, "D")
    for lane in range(64):
        for r in range(ins.accumulator_registers):
            row, col = ins.accumulator(lane, r)
            assert lay.coords(lane, r) == (col, row)
            assert calc[row, col] == (r, lane, 0)


@pytest.mark.parametrize("label,shape,warps,threads", [
    ("32x32x8", (128, 64), (2, 1), 128), ("32x32x8", (64, 128), (2, 2), 512),
    ("16x16x16", (64, 32), (2, 2), 256), ("16x16x16", (16, 64), (1, 1), 64)])
def test_accumulator_over_waves(label, shape, warps, threads):
    lay = L.mfma_accumulator(shape, warps, threads, label)
    size = int(label.split("x")[0])
    waves = warps[0] * warps[1]
    thread, _ = lay.owners()
    assert lay.replication == threads // (64 * waves)
    rows, cols = shape[0] // warps[0], shape[1] // warps[1]
    regs = size * size // 64
    for t in range(64 * waves):
        w, lane = divmod(t, 64)
        for slot in range(lay.num_local):
            tile, r = divmod(slot, regs)
            mi, ni = divmod(tile, cols // size)
            want = (w // warps[1] * rows + mi * size + lane % size,
                    w % warps[1] * cols + ni * size + 8 * (r // 4) + 4 * (lane // size) + r % 4)
            assert lay.coords(t, slot) == want
            assert t in thread[want]
    assert lay.vector_width() == 4  # 4 consecutive columns per lane: 16-byte stores
    assert L.parse(lay.text(), shape, threads) == lay
    with pytest.raises(ValueError, match="MFMA tiles"):
        L.mfma_accumulator((48, 64), (1, 1), 64, "32x32x8")


# -- the planner -------------------------------------------------------------------------------

@pytest.mark.parametrize("target", [GFX942, GFX90A], ids=["gfx942", "gfx90a"])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_planner_picks_mfma_from_capabilities(target, dtype):
    p = plan_gemm(128, 128, 32, dtype, dtype, jnp.float32, 256, target=target)
    assert (p.instr, p.warps, p.replicas) == (GemmInstr.MFMA32, (2, 2), 1)
    assert p.acc_layout.text() == "#mfma(32x32x8, warps 2x2)"
    assert p.call("a", "b", "acc").startswith("jaxtile::gemm_ss<jaxtile::kGemmMfma32, 128, 128,")
    # Waves of 16 rows: the 16 x 16 instruction, whose step is K 32.
    p = plan_gemm(64, 64, 32, dtype, dtype, jnp.float32, 256, target=target, policy="rows")
    assert (p.instr, p.warps) == (GemmInstr.MFMA16, (4, 1))
    # Register A (attention's P @ V): the accumulator layout of an [m, k] gemm.
    p = plan_gemm(64, 64, 64, dtype, dtype, jnp.float32, 128, target=target,
                  a_in_registers=True)
    assert p.instr == GemmInstr.MFMA32 and p.warps == (2, 1)
    assert p.a_layout == L.mfma_accumulator((64, 64), (2, 1), 128, "32x32x8")
    assert p.call("a", "b", "acc").startswith("jaxtile::gemm_rs_mfma<jaxtile::kGemmMfma32,")


def test_what_no_mfma_takes_falls_back():
    with pytest.raises(jt.KernelError, match="no matrix instruction of gfx90a"):
        plan_gemm(64, 64, 32, jnp.float32, jnp.float32, jnp.float32, 128, target=GFX90A)
    for args in [(16, 16, 16, jnp.float16, jnp.float16),   # K below the 16x16 step of 32
                 (64, 64, 8, jnp.float16, jnp.float16),    # K below the 32x32 step of 16
                 (64, 64, 32, jnp.float16, jnp.bfloat16)]:  # mixed operands
        with pytest.raises(jt.KernelError, match="no matrix instruction of gfx942"):
            plan_gemm(*args, jnp.float32, 128, target=GFX942)
    # The choice follows the capabilities, not the vendor: without MFMA shapes, no MFMA.
    bare = Target("hip:bare", "hip", dataclasses.replace(GFX942.caps, mfma=()), "test")
    with pytest.raises(jt.KernelError, match="no matrix instruction"):
        plan_gemm(128, 128, 32, jnp.float16, jnp.float16, jnp.float32, 256, target=bare)
    # NVIDIA's plans are unchanged.
    cuda = plan_gemm(128, 128, 32, jnp.float16, jnp.float16, jnp.float32, 256,
                     target=parse_target("cuda:sm_80"))
    assert cuda.instr == GemmInstr.MMA16


def test_float32_takes_xf32_where_the_target_lists_it():
    # gfx942 lists v_mfma_f32_32x32x4_xf32 / 16x16x8_xf32 (gfx90a none: above, scalar).
    p = plan_gemm(128, 128, 32, jnp.float32, jnp.float32, jnp.float32, 256, target=GFX942)
    assert (p.instr, p.warps, p.instr.k_step) == (GemmInstr.MFMA32_XF32, (2, 2), 8)
    assert p.acc_layout == L.mfma_accumulator((128, 128), (2, 2), 256, "32x32x4")
    assert p.call("a", "b", "acc").startswith("jaxtile::gemm_ss<jaxtile::kGemmMfma32Xf32,")
    p = plan_gemm(64, 64, 32, jnp.float32, jnp.float32, jnp.float32, 256, target=GFX942,
                  policy="rows")
    assert (p.instr, p.warps, p.instr.k_step) == (GemmInstr.MFMA16_XF32, (4, 1), 16)
    # A float32 register operand has no MFMA (gemm_rs_mfma is 16-bit): not planned as one.
    with pytest.raises(jt.KernelError):
        plan_gemm(64, 64, 32, jnp.float32, jnp.float32, jnp.float32, 128, target=GFX942,
                  a_in_registers=True)
    # Without the xf32 shapes in the capabilities, float32 has no MFMA on gfx942 either.
    no_xf32 = Target("hip:no-xf32", "hip", dataclasses.replace(
        GFX942.caps, mfma=tuple(s for s in GFX942.caps.mfma if s.operand != "xf32")), "test")
    with pytest.raises(jt.KernelError, match="no matrix instruction"):
        plan_gemm(128, 128, 32, jnp.float32, jnp.float32, jnp.float32, 256, target=no_xf32)


# -- LDS banks ----------------------------------------------------------------------------------

@pytest.mark.parametrize("label,depth", [
    ("32x32x8", 16), ("32x32x8", 32), ("32x32x8", 64), ("32x32x8", 128), ("32x32x8", 256),
    ("16x16x16", 32), ("16x16x16", 64), ("16x16x16", 128), ("16x16x16", 256)])
@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_operand_reads_are_conflict_free(label, depth, dtype):
    # gemm_mfma's k-contiguous reads: lane l reads 8 values (16 bytes) at row l % S, k 8 (l / S)
    # of the step (K 16 for 32x32x8, 32 for 16x16x16), from the planner's swizzled tile;
    # every step and wave row offset.
    size = int(label.split("x")[0])
    step = 8 * 64 // size
    tile = shared_tile(jnp.dtype(dtype), 256, depth)
    assert tile.swizzled

    def addresses(t, k0, row0):
        return [2 * t.offset(row0 + lane % size, k0 + 8 * (lane // size)) for lane in range(64)]

    for k0 in range(0, depth, step):
        for row0 in range(0, 256, size):
            assert lds.cycles(addresses(tile, k0, row0), 16) == lds.ideal_cycles(16)
    # The same reads of a row-major tile conflict: the swizzle is what avoids it.
    plain = dataclasses.replace(tile, swizzled=False)
    assert lds.cycles(addresses(plain, 0, 0), 16) > lds.ideal_cycles(16)


# -- code generation and the disassembly -------------------------------------------------------

def _mfma_count(assembly):
    return len(re.findall(r"^\s*v_mfma_\S+", assembly, re.M))


@needs_clang
@pytest.mark.parametrize("gfx,dtype", [
    ("gfx942", jnp.float16), ("gfx90a", jnp.bfloat16),
    pytest.param("gfx942", jnp.bfloat16, marks=SLOW), pytest.param("gfx90a", jnp.float16,
                                                                   marks=SLOW)])
def test_disassembly_holds_the_tile_math(gfx, dtype):
    target = parse_target(f"hip:{gfx}")
    a = jax.ShapeDtypeStruct((64, 64), dtype)
    lowered = matmul.lower(a, a, target=target.name)
    assert "#mfma(32x32x8, warps 2x1)" in lowered.lowered_ir
    assert "jaxtile::gemm_ss<jaxtile::kGemmMfma32, 64, 64, 64, 2, 1" in lowered.source
    co = hip_lower.compile_code_object(build.lowered_ir(lowered.kernel, target), target)
    shape = _shape(target, "32x32x8", "f16" if dtype == jnp.float16 else "bf16")
    # 64 x 64 x 64 over 2 waves, 32 x 32 x 8 each: 64^3 / (32 * 32 * 8) / 2 = 16 per wave.
    assert _mfma_count(co.assembly) == 16
    assert set(re.findall(r"v_mfma_\S+", co.assembly)) == {shape.instruction}
    assert co.kernels["jt_matmul"].scratch_bytes == 0


@SLOW
@needs_clang
def test_library_matmul_mfma_count_per_k_step():
    # ops.matmul's default tiles (64 x 64 x 32, 2 waves) for gfx942: the pipelined loop's
    # body holds one k-tile of MFMAs: 64 * 64 * 32 / (32 * 32 * 8) / 2 = 8.
    a = jax.ShapeDtypeStruct((256, 256), jnp.float16)
    lowered = ops.matmul.lower(a, a, target="hip:gfx942")
    co = hip_lower.compile_code_object(build.lowered_ir(lowered.kernel, GFX942), GFX942)
    assert _mfma_count(co.assembly) % 8 == 0 and _mfma_count(co.assembly) > 0
    assert co.kernels["jt_matmul"].scratch_bytes == 0


# -- the emulator ---------------------------------------------------------------------------------

@SLOW
@needs_clang
def test_xf32_disassembly_holds_the_tile_math():
    a = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    for gfx, count in (("gfx942", 32), ("gfx90a", 0)):
        target = parse_target(f"hip:{gfx}")
        lowered = matmul.lower(a, a, target=target.name)
        co = hip_lower.compile_code_object(build.lowered_ir(lowered.kernel, target), target)
        # 64 x 64 x 64 over 2 waves, 32 x 32 x 4 each: 64^3 / (32 * 32 * 4) / 2 = 32 per wave;
        # gfx90a has no float32 MFMA that jaxtile uses: the scalar gemm.
        assert _mfma_count(co.assembly) == count, gfx
        if count:
            assert "#mfma(32x32x4, warps 2x1)" in lowered.lowered_ir
            assert set(re.findall(r"v_mfma_\S+", co.assembly)) == {"v_mfma_f32_32x32x4_xf32"}
        assert co.kernels["jt_matmul"].scratch_bytes == 0


@pytest.fixture(params=["hip-emulator", pytest.param("hip-emulator:gfx90a", marks=SLOW)])
def hip_emulator(request):
    before = jt.backend()
    jax.clear_caches()
    jt.set_backend(request.param)
    yield request.param
    jt.set_backend(before)
    jax.clear_caches()


def _data(shape, dtype, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _close(got, want, tol):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=tol, atol=tol)


@jt.kernel(threads=64)
def _one_wave(a, b):
    """One wave, one 32 x 32 tile, K 16: two MFMAs (the default run's emulated gemm)."""
    out = jt.empty((32, 32), jnp.float32)
    jt.grid(1)
    sa = jt.shared((32, 16), a.dtype)
    sb = jt.shared((16, 32), b.dtype)
    acc = jt.fragment((32, 32), jnp.float32)
    jt.copy(a.at[0, 0], sa)
    jt.copy(b.at[0, 0], sb)
    acc[...] = jnp.zeros((32, 32), jnp.float32)
    jt.gemm(sa, sb, acc)
    jt.copy(acc, out.at[0, 0])
    return out


def test_one_wave_gemm_runs_on_mfma(hip_emulator):
    a, b = _data((32, 16), jnp.float16), _data((16, 32), jnp.float16, 1)
    assert "#mfma(32x32x8, warps 1x1)" in _one_wave.lower(a, b, target="hip:gfx942").lowered_ir
    got = jax.jit(_one_wave)(a, b)
    _close(got, _one_wave.reference(a, b), 1e-5)
    _close(got, jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32), precision="highest"), 1e-5)


@SLOW
def test_xf32_mfma_takes_inputs_with_10_bit_mantissas(hip_emulator):
    """float32 gemms on gfx942 run on xf32 MFMA, which multiplies inputs with 10-bit
    mantissas, as tf32 does (the emulator drops the 13 low bits; 1 + 2^-11 below gives 1
    under truncation and under round-to-nearest-even alike); gfx90a has no float32 MFMA and
    keeps float32 products."""
    xf32 = hip_emulator == "hip-emulator"
    a, b = _data((32, 16), jnp.float32), _data((16, 32), jnp.float32, 1)
    layout = "#mfma(32x32x4, warps 1x1)" if xf32 else "#mfma"
    assert (layout in _one_wave.lower(a, b, target=f"hip:{'gfx942' if xf32 else 'gfx90a'}")
            .lowered_ir) == xf32
    got = jax.jit(_one_wave)(a, b)
    want = jnp.dot(a, b, precision="highest")
    _close(got, want, 2e-2 if xf32 else 1e-5)
    _close(got, _one_wave.reference(a, b), 2e-2 if xf32 else 1e-5)
    x = jnp.full((32, 16), 1 + 2.0 ** -11, jnp.float32)
    y = jnp.ones((16, 32), jnp.float32)
    assert np.all(np.asarray(_one_wave.reference(x, y)) == 16 + 16 * 2.0 ** -11)
    assert np.all(np.asarray(jax.jit(_one_wave)(x, y)) ==
                  (16.0 if xf32 else 16 + 16 * 2.0 ** -11))


@jt.kernel(threads=256)
def _four_waves(a, b, *, transpose_a=False):
    """A 32 x 32 x 64 tile over 4 waves: 16 x 16 MFMAs (the 32 x 32 ones would keep one wave
    busy), B stored [K, N] (read with gemm_mfma's rotated order), A [M, K] or [K, M]."""
    m = a.shape[1] if transpose_a else a.shape[0]
    out = jt.empty((m, b.shape[1]), jnp.float32)
    jt.grid(1)
    sa = jt.shared(a.shape, a.dtype)
    sb = jt.shared(b.shape, b.dtype)
    acc = jt.fragment((m, b.shape[1]), jnp.float32)
    jt.copy(a.at[0, 0], sa)
    jt.copy(b.at[0, 0], sb)
    acc[...] = jnp.zeros((m, b.shape[1]), jnp.float32)
    jt.gemm(sa, sb, acc, transpose_a=transpose_a)
    jt.copy(acc, out.at[0, 0])
    return out


@SLOW
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("ta", [False, True], ids=["a", "aT"])
def test_transposed_operands_on_16x16_mfma(hip_emulator, dtype, ta):
    a = _data((64, 32) if ta else (32, 64), dtype)
    b = _data((64, 32), dtype, 1)
    assert "#mfma(16x16x16, warps 2x2)" in _four_waves.lower(
        a, b, transpose_a=ta, target="hip:gfx942").lowered_ir
    got = jax.jit(lambda x, y: _four_waves(x, y, transpose_a=ta))(a, b)
    x = (a.T if ta else a).astype(jnp.float32)
    _close(got, _four_waves.reference(a, b, transpose_a=ta), 1e-4)
    _close(got, jnp.dot(x, b.astype(jnp.float32), precision="highest"), 1e-4)


@SLOW
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_gemm_runs_on_mfma(hip_emulator, dtype):
    a, b = _data((64, 64), dtype), _data((64, 64), dtype, 1)
    got = jax.jit(matmul)(a, b)
    _close(got, matmul.reference(a, b), 1e-4)
    _close(got, jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32)), 1e-4)


@SLOW
@pytest.mark.parametrize("dtype,mnk,ta,tb", [
    (jnp.float16, (128, 128, 64), False, False), (jnp.float16, (100, 70, 50), False, False),
    (jnp.bfloat16, (96, 80, 72), True, False), (jnp.float16, (64, 130, 40), False, True),
    (jnp.bfloat16, (33, 65, 97), True, True), (jnp.float32, (100, 70, 50), False, False)],
    ids=["f16-divides", "f16-ragged", "bf16-ta", "f16-tb", "bf16-ta-tb", "f32"])
def test_library_matmul(hip_emulator, dtype, mnk, ta, tb):
    m, n, k = mnk
    a = _data((k, m) if ta else (m, k), dtype)
    b = _data((n, k) if tb else (k, n), dtype, 1)
    got = jax.jit(lambda x, y: ops.matmul(x, y, transpose_a=ta, transpose_b=tb))(a, b)
    x = (a.T if ta else a).astype(jnp.float32)
    y = (b.T if tb else b).astype(jnp.float32)
    # float32: xf32 MFMA on gfx942 (10-bit mantissas), the scalar gemm on gfx90a.
    xf32 = dtype == jnp.float32 and hip_emulator == "hip-emulator"
    tol = 2e-2 if xf32 else {jnp.float16: 2e-2, jnp.bfloat16: 1e-1, jnp.float32: 1e-4}[dtype]
    _close(got, ops.matmul.reference(a, b, transpose_a=ta, transpose_b=tb), tol)
    _close(got, jnp.dot(x, y, precision="highest"), tol)


# -- attention's tiles for 64 KiB of LDS ------------------------------------------------------

@pytest.mark.parametrize("dtype,d,want", [
    (jnp.float16, 64, (64, 64)), (jnp.bfloat16, 128, (64, 32)), (jnp.float32, 64, (64, 32)),
    (jnp.float32, 128, (32, 16))])
def test_attention_tiles_fit_the_lds(dtype, d, want):
    q = jax.ShapeDtypeStruct((1, 8, 1024, d), dtype)
    lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
    specs = (q, q, q, lengths)
    for target in (GFX942, GFX90A):
        chosen = _tiles.rule(ops.attention_fwd, specs, target)
        assert (chosen["bm"], chosen["bn"]) == want
        need = (chosen["bm"] + 4 * chosen["bn"]) * d * jnp.dtype(dtype).itemsize
        assert need <= target.caps.lds_bytes
    # NVIDIA's shared memory holds the defaults: unchanged there and on the CPU.
    default = default_tiles(dtype, d)
    for target in (parse_target("cuda:sm_80"), None):
        chosen = _tiles.rule(ops.attention_fwd, specs, target)
        assert (chosen["bm"], chosen["bn"]) == default


@SLOW
def test_attention_d128_fits_the_lds():
    # The call's tiles come from the rule for the target: 64 x 64 at D = 128 (80 KiB of
    # operand tiles in two stages) would be a KernelError on gfx942.
    q = jax.ShapeDtypeStruct((1, 8, 1024, 128), jnp.float16)
    lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
    with pytest.raises(jt.KernelError, match="more than the 65536"):
        hip_lower.source(build.lowered_ir(ops.attention_fwd.lower(
            q, q, q, lengths, bm=64, bn=64, target="hip:gfx942").kernel, GFX942), GFX942)
    source = ops.attention_fwd.lower(q, q, q, lengths, target="hip:gfx942").source
    assert source.count("jaxtile::gemm_ss<jaxtile::kGemmMfma32, 64, 32, 128, 2, 1") == 1
    assert source.count("jaxtile::gemm_rs_mfma<jaxtile::kGemmMfma32, 64, 128, 32, 2, 1") == 1


def test_matmul_tiles_fit_the_lds():
    # matmul_relu's defaults (128 x 128 x 32, 3 stages) need 96 KiB at float32: two stages
    # fit AMD's 64 KiB; 16-bit operands and NVIDIA's shared memory keep the defaults.
    f32, f16 = (jax.ShapeDtypeStruct((512, 512), dt) for dt in (jnp.float32, jnp.float16))
    defaults = {"bm": 128, "bn": 128, "bk": 32, "stages": 3}
    assert _tiles.rule(ops.matmul_relu, (f32, f32), GFX942) == {**defaults, "stages": 2}
    assert _tiles.rule(ops.matmul_relu, (f16, f16), GFX90A) == defaults
    assert _tiles.rule(ops.matmul_relu, (f32, f32), parse_target("cuda:sm_80")) == defaults
    assert _tiles._fit_gemm_tiles(defaults, 4, 32 * 1024) == \
        {"bm": 64, "bn": 64, "bk": 32, "stages": 2}
