"""The hand-written warp-specialised sm_90a GEMM (TMA + mbarriers + wgmma): it runs in the
emulator with no finding and matches numpy and jnp, and nvcc/ptxas compile it for sm_90a
without spills."""

import jax.numpy as jnp
import numpy as np
import pytest
from emu_kernels import kernel_source
from hopper_kernels import gemm_args, gemm_sm90a

from jaxtile.compiler.cuda.toolchain import ToolchainError, compile_cubin, nvcc_path


@pytest.mark.parametrize(
    "M, N, K",
    [
        (128, 64, 256),   # one block tile, 4 k-tiles around the 2-stage ring
        (100, 52, 88),    # nothing divides the tiles: TMA zero-fills and clips
        pytest.param(200, 136, 328, marks=pytest.mark.slow),  # 2 x 3 blocks, 6 k-tiles
    ],
)
def test_gemm_sm90a_matches_numpy_and_jnp(M, N, K):
    args = gemm_args(M, N, K, seed=M + N + K)
    report = gemm_sm90a(M, N, K).run(*args)
    _check(args, report)


def test_gemm_sm90a_bf16():
    M, N, K = 100, 52, 88
    args = gemm_args(M, N, K, seed=11, dtype="bfloat16")
    # numpy's bfloat16 (ml_dtypes) has no DLPack: the inputs go in as jax arrays.
    inputs = [jnp.asarray(x) if x.dtype == jnp.bfloat16 else x for x in args]
    report = gemm_sm90a(M, N, K, dtype="bfloat16").run(*inputs)
    _check(args, report)


def _check(args, report):
    assert report["findings"] == []
    a, b, c = args[3:]
    expected = a.astype(np.float32) @ b.astype(np.float32).T
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        c, np.asarray(jnp.dot(a, b.T, preferred_element_type=jnp.float32)), rtol=1e-3, atol=1e-2)


def _nvcc():
    if nvcc_path() is None:
        pytest.skip("nvcc not found (PATH, $NVCC, $CUDA_HOME): cannot check the PTX side")


@pytest.mark.parametrize("bf16", [False, True], ids=["f16", "bf16"])
def test_gemm_sm90a_compiles_for_sm90a_without_spills(bf16):
    _nvcc()
    source = ("#define GEMM_BF16\n" if bf16 else "") + kernel_source("gemm_sm90a")
    cubin = compile_cubin(source, "sm_90a", file="gemm_sm90a.cu")
    r = cubin.kernels["gemm_sm90a"]
    assert r.spill_stores == 0 and r.spill_loads == 0, cubin.log
    # __launch_bounds__(384, 1): ptxas gives the kernel the 168 registers per thread
    # setmaxnreg then moves between the roles (40 producer, 232 per consumer).
    assert r.registers == 168, cubin.log
    assert "setmaxnreg' ignored" not in cubin.log
    dtype = "bf16" if bf16 else "f16"
    assert f"wgmma.mma_async.sync.aligned.m64n64k16.f32.{dtype}.{dtype}" in cubin.ptx.decode()
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in cubin.ptx.decode()


def test_hopper_primitives_are_rejected_for_sm80():
    _nvcc()
    with pytest.raises(ToolchainError, match="mbarrier_init"):
        compile_cubin(kernel_source("gemm_sm90a"), "sm_80", file="gemm_sm90a.cu")


@pytest.mark.slow
def test_gemm_sm90a_large():
    M, N, K = 520, 456, 1032
    args = gemm_args(M, N, K, seed=7)
    report = gemm_sm90a(M, N, K).run(*args)
    assert report["findings"] == []
    a, b, c = args[3:]
    np.testing.assert_allclose(c, a.astype(np.float32) @ b.astype(np.float32).T, rtol=1e-4,
                               atol=1e-3)


def test_gemm_sm90a_checks_off_gives_the_same_result():
    # The Hopper model does not depend on the checks: TMA data still lands at its phase's
    # completion and wgmma results at their wait.
    M, N, K = 100, 52, 88
    kernel = gemm_sm90a(M, N, K)
    on, off = gemm_args(M, N, K, seed=3), gemm_args(M, N, K, seed=3)
    kernel.run(*on)
    kernel.set_checks(False)
    try:
        report = kernel.run(*off)
    finally:
        kernel.set_checks(True)
    np.testing.assert_array_equal(on[5], off[5])
    assert report["counters"]["shared_accesses_checked"] == 0
