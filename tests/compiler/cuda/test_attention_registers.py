"""Register pressure of flash attention on CUDA: ``jt.ops.attention``'s default tiles per
dtype (``default_tiles``) compile without spills (float32's tf32 kernel spilled about 100
bytes at 255 registers with the 64 x 64 tiles of the 16-bit dtypes)."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from cuda_kernels import needs_compiler

from jaxtile import ops
from jaxtile.compiler import build
from jaxtile.compiler.cuda.compile import compile_to_library
from jaxtile.compiler.target import parse_target
from jaxtile.ops.attention import default_tiles

pytestmark = needs_compiler


def _compiled(dtype, d, causal, arch):
    target = parse_target(arch)
    q = jax.ShapeDtypeStruct((2, 4, 1024, d), dtype)
    bm, bn = default_tiles(dtype, d)
    low = ops.attention_fwd.lower(q, q, q, jax.ShapeDtypeStruct((2,), jnp.int32),
                                  causal=causal, bm=bm, bn=bn, target=arch)
    return compile_to_library(build.lowered_ir(low.kernel, target), target)


@pytest.mark.parametrize("d,arch", [
    (64, "cuda:sm_80"),
    pytest.param(128, "cuda:sm_80", marks=pytest.mark.slow),
    pytest.param(128, "cuda:sm_90a", marks=pytest.mark.slow),
    pytest.param(128, "cuda:sm_86", marks=pytest.mark.slow)])
def test_float32_attention_does_not_spill(d, arch):
    c = _compiled(jnp.float32, d, True, arch)
    r = c.ptxas
    assert r.spill_stores == r.spill_loads == 0 and r.stack_frame == 0, r
    assert r.registers <= 160, r
    # Two stages of K and V and the Q tile fit every target's shared memory, sm_86's too.
    assert c.launch.dynamic_smem <= parse_target("cuda:sm_86").caps.max_smem_bytes


def test_the_16_bit_tiles_stay_and_float32_gets_smaller_ones():
    assert default_tiles(jnp.bfloat16, 128) == default_tiles(jnp.float16, 64) == (64, 64)
    assert default_tiles(jnp.float32, 64) == (64, 32)
    assert default_tiles(jnp.float32, 128) == (32, 32)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["float16", "bfloat16"])
def test_the_gpu_check_flash_kernel_does_not_spill(dtype):
    """benchmarks/gpu_check.py's flash-attention forward (the tile-language kernel of
    tests/jaxtile/test_language_attention.py, D = 128) at the tiles it checks and times
    (``FLASH_TILES``; 128 x 64 spilled 12-60 bytes at 255 registers)."""
    root = Path(__file__).resolve().parents[3]
    sys.path[:0] = [str(root / "benchmarks"), str(root / "tests" / "jaxtile")]
    try:
        import gpu_check
        from test_language_attention import _flash_fwd
    finally:
        del sys.path[:2]
    target = parse_target("cuda:sm_80")
    bm, bn = gpu_check.FLASH_TILES
    q = jax.ShapeDtypeStruct((32, 4096, 128), dtype)
    for causal in (False, True):
        low = _flash_fwd.lower(q, q, q, causal=causal, bm=bm, bn=bn, target="cuda:sm_80")
        r = compile_to_library(build.lowered_ir(low.kernel, target), target).ptxas
        assert r.spill_stores == r.spill_loads == 0 and r.stack_frame == 0, (causal, r)
