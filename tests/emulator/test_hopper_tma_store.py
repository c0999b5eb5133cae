"""TMA stores from the TMA-store pass, run in the emulator as sm_90a code: a GEMM whose
epilogue casts the f32 accumulator into a shared f16/bf16 tile and copies it out (a TMA
store), on shapes that do and do not divide the tiles, against its reference and jnp, with no
finding; seeded mistakes in the generated code (no proxy fence before the store, the source
rewritten before the wait, no wait at all) reported by the emulator. The PTX side: NVRTC
compiles it for sm_90a with ``cp.async.bulk.tensor`` stores and no spills."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tma_store_kernels import (
    batched_rows,
    gemm_tma_epilogue,
    store_then_pipeline,
    two_tiles_through_one_buffer,
)

from jaxtile.compiler import build
from jaxtile.compiler.cuda import emulated, nvrtc
from jaxtile.compiler.cuda.compile import compile_to_library
from jaxtile.compiler.cuda.compile import source as cuda_source
from jaxtile.compiler.emulator import EmulatedKernel, EmulatorError
from jaxtile.compiler.emulator.build import DEVICE_INCLUDE
from jaxtile.compiler.target import parse_target

SM90A = parse_target("cuda:sm_90a")


def _operands(m, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((m, k)), dtype),
            jnp.asarray(rng.standard_normal((k, n)), dtype))


def _check(got, a, b, dtype):
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    tol = 3e-2 if dtype == jnp.bfloat16 else 4e-3
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * 4)
    ref = gemm_tma_epilogue.reference(a, b)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(ref, np.float64),
                               rtol=tol, atol=tol)
    jnp_dot = jnp.dot(a, b, preferred_element_type=jnp.float32).astype(dtype)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(jnp_dot, np.float64),
                               rtol=tol, atol=tol)


def _build(code, source: str, name: str) -> EmulatedKernel:
    params, launch = emulated.emulator_launch(code)
    return EmulatedKernel.build(source, code.symbol, params, launch, file=f"{name}.cu")


def _raw(x):
    """The array as a writable numpy array (bfloat16 as ml_dtypes')."""
    return np.array(x)


@pytest.mark.parametrize("shape", [
    (100, 40, 72),                                          # ragged M, K, N: TMA clips
    pytest.param((128, 64, 128), marks=pytest.mark.slow),   # 2 x 2 blocks, every box whole
])
def test_gemm_epilogue_stores_by_tma_with_no_finding(shape):
    m, k, n = shape
    a, b = _operands(m, k, n, jnp.float16, seed=m + n)
    code = gemm_tma_epilogue.lower(a, b, target=SM90A.name)._gpu
    assert "tma_store_2d(" in code.source and "bulk_wait_group_read<0>()" in code.source
    out = np.zeros((m, n), np.float16)
    report = _build(code, code.source, "tma_store_gemm").run(_raw(a), _raw(b), out)
    assert report["findings"] == []
    _check(out, a, b, jnp.float16)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_gemm_epilogue_through_jit(hopper, dtype):
    """Through jax.jit on the cuda-emulator:sm_90a backend (an error finding would raise);
    bf16 here, since numpy's bfloat16 has no DLPack for the direct run above."""
    a, b = _operands(100, 40, 72, dtype, seed=5)
    got = jax.jit(gemm_tma_epilogue)(a, b)
    assert "tma_store_2d(" in hopper[-1]
    _check(got, a, b, dtype)


def _fence_before_store(src: str) -> str:
    at = src.index("tma_store_2d(")
    fence = src.rindex("fence_proxy_async();", 0, at)
    return src[:fence] + src[fence:].replace("fence_proxy_async();", "", 1)


@pytest.mark.parametrize("mutate, finding", [
    # the tile's generic writes are not fenced for the async proxy
    (_fence_before_store, "missing fence.proxy.async"),
])
def test_seeded_gemm_epilogue_mistakes_are_reported(mutate, finding):
    a, b = _operands(64, 32, 64, jnp.float16, seed=3)
    code = gemm_tma_epilogue.lower(a, b, target=SM90A.name)._gpu
    bad = mutate(code.source)
    assert bad != code.source
    kernel = _build(code, bad, "tma_store_mutated")
    with pytest.raises(EmulatorError) as err:
        kernel.run(_raw(a), _raw(b), np.zeros((64, 64), np.float16))
    text = str(err.value) + str(err.value.report)
    assert finding in text, text[:2000]


def _two_tiles():
    x = jnp.asarray(np.random.default_rng(9).standard_normal((32, 64)), jnp.float16)
    code = two_tiles_through_one_buffer.lower(x, target=SM90A.name)._gpu
    return x, code


def test_a_refilled_source_runs_clean_and_lands():
    x, code = _two_tiles()
    assert code.source.count("tma_store_2d(") == 2
    out = np.zeros((32, 64), np.float16)
    report = _build(code, code.source, "two_tiles").run(np.asarray(x), out)
    assert report["findings"] == []
    np.testing.assert_array_equal(out, -np.asarray(x))


def test_writing_the_source_before_the_wait_is_a_race():
    """The first wait dropped: the second tile's fill writes the shared source while the
    first store may still read it."""
    x, code = _two_tiles()
    bad = code.source.replace("if (tid == 0) bulk_wait_group_read<0>();", "", 1)
    wait = "bulk_wait_group_read<0>()"
    assert bad.count(wait) == code.source.count(wait) - 1
    kernel = _build(code, bad, "two_tiles_no_wait")
    with pytest.raises(EmulatorError) as err:
        kernel.run(np.asarray(x), np.zeros((32, 64), np.float16))
    text = str(err.value) + str(err.value.report)
    assert "TMA store source overwritten" in text, text[:2000]


def test_a_store_never_waited_for_is_reported_and_still_lands():
    x, code = _two_tiles()
    bad = code.source.replace("if (tid == 0) bulk_wait_group_read<0>();", "")
    assert "bulk_wait_group" not in bad
    out = np.zeros((32, 64), np.float16)
    try:
        report = _build(code, bad, "two_tiles_unwaited").run(np.asarray(x), out)
        findings = report["findings"]
    except EmulatorError as e:
        findings = e.report["findings"]
    assert any("TMA stores it never waited for" in f["message"] for f in findings), findings
    np.testing.assert_array_equal(out, -np.asarray(x))   # landed by the kernel's end


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed (jaxtile[cuda])")
def test_nvrtc_compiles_the_tma_store_epilogue_for_sm90a():
    """The launch carries the output's tensor map (f16, 72 x 100, box 64 x 64, no swizzle);
    ptxas reports no spills; the PTX stores with cp.async.bulk.tensor (global from shared)
    in a bulk group and waits for it."""
    a, b = _operands(100, 40, 72, jnp.float16)
    low = gemm_tma_epilogue.lower(a, b, target=SM90A.name)
    kernel = build.lowered_ir(low.kernel, SM90A)
    compiled = compile_to_library(kernel, SM90A)
    assert compiled.launch.params[-1] == "tmap2:2:72x100:64x64:0"
    assert compiled.ptxas.spill_stores == compiled.ptxas.spill_loads == 0
    result = nvrtc.compile_cubin(cuda_source(kernel, SM90A), "tma_store_gemm.cu",
                                 ["-arch=sm_90a", "-std=c++17", f"-I{DEVICE_INCLUDE}"])
    ptx = result.ptx.decode()
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in ptx
    assert "cp.async.bulk.commit_group" in ptx and "cp.async.bulk.wait_group.read 0" in ptx


def test_a_3d_output_is_stored_by_3d_boxes_clipped_at_the_edge():
    """Batch 3 of 40 rows by 32 in row blocks of 16: the last block of each batch has 8 rows
    past the edge, which TMA clips (they would land in the next batch's first rows)."""
    x = jnp.asarray(np.random.default_rng(4).standard_normal((3, 40, 32)), jnp.float16)
    code = batched_rows.lower(x, target=SM90A.name)._gpu
    assert "tma_store_3d(" in code.source
    assert [(m.box, m.swizzle) for m in code.tensor_maps] == [((32, 16, 1), 0)]
    out = np.full((3, 40, 32), np.nan, np.float16)
    report = _build(code, code.source, "batched_rows").run(np.asarray(x), out)
    assert report["findings"] == []
    np.testing.assert_array_equal(out, (np.asarray(x, np.float32) * 3).astype(np.float16))
    np.testing.assert_array_equal(np.asarray(batched_rows.reference(x)), out)


def test_a_store_then_a_tma_ring_runs_clean():
    """The ring's stages may take the stored tile's bytes: the wait before its set-up keeps
    the TMA loads off the source until the store has read it."""
    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.standard_normal((16, 64)), jnp.float16)
    y = jnp.asarray(rng.standard_normal((72, 64)), jnp.float16)
    code = store_then_pipeline.lower(x, y, target=SM90A.name)._gpu
    assert "tma_store_2d(" in code.source and "tma_load_2d(" in code.source
    first, sums = np.zeros((16, 64), np.float16), np.zeros((1, 64), np.float32)
    report = _build(code, code.source, "store_then_ring").run(np.asarray(x), np.asarray(y),
                                                              first, sums)
    assert report["findings"] == []
    np.testing.assert_array_equal(first, np.asarray(x) + np.float16(1))
    np.testing.assert_allclose(sums, np.asarray(y, np.float64).sum(0, keepdims=True),
                               rtol=1e-3, atol=1e-3)
