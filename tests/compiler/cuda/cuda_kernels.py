"""Hand-written CUDA kernels against jaxtile/device.h, for the toolchain and runtime tests
(the code generator's output plugs into the same interfaces)."""

from pathlib import Path

import pytest

from jaxtile.compiler.cuda import nvrtc, toolchain

KERNELS = Path(__file__).resolve().parents[2] / "emulator" / "kernels"

SCALE_SHIFT = """\
#include <jaxtile/device.h>

using jaxtile::ptr;

// y = x * a + b, one element per thread.
JT_KERNEL void scale_shift(ptr<const float> x, ptr<float> y, int n, float a, float b) {
  const int i = jaxtile::block_idx().x * jaxtile::block_dim().x + jaxtile::thread_idx().x;
  if (i < n) y[i] = x[i] * a + b;
}
"""

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(),
                                 reason="NVRTC not found (pip install 'jaxtile[cuda]')")
needs_nvcc = pytest.mark.skipif(toolchain.nvcc_path() is None, reason="nvcc not on PATH")
needs_compiler = pytest.mark.skipif(
    not nvrtc.available() and toolchain.nvcc_path() is None,
    reason="no CUDA compiler: neither NVRTC (pip install 'jaxtile[cuda]') nor nvcc")


PTXAS_BUDGETS = {
    # The CUDA major of the compiler -> ptxas figures the library's kernels must meet. ptxas'
    # register allocation changes between releases, so each toolkit has its own. Measured
    # (language GEMM 128x128x32, 3 stages, sm_80): 214 registers with NVRTC 13.0 and 12.9.
    13: {"gemm_registers": 224},
    12: {"gemm_registers": 224},
}
"""Register budgets per toolkit (``fingerprint.cuda_major``); spills are 0 for every one."""


def gemm_source() -> str:
    """The 128x128x32, 3-stage tensor-core GEMM of the emulator's tests."""
    return (KERNELS / "gemm_f16.cu").read_text()
