"""The fp16 GEMM written in the tile language (``gemm_kernels.pipelined_gemm``: 128x128x32
tiles, 128 threads, 3-stage jt.pipelined), compiled for sm_80 as jaxtile compiles it: issue
11's static targets hold (at most 224 registers with CUDA 13 or 12, per toolkit in
``PTXAS_BUDGETS``, no spills, at most 48 KiB of shared memory, tensor-core, ldmatrix
and cp.async instructions in the SASS). ``benchmarks/ptxas_report.py`` reports the same
figures with the emulator's bank-conflict counts and the cold compile time."""

import jax
import jax.numpy as jnp
import pytest
from cuda_kernels import PTXAS_BUDGETS, needs_compiler
from gemm_kernels import pipelined_gemm

from jaxtile.compiler import build
from jaxtile.compiler.cuda import compile as cuda_compile
from jaxtile.compiler.cuda import fingerprint, sass
from jaxtile.compiler.target import parse_target

pytestmark = needs_compiler


@pytest.fixture(scope="module")
def compiled():
    target = parse_target("cuda:sm_80")
    spec = jax.ShapeDtypeStruct((4096, 4096), jnp.float16)
    ir = build.lowered_ir(pipelined_gemm.lower(spec, spec, target="cuda:sm_80").kernel, target)
    return cuda_compile.compile_to_library(ir, target)


def test_the_language_gemm_meets_the_register_spill_and_shared_memory_targets(compiled):
    p = compiled.ptxas
    assert p.registers <= PTXAS_BUDGETS[fingerprint.cuda_major(compiled.compiler)][
        "gemm_registers"], p
    assert p.spill_stores == p.spill_loads == 0, p
    # Every shared array is a view of the dynamic shared memory the launch asks for.
    smem = p.shared_bytes + compiled.launch.dynamic_smem
    assert 0 < smem <= 48 * 1024, (p, compiled.launch)


@pytest.mark.skipif(sass.cuobjdump_path() is None, reason="cuobjdump is not installed")
def test_the_language_gemm_uses_tensor_cores_ldmatrix_and_cp_async(compiled):
    counts = sass.sass_counts(compiled.cubin)
    assert all(counts.get(op, 0) > 0 for op in ("HMMA", "LDSM", "LDGSTS")), counts
