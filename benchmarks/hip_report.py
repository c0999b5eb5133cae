"""Static figures of the hand-written MFMA GEMM for AMD GPUs (issue 23's targets), from clang's
assembly: what ptxas_report.py is for CUDA.

The kernel (``tests/compiler/hip/kernels/mfma_gemm.hip``, the one the HIP tests compile): C (f32) =
A B^T (f16, k-contiguous), 128 x 128 x 32 workgroup tiles, 256 lanes (4 waves of 64 x 64,
each 2 x 2 ``v_mfma_f32_32x32x8`` accumulators), LDS rows padded for conflict-free operand
reads, buffer loads. Compiled with clang for gfx942 and gfx90a (no ROCm, no GPU).

For each architecture: VGPRs (architectural + AGPRs, target: at most 256, the budget of 2
waves per SIMD), SGPRs, LDS (<= 64 KiB), scratch and spills (0), waves per SIMD (jaxtile's
figure and LLVM's), the ``v_mfma`` count of the K loop against the tile math (one K step of
32: 2 x 2 tiles x 32 / 8 = 16 per wave), and the compile time (a fresh clang process each
time; median of ``--repeats``).

``generated``: kernels written in the tile language and compiled by jaxtile for gfx942 (the
same figures, read the same way): ``jt.ops.matmul`` fp16 4096^3 with its default tiles for
the target (the MFMA count of the disassembly against the tile math of each ``gemm_ss`` call
the source makes: ``bm bn bk / (S S K)`` per wave) and ``jt.ops.attention``'s forward kernel
at D = 128 fp16 with the tiles its rule picks for 64 KiB of LDS (no spills); the row
kernels' backward ``jt.ops.softmax_bwd`` and ``jt.ops.layer_norm_bwd`` at 64 x 512 float32
(rows of 128 threads, which once spilled: no scratch). LDS here is the launch's dynamic shared
memory, which the kernels use instead of static LDS.

``cold``: the **cold compile, trace -> code object** (target <= 1.5 s) for gfx942 of a
tile-language row-sum reduction (``tests/compiler/hip/test_hip_lower.py``'s ``row_sums``, 4096 x
4096 float32) and of the ``generated`` kernels (``jt.ops.matmul`` fp16 4096^3,
``jt.ops.attention_fwd`` fp16 D = 128): each of ``--cold-runs`` fresh Python processes with
an empty cache imports jaxtile (not timed, reported apart), then times tracing, the GPU passes,
code generation and clang, as wall time and as CPU time (this process's, and clang's, a child
process), with the load average (``os.getloadavg``) at the start; medians are reported. On a
shared machine the wall time includes waiting for a core; the CPU time does not.

    python benchmarks/hip_report.py [--repeats 3] [--cold-runs 3] [--cold-only]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _timing import emit, log

from jaxtile.compiler.hip import toolchain
from jaxtile.compiler.target import parse_target

KERNEL = (Path(__file__).resolve().parents[1] / "tests" / "compiler" / "hip" / "kernels"
          / "mfma_gemm.hip")
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


def _generated_figures(kernel, args: tuple, target) -> dict:
    """Figures of a library kernel compiled by jaxtile for ``target`` (a HIP target)."""
    from jaxtile.compiler import build
    from jaxtile.compiler.gpu import gemm_plan
    from jaxtile.compiler.gpu.codegen.lower import generate, symbol_name

    t0 = time.perf_counter()
    lowered = kernel.lower(*args, target=target.name)
    ir = build.lowered_ir(lowered.kernel, target)
    code = generate(ir, target)
    co = toolchain.compile_hip(code.source, target.caps.gfx, file=f"{code.symbol}.hip")
    seconds = time.perf_counter() - t0
    caps = target.caps
    k = co.kernels[symbol_name(ir)]
    gemms = []
    for op in gemm_plan._gemms(ir):
        p = gemm_plan.recorded(op, ir)
        if p is None:
            gemms.append({"instr": "scalar"})
            continue
        size, step = p.instr.mfma_size, p.instr.k_step // 2
        gemms.append({"instr": p.instr.label, "m": p.m, "n": p.n, "k": p.k,
                      "waves": list(p.warps),
                      "mfma_per_wave": p.m * p.n * p.k // (size * size * step)
                      // (p.warps[0] * p.warps[1]) if size else 0})
    calls = code.source.count("jaxtile::gemm_ss<") + code.source.count("jaxtile::gemm_rs_mfma<")
    mfma = len(re.findall(r"^\s+v_mfma_\S+", co.assembly, re.M))
    return {
        "gemms": gemms, "gemm_calls_in_source": calls,
        "threads": code.threads, "lds_bytes": code.shared_bytes,
        "vgprs": k.vgprs, "arch_vgprs": k.arch_vgprs, "agprs": k.agprs, "sgprs": k.sgprs,
        "scratch_bytes": k.scratch_bytes, "vgpr_spills": k.vgpr_spills,
        "sgpr_spills": k.sgpr_spills, "waves_per_simd": k.waves_per_simd(caps),
        "mfma_in_disassembly": mfma, "compile_s": round(seconds, 3),
        "no_spills": k.scratch_bytes == k.vgpr_spills == k.sgpr_spills == 0,
        "registers_allow_2_waves": k.vgprs <= caps.vgprs // 2,
        "lds_within_64k": code.shared_bytes <= caps.lds_bytes,
    }


def generated(arch: str = "gfx942") -> dict:
    """The tile-language kernels' figures on ``arch`` (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    from jaxtile import ops

    target = parse_target(f"hip:{arch}")
    a = jax.ShapeDtypeStruct((4096, 4096), jnp.float16)
    gemm = _generated_figures(ops.matmul, (a, a), target)
    # The gemm_ss call sits once in the pipelined K loop's body, which clang keeps rolled.
    per_call = sum(g["mfma_per_wave"] for g in gemm["gemms"])
    gemm["mfma_expected"] = per_call * gemm["gemm_calls_in_source"]
    gemm["mfma_count_matches_tile_math"] = gemm["mfma_in_disassembly"] == gemm["mfma_expected"]
    q = jax.ShapeDtypeStruct((1, 8, 1024, 128), jnp.float16)
    lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
    attention = _generated_figures(ops.attention_fwd, (q, q, q, lengths), target)
    x = jax.ShapeDtypeStruct((64, 512), jnp.float32)
    w = jax.ShapeDtypeStruct((512,), jnp.float32)
    stats = jax.ShapeDtypeStruct((64,), jnp.float32)
    return {"matmul_fp16_4096": gemm, "attention_fwd_fp16_d128": attention,
            "softmax_bwd_f32_512": _generated_figures(ops.softmax_bwd, (x, x), target),
            "layer_norm_bwd_f32_512": _generated_figures(ops.layer_norm_bwd,
                                                         (x, w, stats, stats, x), target)}


COLD_KERNELS = {
    "row_sums": "row_sums (tests/compiler/hip/test_hip_lower.py), 4096x4096 float32",
    "matmul_fp16_4096": "jt.ops.matmul fp16 4096^3, default tiles",
    "attention_fwd_fp16_d128": "jt.ops.attention_fwd fp16, (1, 8, 1024, 128), causal off",
}


def _cold_child(name: str) -> None:
    """One cold compile of ``name`` (:data:`COLD_KERNELS`) in this (fresh) process, trace ->
    code object; prints the phases' wall and CPU seconds as JSON."""
    import resource

    import jax
    import jax.numpy as jnp

    from jaxtile import ops
    from jaxtile.compiler import build
    from jaxtile.compiler.hip import lower as hip_lower

    sys.path.insert(0, str(KERNEL.parents[1]))
    from test_hip_lower import row_sums

    def cpu() -> float:
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    def clang_cpu() -> float:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return kids.ru_utime + kids.ru_stime

    target = parse_target("hip:gfx942")
    if name == "row_sums":
        kernel, args = row_sums, (jax.ShapeDtypeStruct((4096, 4096), jnp.float32),)
    elif name == "matmul_fp16_4096":
        a = jax.ShapeDtypeStruct((4096, 4096), jnp.float16)
        kernel, args = ops.matmul, (a, a)
    else:
        q = jax.ShapeDtypeStruct((1, 8, 1024, 128), jnp.float16)
        kernel, args = ops.attention_fwd, (q, q, q, jax.ShapeDtypeStruct((1,), jnp.int32))
    load = os.getloadavg()[0]
    c0, k0, t0 = cpu(), clang_cpu(), time.perf_counter()
    lowered = kernel.lower(*args, target=target.name)
    c1, t1 = cpu(), time.perf_counter()
    ir = build.lowered_ir(lowered.kernel, target)
    c2, t2 = cpu(), time.perf_counter()
    co = hip_lower.compile_code_object(ir, target)
    c3, k3, t3 = cpu(), clang_cpu(), time.perf_counter()
    k = next(iter(co.kernels.values()))
    print(json.dumps({"trace_s": t1 - t0, "passes_s": t2 - t1,
                      "codegen_and_clang_s": t3 - t2, "total_s": t3 - t0,
                      "trace_cpu_s": c1 - c0, "passes_cpu_s": c2 - c1,
                      "codegen_and_clang_cpu_s": c3 - c2, "clang_cpu_s": k3 - k0,
                      "total_cpu_s": c3 - c0, "load_average_1min": load,
                      "vgprs": k.vgprs, "scratch_bytes": k.scratch_bytes}))


def cold_compiles(runs: int, name: str = "row_sums") -> dict:
    """Median phases of ``runs`` cold compiles of ``name``, each in a fresh process and empty
    cache."""
    samples = []
    for i in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, JAXTILE_CACHE_DIR=cache)
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--cold-child", name], env=env,
                                  capture_output=True, text=True, check=True)
            wall = time.perf_counter() - t0
        sample = json.loads(proc.stdout.strip().splitlines()[-1])
        sample["import_and_startup_s"] = wall - sample["total_s"]
        samples.append(sample)
        log(f"cold compile {name} {i + 1}: trace -> code object {sample['total_s']:.2f} s "
            f"wall, {sample['total_cpu_s']:.2f} s CPU (clang {sample['clang_cpu_s']:.2f} s), "
            f"load {sample['load_average_1min']:.1f}")
    median = {k: round(statistics.median(s[k] for s in samples), 4) for k in samples[0]}
    return {"kernel": f"{COLD_KERNELS[name]}, gfx942", "runs": runs, "median": median,
            "total_s_all": [round(s["total_s"], 4) for s in samples],
            "total_cpu_s_all": [round(s["total_cpu_s"], 4) for s in samples],
            "meets_target_wall": median["total_s"] <= 1.5,
            "meets_target_cpu": median["total_cpu_s"] <= 1.5}


def report(repeats: int, cold_runs: int = 0, with_generated: bool = False) -> dict:
    out = {"kernel": f"{_NAME} (fp16 -> f32, C = A B^T, 128x128x32 tiles, 256 lanes, "
                     "4 waves of 64x64)",
           "toolchain": toolchain.identity(),
           **{arch: figures(arch, repeats) for arch in ("gfx942", "gfx90a")}}
    if with_generated:
        out["generated"] = generated("gfx942")
    if cold_runs:
        out["cold"] = {name: cold_compiles(cold_runs, name) for name in COLD_KERNELS}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="clang compiles to time")
    ap.add_argument("--cold-runs", type=int, default=3,
                    help="fresh processes timing the language kernel's cold compile")
    ap.add_argument("--cold-only", action="store_true",
                    help="only the cold compiles (no hand-written or generated figures)")
    ap.add_argument("--cold-child", choices=sorted(COLD_KERNELS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cold_child:
        _cold_child(args.cold_child)
        return
    if args.cold_only:
        emit({"toolchain": toolchain.identity(),
              "cold": {name: cold_compiles(args.cold_runs, name) for name in COLD_KERNELS}})
        return
    emit(report(args.repeats, args.cold_runs, with_generated=True))


if __name__ == "__main__":
    main()
