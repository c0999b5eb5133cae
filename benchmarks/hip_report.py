"""Static figures of the hand-written MFMA GEMM for AMD GPUs (issue 23's targets), from clang's
assembly: what ptxas_report.py is for CUDA.

The kernel (``tests/hip/kernels/mfma_gemm.hip``, the one the HIP tests compile): C (f32) =
A B^T (f16, k-contiguous), 128 x 128 x 32 workgroup tiles, 256 lanes (4 waves of 64 x 64,
each 2 x 2 ``v_mfma_f32_32x32x8`` accumulators), LDS rows padded for conflict-free operand
reads, buffer loads. Compiled with clang for gfx942 and gfx90a (no ROCm, no GPU).

For each architecture: VGPRs (architectural + AGPRs, target: at most 256, the budget of 2
waves per SIMD), SGPRs, LDS (<= 64 KiB), scratch and spills (0), waves per SIMD (jaxtile's
figure and LLVM's), the ``v_mfma`` count of the K loop against the tile math (one K step of
32: 2 x 2 tiles x 32 / 8 = 16 per wave), and the compile time (a fresh clang process each
time; median of ``--repeats``).

    python benchmarks/hip_report.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

from _timing import emit, log

from jaxtile.compiler.hip import toolchain
from jaxtile.compiler.target import parse_target

KERNEL = Path(__file__).resolve().parents[1] / "tests" / "hip" / "kernels" / "mfma_gemm.hip"
_NAME = "gemm_f16_mfma"
_TILE = {"m": 128, "n": 128, "k": 32, "wave_m": 64, "wave_n": 64}


def expected_mfma(shape_m: int, shape_n: int, shape_k: int) -> int:
    """MFMA instructions a wave issues per K step of the workgroup tile."""
    return (_TILE["wave_m"] // shape_m) * (_TILE["wave_n"] // shape_n) * (_TILE["k"] // shape_k)


def figures(arch: str, repeats: int) -> dict:
    """The kernel's figures on ``arch``."""
    source = KERNEL.read_text()
    times, co = [], None
    for i in range(repeats):
        t0 = time.perf_counter()
        co = toolchain.compile_hip(source, arch, file=KERNEL.name)
        times.append(time.perf_counter() - t0)
        log(f"{arch} compile {i + 1}: {times[-1]:.2f} s")
    caps = parse_target(f"hip:{arch}").caps
    k = co.kernels[_NAME]
    shape = next(s for s in caps.mfma if s.m == 32 and s.operand == "f16")
    mfma = len(re.findall(rf"^\s+{shape.instruction}\s", co.assembly, re.M))
    waves = k.waves_per_simd(caps)
    return {
        "instruction": shape.instruction,
        "vgprs": k.vgprs, "arch_vgprs": k.arch_vgprs, "agprs": k.agprs, "sgprs": k.sgprs,
        "lds_bytes": k.lds_bytes, "scratch_bytes": k.scratch_bytes,
        "vgpr_spills": k.vgpr_spills, "sgpr_spills": k.sgpr_spills,
        "waves_per_simd": waves, "llvm_occupancy": k.llvm_occupancy,
        "mfma_in_k_loop": mfma, "mfma_expected": expected_mfma(shape.m, shape.n, shape.k),
        "code_object_bytes": len(co.data),
        "compile_s_median": statistics.median(times), "compile_s_all": times,
        "meets_targets": {
            "no_spills": k.scratch_bytes == k.vgpr_spills == k.sgpr_spills == 0,
            "registers_allow_2_waves": k.vgprs <= caps.vgprs // 2,
            "lds_within_64k": k.lds_bytes <= caps.lds_bytes,
            "mfma_count_matches_tile_math": mfma == expected_mfma(shape.m, shape.n, shape.k),
            "occupancy_agrees_with_llvm": waves == k.llvm_occupancy,
        },
    }


def report(repeats: int) -> dict:
    return {"kernel": f"{_NAME} (fp16 -> f32, C = A B^T, 128x128x32 tiles, 256 lanes, "
                      "4 waves of 64x64)",
            "toolchain": toolchain.identity(),
            **{arch: figures(arch, repeats) for arch in ("gfx942", "gfx90a")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="clang compiles to time")
    emit(report(ap.parse_args().repeats))


if __name__ == "__main__":
    main()
