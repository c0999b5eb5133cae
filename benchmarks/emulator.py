"""The CUDA emulator's speed: the hand-written tensor-core GEMM (512^3, f16 -> f32) with the
checks on and off, time per simulated thread operation, and the cost of a fiber switch.

Prints one JSON object; progress goes to stderr. Target: the GEMM under 10 s with the checks
on, on a 2-core machine (`meets_target`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from jaxtile.compiler.emulator import Buffer, EmulatedKernel, LaunchConfig, Scalar

_GEMM = Path(__file__).resolve().parents[1] / "tests" / "emulator" / "kernels" / "gemm_f16.cu"

# Every thread passes `rounds` block-wide barriers: each arrival parks the fiber and switches
# to the next, so the time per arrival is the scheduler's switch cost plus barrier bookkeeping.
_BARRIERS = """
#include <jaxtile/device.h>
using jaxtile::ptr;
JT_KERNEL void barriers(ptr<int> out, int rounds) {
  int t = jaxtile::thread_idx().x;
  for (int r = 0; r < rounds; ++r) jaxtile::sync_threads();
  out[jaxtile::block_idx().x * jaxtile::block_dim().x + t] = t;
}
"""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _time_gemm(kernel: EmulatedKernel, n: int, checks: bool, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float16)
    b = rng.standard_normal((n, n)).astype(np.float16)
    c = np.zeros((n, n), np.float32)
    kernel.set_checks(checks)
    times, report = [], {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        report = kernel.run(a, b, c)
        times.append(time.perf_counter() - t0)
    kernel.set_checks(True)
    err = float(np.abs(c - a.astype(np.float32) @ b.astype(np.float32)).max())
    counters = report["counters"]
    # Thread operations the emulator simulates one by one: memory accesses through checked
    # pointers, and every lane of every warp collective (ldmatrix, mma, shuffles).
    thread_ops = counters["memory_accesses"] + 32 * counters["warp_collectives"]
    best = min(times)
    return {
        "seconds_min": best,
        "seconds_all": times,
        "thread_ops": thread_ops,
        "ns_per_thread_op": best / thread_ops * 1e9,
        "max_abs_error": err,
        "findings": len(report["findings"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=512, help="M = N = K of the GEMM")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n = args.n

    t0 = time.perf_counter()
    gemm = EmulatedKernel.build(
        _GEMM.read_text(),
        "gemm_f16",
        [Buffer("A", "float16"), Buffer("B", "float16"), Buffer("C", "float32"),
         Scalar("M", n), Scalar("N", n), Scalar("K", n)],
        LaunchConfig(((n + 127) // 128, (n + 127) // 128, 1), (128, 1, 1)),
        file="gemm_f16.cu",
    )
    build_s = time.perf_counter() - t0
    _log(f"built in {build_s:.1f} s")
    on = _time_gemm(gemm, n, True, args.repeats)
    _log(f"checks on: {on['seconds_min']:.3f} s")
    off = _time_gemm(gemm, n, False, args.repeats)
    _log(f"checks off: {off['seconds_min']:.3f} s")

    threads, blocks, rounds = 1024, 4, 200
    bar = EmulatedKernel.build(
        _BARRIERS, "barriers", [Buffer("out", "int32"), Scalar("rounds", rounds)],
        LaunchConfig((blocks, 1, 1), (threads, 1, 1)), file="barriers.cu",
    )
    out = np.zeros(blocks * threads, np.int32)
    bar.set_checks(False)
    bar.run(out)  # warm: stacks mapped
    t0 = time.perf_counter()
    bar.run(out)
    bar_s = time.perf_counter() - t0
    bar.set_checks(True)
    arrivals = threads * blocks * rounds

    print(json.dumps({
        "gemm": {"m": n, "n": n, "k": n, "build_seconds": build_s, "checks_on": on,
                 "checks_off": off},
        "barrier_arrival_ns": bar_s / arrivals * 1e9,
        "target_seconds_checks_on": 10.0,
        "meets_target": on["seconds_min"] < 10.0,
    }, indent=2))


if __name__ == "__main__":
    main()
