"""The hand-written kernels run in the emulator, match numpy, and compile with nvcc."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from emu_kernels import KERNELS, block_sum, gemm, softmax

from jaxtile import _ffi
from jaxtile.compiler.cuda.toolchain import ARCHS, compile_cubin, nvcc_path


def _gemm_inputs(M, N, K, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    return a, b


# Ragged M; N and K multiples of 8 (the kernel's contract) but not of the tiles; K = 24 gives
# one k-tile, fewer than the pipeline's stages.
@pytest.mark.parametrize("M,N,K", [(200, 136, 72), (128, 128, 32), (37, 8, 24), (130, 264, 104)])
def test_gemm_matches_numpy(M, N, K):
    a, b = _gemm_inputs(M, N, K)
    c = np.full((M, N), np.nan, np.float32)
    report = gemm(M, N, K).run(a, b, c)
    expected = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-4)
    assert [f for f in report["findings"]] == []


def source_lines(name, text):
    """1-based numbers of the lines of kernel `name` containing `text`."""
    lines = (KERNELS / f"{name}.cu").read_text().splitlines()
    return {n for n, line in enumerate(lines, 1) if text in line}


def test_gemm_swizzle_is_conflict_free():
    a, b = _gemm_inputs(128, 128, 64)
    report = gemm(128, 128, 64).run(a, b, np.zeros((128, 128), np.float32))
    banks = {s["line"]: s for s in report["bank_conflicts"]}
    # Every shared access site is counted: the two cp.async stores and the two ldmatrix.
    sites = source_lines("gemm_f16", "cp_async<16>") | source_lines("gemm_f16", "ldmatrix_x4")
    assert set(banks) == sites and len(sites) == 4
    assert all(s["instructions"] > 0 and s["wavefronts"] == s["ideal_wavefronts"]
               for s in banks.values())


@pytest.mark.parametrize("rows,n", [(7, 1), (5, 33), (13, 100), (4, 32)])
def test_softmax_matches_numpy(rows, n):
    rng = np.random.default_rng(rows * n)
    x = (rng.standard_normal((rows, n)) * 5).astype(np.float32)
    y = np.full_like(x, np.nan)
    softmax(rows, n).run(x, y)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_block_sum_matches_numpy():
    x = np.random.default_rng(1).standard_normal(5 * 128).astype(np.float32)
    y = np.zeros(5, np.float32)
    block_sum(5).run(x, y)
    np.testing.assert_allclose(y, x.reshape(5, 128).sum(axis=1), rtol=1e-5)


def test_gemm_under_jit_through_the_cpu_handler():
    # The emulator library is an ordinary jaxtile CPU kernel: the FFI handler runs its blocks
    # on its thread pool, inside jax.jit.
    jax.ffi.register_ffi_target("jaxtile_cpu_call", _ffi.cpu_handler(), platform="cpu")
    M, N, K = 260, 136, 40
    kernel = gemm(M, N, K)
    a, b = _gemm_inputs(M, N, K, seed=5)
    fn = jax.jit(lambda x, y: kernel.ffi_call([((M, N), jnp.float32)], x, y)[0])
    out = np.asarray(fn(jnp.asarray(a), jnp.asarray(b)))
    np.testing.assert_allclose(out, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-5,
                               atol=1e-4)


def test_checks_off_gives_the_same_result():
    M, N, K = 130, 72, 48
    a, b = _gemm_inputs(M, N, K, seed=2)
    kernel = gemm(M, N, K)
    c_on, c_off = np.zeros((M, N), np.float32), np.zeros((M, N), np.float32)
    kernel.run(a, b, c_on)
    kernel.set_checks(False)
    try:
        report = kernel.run(a, b, c_off)
    finally:
        kernel.set_checks(True)
    np.testing.assert_array_equal(c_on, c_off)
    assert report["counters"]["shared_accesses_checked"] == 0


# Kernels named *_sm90a use Hopper's primitives, which exist for sm_90a only (their test files
# check that sm_80 rejects them).
@pytest.mark.parametrize(
    "path, arch",
    [(p, a) for p in sorted(KERNELS.glob("*.cu")) for a in ARCHS
     if a == "sm_90a" or not p.stem.endswith("_sm90a")],
    ids=lambda x: x if isinstance(x, str) else x.stem,
)
def test_kernels_compile_with_nvcc(path, arch):
    if nvcc_path() is None:
        pytest.skip("nvcc not found (PATH, $NVCC, $CUDA_HOME): cannot check the PTX side")
    cubin = compile_cubin(path.read_text(), arch, file=path.name)
    assert cubin.data[:4] == b"\x7fELF"
    assert cubin.kernels, cubin.log
    for name, r in cubin.kernels.items():
        assert r.spill_stores == 0 and r.spill_loads == 0, (name, r)
    if path.stem == "gemm_f16":
        assert cubin.kernels["gemm_f16"].shared_bytes == 3 * (128 * 32 + 32 * 128) * 2
