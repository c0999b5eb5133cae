"""The GPU check: jaxtile's kernels on an NVIDIA GPU, for correctness and against XLA.

For a machine with a GPU (finishes in under 8 minutes; ``--budget`` seconds in all):

- correctness: the kernel tests (``--tests``) run under pytest with JAX's default device the
  GPU, so every kernel goes through the CUDA lowering and handler and is compared with its
  reference semantics and a jnp/numpy formula;
- GEMM 8192^3 in float16 and bfloat16 (float32 accumulation): ``jt.ops.matmul`` against
  ``jnp.dot`` (cuBLAS), TFLOP/s of both and their ratio, and the largest error relative to
  the largest entry of ``jnp.dot``'s result;
- flash-attention forward (the tested kernel of tests/jaxtile/test_language_attention.py)
  against ``jax.nn.dot_product_attention`` (cuDNN where XLA picks it), causal and not.

What cannot run is reported with the reason (no GPU, no CUDA lowering for a kernel yet, out
of time) and the rest still runs. Prints one JSON object; progress goes to stderr.

    python benchmarks/gpu_check.py [--budget 450] [--rounds 5] [--tests PATH ...]

``--platform cpu`` with small ``--gemm-size`` / ``--seq`` runs the same code on the CPU, to
check the script itself where there is no GPU.
"""

from __future__ import annotations

import argparse
import functools
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _timing import emit, environment, interleaved, log, ratio

import jaxtile as jt
from jaxtile import _ffi

ROOT = Path(__file__).resolve().parents[1]
KERNEL_TESTS = ("tests/jaxtile/test_ops.py", "tests/jaxtile/test_language_attention.py",
                "tests/jaxtile/test_language_reductions.py",
                "tests/jaxtile/test_language_gemm_control.py",
                "tests/jaxtile/test_language_atomics.py")


class Clock:
    """The time left of the whole check's budget."""

    def __init__(self, budget: float) -> None:
        self.end = time.monotonic() + budget

    def left(self) -> float:
        return self.end - time.monotonic()


def _why(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:400]}"


def devices(platform: str) -> list[Any]:
    """JAX's devices of ``platform``; empty where JAX has none (no CUDA plugin or no GPU)."""
    try:
        return list(jax.devices(platform))
    except RuntimeError:
        return []


def toolchain() -> dict[str, Any]:
    """What compiles and runs CUDA kernels here."""
    from jaxtile.compiler.cuda import fingerprint, sass

    driver = _ffi.cuda_driver_error()
    cuobjdump = sass.cuobjdump_path()
    return {"compiler": fingerprint.toolchain_fingerprint(),
            "nvrtc": fingerprint.nvrtc.library_path(),
            "nvcc": fingerprint.toolchain.nvcc_path(),
            "cuobjdump": cuobjdump[0] if cuobjdump else None,
            "driver": "loaded" if not driver else driver}


def correctness(tests: list[str], seconds: float) -> dict[str, Any]:
    """The kernel tests under pytest on the GPU (JAX's default device)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
           "-rfE", *tests]
    log(f"correctness: {' '.join(tests)} (at most {seconds:.0f} s) ...")
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"")[-2000:]
        return {"status": "timed out", "seconds": round(seconds),
                "output_tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail}
    counts = {word: int(n) for n, word in re.findall(
        r"(\d+) (passed|failed|skipped|errors?|xfailed)", proc.stdout.splitlines()[-1]
        if proc.stdout.strip() else "")}
    failures = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"status": "passed" if proc.returncode == 0 else "failed", "counts": counts,
            "failures": failures[:40], "tests": tests}


def _timed(ours, theirs, args, rounds: int) -> dict[str, list[float]]:
    contenders = {"jaxtile": lambda: ours(*args).block_until_ready(),
                  "xla": lambda: theirs(*args).block_until_ready()}
    interleaved(contenders, rounds=1, calls=1)  # compile and warm up, discarded
    return interleaved(contenders, rounds=rounds, calls=3)


def _throughput(samples: dict[str, list[float]], flops: float) -> dict[str, Any]:
    """TFLOP/s of both contenders (medians) and jaxtile's speed relative to XLA's."""
    seconds = {name: float(np.median(s)) for name, s in samples.items()}
    return {"tflops": {name: round(flops / t / 1e12, 3) for name, t in seconds.items()},
            "speed_jaxtile_over_xla": round(seconds["xla"] / seconds["jaxtile"], 3),
            "time_ratio": ratio(samples, "jaxtile", "xla")}


def _max_rel_error(got, want) -> float:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))


def gemm(dtype: Any, rounds: int, n: int) -> dict[str, Any]:
    """TFLOP/s of jt.ops.matmul (128x128x32 tiles, 3 stages) and jnp.dot on (n, n) @ (n, n);
    both accumulate in float32 and return ``dtype``."""
    keys = jax.random.split(jax.random.key(0), 2)
    a, b = (jax.random.normal(k, (n, n), jnp.float32).astype(dtype) for k in keys)
    ours = jax.jit(functools.partial(jt.ops.matmul, bm=128, bn=128, bk=32, stages=3))
    theirs = jax.jit(jnp.dot)
    error = _max_rel_error(ours(a, b), theirs(a, b))
    samples = _timed(ours, theirs, (a, b), rounds)
    return {"shape": [n, n, n], **_throughput(samples, 2.0 * n ** 3), "max_rel_error": error}


def _flash_kernel():
    # The kernel the tests verify, so that the timing is of tested code.
    sys.path.insert(0, str(ROOT / "tests" / "jaxtile"))
    from test_language_attention import _flash_fwd

    return _flash_fwd


def flash_attention(dtype: Any, causal: bool, rounds: int, seq: int, *, bh: int = 32,
                    d: int = 128, bm: int = 128, bn: int = 64) -> dict[str, Any]:
    """Flash-attention forward against jax.nn.dot_product_attention, (bh, seq, d) operands."""
    kernel = _flash_kernel()
    keys = jax.random.split(jax.random.key(1), 3)
    q, k, v = (jax.random.normal(key, (bh, seq, d), jnp.float32).astype(dtype) for key in keys)
    ours = jax.jit(functools.partial(kernel, causal=causal, bm=bm, bn=bn))

    def xla(q, k, v):
        # jax.nn's layout is (batch, seq, heads, dim).
        t = [x[None].transpose(0, 2, 1, 3) for x in (q, k, v)]
        return jax.nn.dot_product_attention(*t, is_causal=causal)[0].transpose(1, 0, 2)

    theirs = jax.jit(xla)
    error = _max_rel_error(ours(q, k, v), theirs(q, k, v))
    samples = _timed(ours, theirs, (q, k, v), rounds)
    flops = 4.0 * bh * seq * seq * d * (0.5 if causal else 1.0)
    return {"shape": {"bh": bh, "seq": seq, "d": d}, "tiles": [bm, bn],
            **_throughput(samples, flops), "max_rel_error": error}


def _attempt(clock: Clock, need: float, what: str, fn) -> dict[str, Any]:
    """``fn()``, or why it did not run (out of time, or the error it raised)."""
    if clock.left() < need:
        return {"not_run": f"out of time ({clock.left():.0f} s left, {what} needs ~{need} s)"}
    log(f"{what} ...")
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - report every failure and go on
        return {"not_run": _why(e)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=450.0, help="seconds in all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tests", nargs="*", default=list(KERNEL_TESTS))
    parser.add_argument("--platform", default="gpu", help="JAX platform to check (gpu)")
    parser.add_argument("--gemm-size", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=4096, help="flash attention's length")
    args = parser.parse_args()
    clock = Clock(args.budget)
    result: dict[str, Any] = {"benchmark": "gpu_check", "environment": environment(),
                              "toolchain": _attempt(clock, 0, "toolchain", toolchain)}
    gpus = devices(args.platform)
    if not gpus:
        reason = f"no {args.platform.upper()}: JAX's devices are {jax.devices()}"
        log(reason)
        result.update(gpu=None, not_run=reason)
        emit(result)
        return 0
    result["gpu"] = {"devices": [str(d) for d in gpus],
                     "kind": gpus[0].device_kind,
                     "compute_capability": getattr(gpus[0], "compute_capability", None)}
    # The benchmarks first: they are few and bounded; the tests get what is left.
    result["gemm"] = {str(jnp.dtype(t)): _attempt(clock, 60, f"gemm {jnp.dtype(t)}",
                                                  functools.partial(gemm, t, args.rounds,
                                                                    args.gemm_size))
                      for t in (jnp.float16, jnp.bfloat16)}
    result["flash_attention"] = {
        f"{jnp.dtype(t)}{'_causal' if c else ''}": _attempt(
            clock, 45, "flash attention",
            functools.partial(flash_attention, t, c, args.rounds, args.seq))
        for t in (jnp.float16, jnp.bfloat16) for c in (False, True)}
    result["correctness"] = _attempt(clock, 30, "correctness",
                                     lambda: correctness(args.tests, clock.left() - 5))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
