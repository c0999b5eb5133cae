"""FP8 wgmma (m64nNk32, e4m3 x e4m3 and e5m2 x e5m2 into f32, both operands K-major) for
``jt.gemm`` on 8-bit float tiles and ``jt.ops.scaled_matmul`` with ``transpose_b=True`` on
sm_90a. Numerics: every product of two 8-bit floats is exact in f32 and the emulator sums in
f32 (the ISA leaves the tensor core's accumulation width unstated), so operands whose sums
are exact in f32 give exactly numpy's result."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtile import ops
from jaxtile.compiler.gpu import gemm_plan
from jaxtile.compiler.target import parse_target

SM90A = parse_target("cuda:sm_90a")
_FP8 = [jnp.float8_e4m3fn, jnp.float8_e5m2]


@pytest.mark.parametrize("dtype", _FP8, ids=["e4m3", "e5m2"])
def test_planner_takes_k_major_fp8_on_wgmma_k32(dtype):
    p = gemm_plan.plan_gemm(64, 128, 64, dtype, dtype, np.float32, 128, target=SM90A,
                            trans_b=True)
    assert p.instr == gemm_plan.GemmInstr.WGMMA and p.note == "wgmma.m64n128k32"
    assert p.acc_layout.text() == "#wgmma(m64n128k32, warpgroups 1x1)"
    assert (p.a_tile.span, p.b_tile.span) == (64, 64)   # 64 one-byte elements of K per row
    # an MN-major operand has no FP8 wgmma (no imm-trans bits): not planned on it
    for ta, tb in ((False, False), (True, True)):
        q = gemm_plan.plan_gemm(64, 128, 64, dtype, dtype, np.float32, 128, target=SM90A,
                                trans_a=ta, trans_b=tb)
        assert q.instr != gemm_plan.GemmInstr.WGMMA
    # K not a multiple of 32, and plain sm_90: no wgmma either
    assert gemm_plan.plan_gemm(64, 128, 48, dtype, dtype, np.float32, 128, target=SM90A,
                               trans_b=True).instr != gemm_plan.GemmInstr.WGMMA
    assert gemm_plan.plan_gemm(64, 128, 64, dtype, dtype, np.float32, 128,
                               target=parse_target("cuda:sm_90"),
                               trans_b=True).instr != gemm_plan.GemmInstr.WGMMA


def _operands(m, n, k, dtype, seed):
    """Small integers (|x| <= 8): every FP8 value exact, every sum exact in f32."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-8, 9, (m, k)).astype(np.float32)
    b = rng.integers(-8, 9, (n, k)).astype(np.float32)
    return jnp.asarray(a, dtype), jnp.asarray(b, dtype), a @ b.T


def test_scaled_matmul_lowers_to_fp8_wgmma():
    a, b, _ = _operands(70, 90, 100, jnp.float8_e4m3fn, 0)
    s = jnp.ones((2,), jnp.float32)
    low = ops.scaled_matmul_kernel.lower(a, b, s, out_dtype=jnp.dtype(jnp.float32),
                                         transpose_b=True, target="cuda:sm_90a")
    assert "instr='wgmma.m64n64k32'" in low.lowered_ir
    assert "jaxtile::gemm_wgmma<64, 64, 32, 1, 1, false, true" in low.source
    assert "jaxtile::WgmmaTile<jaxtile::fp8e4m3, 64, 32, 32>" in low.source
    # B stored [K, N] (MN-major) stays on tile_gemm.h's multiply-add gemm
    low = ops.scaled_matmul_kernel.lower(a, b.T, s, out_dtype=jnp.dtype(jnp.float32),
                                         target="cuda:sm_90a")
    assert "instr='fma'" in low.lowered_ir


@pytest.mark.slow   # an emulator build and run per dtype
@pytest.mark.parametrize("dtype", _FP8, ids=["e4m3", "e5m2"])
def test_scaled_matmul_fp8_on_sm90a_is_exact(hopper, dtype):
    # 70 x 90 x 100: no dimension divides the 64 x 64 x 32 tiles
    a, b, exact = _operands(70, 90, 100, dtype, 1)
    sa, sb = jnp.float32(0.5), jnp.float32(3.0)
    got = jax.jit(lambda x, y: ops.scaled_matmul(x, y, sa, sb, transpose_b=True))(a, b)
    scales = jnp.stack([sa, sb])
    ref = ops.scaled_matmul_kernel.reference(a, b, scales, out_dtype=jnp.dtype(jnp.float32),
                                             transpose_b=True)
    # the products are exact, the sums too: the scaled sum is exactly numpy's
    np.testing.assert_array_equal(np.asarray(got), exact * np.float32(1.5))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


@pytest.mark.slow
def test_scaled_matmul_fp8_random_on_sm90a(hopper):
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((64, 96)), jnp.float8_e4m3fn)
    b = jnp.asarray(rng.standard_normal((128, 96)), jnp.float8_e4m3fn)
    got = jax.jit(lambda x, y: ops.scaled_matmul(x, y, 2.0, 0.25, transpose_b=True))(a, b)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T * 0.5
    np.testing.assert_allclose(np.asarray(got), exact, rtol=1e-5, atol=1e-5)
