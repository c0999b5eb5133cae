"""CUDA compile time: NVRTC in process against nvcc, source to cubin, for a mid-size kernel.

The kernel is the emulator tests' tensor-core GEMM (tests/emulator/kernels/gemm_f16.cu:
128x128x32 tiles, 3-stage cp.async pipeline, ldmatrix + mma.sync), compiled through
``compile_kernel`` for sm_80 and sm_90a with each compiler, alternately, ``--rounds`` times.
Also reported: loading the NVRTC library (once per process) and ptxas' figures per compiler.
No GPU is needed.

    python benchmarks/cuda_compile.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _timing import emit, environment, interleaved, log, summary

from jaxtile.compiler.cuda import fingerprint, nvrtc
from jaxtile.compiler.cuda.compile import compile_kernel
from jaxtile.compiler.gpu.launch import Launch, buffer, scalar
from jaxtile.compiler.target import parse_target

SOURCE = Path(__file__).resolve().parents[1] / "tests" / "emulator" / "kernels" / "gemm_f16.cu"
LAUNCH = Launch((32, 32, 1), (128, 1, 1), 0,
                (buffer(0), buffer(1), buffer(2), *[scalar("i32", 4096)] * 3))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    source = SOURCE.read_text()
    start = time.perf_counter()
    have_nvrtc = nvrtc.available() and nvrtc.version() is not None
    load_seconds = time.perf_counter() - start
    compilers = [c for c, ok in (("nvrtc", have_nvrtc),
                                 ("nvcc", fingerprint.toolchain.nvcc_path() is not None)) if ok]
    result = {"benchmark": "cuda_compile", "environment": environment(),
              "kernel": SOURCE.name, "lines": len(source.splitlines()),
              "toolchains": {c: fingerprint.toolchain_fingerprint(c) for c in compilers},
              "nvrtc_library_load_seconds": round(load_seconds, 4) if have_nvrtc else None}
    if not compilers:
        result["not_run"] = "no CUDA compiler (neither NVRTC nor nvcc)"
        emit(result)
        return 0
    for target_name in ("cuda:sm_80", "cuda:sm_90a"):
        target = parse_target(target_name)
        reports = {}

        def run(which, target=target, reports=reports):
            compiled = compile_kernel(source, "gemm_f16", target, LAUNCH, compiler=which)
            reports[which] = compiled.ptxas.__dict__ | {"arch": compiled.arch}

        log(f"{target_name}: {args.rounds} rounds of {', '.join(compilers)} ...")
        samples = interleaved({c: (lambda c=c: run(c)) for c in compilers},
                              rounds=args.rounds, calls=1)
        entry = {c: {"seconds": summary(samples[c], 1.0), "ptxas": reports[c]}
                 for c in compilers}
        if len(compilers) == 2:
            entry["nvrtc_over_nvcc"] = round(
                summary(samples["nvrtc"], 1.0)["median"] / summary(samples["nvcc"], 1.0)["median"],
                3)
        result[target_name] = entry
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
