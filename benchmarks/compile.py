"""Compile and cache-load time of ``jt.ops.matmul_relu`` (1024 x 1024 x 1024, f32).

Every sample is a fresh Python process (this script re-run with ``--child MODE``):

- ``cold``: empty ``$JAXTILE_CACHE_DIR``; includes ``import tvm`` (the compiler's first use).
- ``cold_tvm_preimported``: empty cache dir, but the CPU backend (and so TVM) was imported
  before the clock started; the time of that import is reported as ``tvm_import_s``.
- ``warm``: the cache dir already holds the kernel; the compiler must not be needed, and
  the process must end without having imported TVM.

The clock covers ``jax.jit(jt.ops.matmul_relu).trace(a, b).lower()``: tracing the kernel
body and building its Tile IR (at the trace), then, in the CPU lowering rule, the content
key, the cache lookup, compiling on a miss, and loading the library into the FFI registry
("trace to loaded kernel"; kernels are compiled per platform when the program is lowered).
XLA's compilation of the lowered program is after that and reported apart
(``xla_compile_s``). Each child
uses JAX once before the clock starts, so JAX's own first-use costs are not counted.

    python benchmarks/compile.py [--processes 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _timing import emit, environment, log

TARGET_COLD_S = 1.0
TARGET_WARM_S = 0.050
SHAPE = (1024, 1024)
MODES = ("cold", "cold_tvm_preimported", "warm")


def child(mode: str) -> None:
    """One measurement in this (fresh) process; prints one JSON line."""
    import jax
    import jax.numpy as jnp

    import jaxtile as jt
    from jaxtile import _ffi

    a = jnp.ones(SHAPE, jnp.float32)
    b = jnp.ones(SHAPE, jnp.float32)
    jax.block_until_ready(jax.jit(jnp.sin)(a))  # JAX's first trace/compile/run, not timed

    tvm_import_s = None
    if mode == "cold_tvm_preimported":
        t0 = time.perf_counter()
        import jaxtile.compiler.cpu  # noqa: F401

        tvm_import_s = time.perf_counter() - t0

    # A pending full garbage collection (tens of ms with JAX's heap) would otherwise land in
    # whichever timed section allocates next.
    gc.collect()
    t0 = time.perf_counter()
    lowered = jax.jit(jt.ops.matmul_relu).trace(a, b).lower()
    load_s = time.perf_counter() - t0
    tvm_used = "tvm" in sys.modules
    loaded = len(_ffi.loaded_keys())

    t0 = time.perf_counter()
    compiled = lowered.compile()
    xla_compile_s = time.perf_counter() - t0
    out = jax.block_until_ready(compiled(a, b))
    ok = bool(jnp.all(out == SHAPE[0]))  # ones @ ones = K everywhere

    print(json.dumps({
        "load_s": load_s, "tvm_import_s": tvm_import_s, "xla_compile_s": xla_compile_s,
        "tvm_imported": tvm_used, "kernels_loaded": loaded, "result_ok": ok,
    }))


def run_child(mode: str, cache_dir: str) -> dict:
    env = {**os.environ, "JAXTILE_CACHE_DIR": cache_dir}
    env.pop("JAXTILE_INTERPRET", None)
    proc = subprocess.run([sys.executable, __file__, "--child", mode], env=env,
                          capture_output=True, text=True, check=False, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"child {mode} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median(rows: list[dict], field: str) -> float:
    return round(statistics.median(r[field] for r in rows), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=5, help="fresh processes per mode")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return

    rows: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="jaxtile-bench-") as root:
        warm_dir = os.path.join(root, "warm")
        log("compile: priming the warm cache dir ...")
        run_child("cold", warm_dir)
        for i in range(args.processes):
            shift = i % len(MODES)  # rotate the order, as for the in-process benchmarks
            for mode in MODES[shift:] + MODES[:shift]:
                cache = warm_dir if mode == "warm" else tempfile.mkdtemp(dir=root)
                rows[mode].append(run_child(mode, cache))
            log(f"compile: {i + 1}/{args.processes} rounds done")

    cold, pre, warm = rows["cold"], rows["cold_tvm_preimported"], rows["warm"]
    for mode, rs in rows.items():
        if not all(r["result_ok"] and r["kernels_loaded"] == 1 for r in rs):
            raise SystemExit(f"{mode}: a child did not load or run the kernel correctly: {rs}")
    cold_s, warm_s = median(cold, "load_s"), median(warm, "load_s")
    emit({
        "benchmark": "compile",
        "kernel": f"matmul_relu {SHAPE[0]}x{SHAPE[1]}x{SHAPE[1]} f32",
        "measured": "jax.jit(matmul_relu).trace(a, b).lower(): trace to loaded kernel, fresh "
                    "process",
        "processes_per_mode": args.processes,
        "cold_s": cold_s,
        "cold_s_tvm_preimported": median(pre, "load_s"),
        "tvm_import_s": median(pre, "tvm_import_s"),
        "warm_s": warm_s,
        "warm_ms": round(warm_s * 1e3, 2),
        "xla_compile_s": median(cold + pre + warm, "xla_compile_s"),
        "samples_s": {mode: [round(r["load_s"], 4) for r in rs] for mode, rs in rows.items()},
        "tvm_imported_in_warm_process": any(r["tvm_imported"] for r in warm),
        "tvm_imported_in_cold_process": all(r["tvm_imported"] for r in cold),
        "target_cold_s": TARGET_COLD_S,
        "target_warm_s": TARGET_WARM_S,
        "meets_target": {"cold": cold_s <= TARGET_COLD_S, "warm": warm_s <= TARGET_WARM_S},
        "environment": environment(),
    })


if __name__ == "__main__":
    main()
