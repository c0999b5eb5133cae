"""Dispatch overhead: a jitted jaxtile kernel call on 8 floats vs the same op in jnp.

Both contenders are ``jax.jit`` functions called on an 8-element f32 array with
``block_until_ready`` after every call, so the kernel's own work is negligible and the time is
XLA's executable dispatch plus, for jaxtile, the FFI custom call (registry lookup, buffer
packing, kernel entry). A third contender calls the same FFI target through a bare
``jax.ffi.ffi_call`` (no jaxtile Python involved), to tell jaxtile's wrapper from the FFI
itself.

Eager calls (no ``jax.jit`` around the call) are timed too: they add jaxtile's Python
per-call work (the lookup of the call's cached jitted function) to the same jitted call.
Targets: jitted at most 1.05x the ``jnp`` op, eager at most 1.1x.

A fourth contender, where a C++ compiler is on PATH, is XLA's floor: a handler compiled here
that takes what jaxtile's takes (the thread pool, the ``key`` attribute, the buffers) and does
nothing. What it costs over the ``jnp`` op is XLA's custom-call path, which no handler can
avoid; ``ratio_floor_vs_jnp`` says how much of the target it leaves.

``--clock thread`` times by the calling thread's CPU time instead of wall time: on a loaded
machine, time spent preempted by other processes then counts for no contender (small XLA:CPU
programs, the kernel of one block and the FFI call all run on the calling thread).

    python benchmarks/dispatch.py [--rounds 20] [--calls 2000] [--clock wall|thread]
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from _timing import emit, environment, interleaved, log, ratio, summary

import jaxtile as jt

TARGET_RATIO = 1.05
TARGET_EAGER_RATIO = 1.1
N = 8


# Binds what jaxtile's CPU handler binds (ffi/cpu/handler.cc) and returns at once.
_FLOOR_SOURCE = """
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;
static ffi::Error floor_call(ffi::ThreadPool, std::string_view, ffi::RemainingArgs,
                             ffi::RemainingRets) {
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxtileBenchFloor, floor_call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Attr<std::string_view>("key")
                                  .RemainingArgs()
                                  .RemainingRets());
"""


def floor_target() -> str | None:
    """Compiles and registers the do-nothing handler; its target name, or None (and why, on
    stderr) where no C++ compiler is on PATH or the build fails."""
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        log("dispatch: no C++ compiler on PATH, so XLA's floor is not measured")
        return None
    # The library stays mapped once loaded, so its folder can go at once.
    with tempfile.TemporaryDirectory(prefix="jaxtile_dispatch_") as folder:
        tmp = Path(folder)
        (tmp / "floor.cc").write_text(_FLOOR_SOURCE)
        build = subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", "-std=c++17", "-w",
             f"-I{jax.ffi.include_dir()}", str(tmp / "floor.cc"), "-o", str(tmp / "floor.so")],
            capture_output=True, text=True)
        if build.returncode != 0:
            log(f"dispatch: the floor handler did not build, so it is not measured:\n"
                f"{build.stderr}")
            return None
        lib = ctypes.cdll.LoadLibrary(str(tmp / "floor.so"))
    jax.ffi.register_ffi_target("jaxtile_bench_floor", jax.ffi.pycapsule(lib.JaxtileBenchFloor),
                                platform="cpu")
    return "jaxtile_bench_floor"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall")
    args = parser.parse_args()

    x = jnp.arange(N, dtype=jnp.float32)
    y = jnp.full((N,), 0.5, jnp.float32)

    ours = jax.jit(lambda x, y: jt.ops.add(x, y, block=N))
    theirs = jax.jit(lambda x, y: x + y)
    # The same custom call jaxtile lowers to, issued directly.
    key = jt.ops.add.lower(x, y, block=N).key
    raw_call = jax.ffi.ffi_call("jaxtile_cpu_call", jax.ShapeDtypeStruct((N,), jnp.float32))
    raw = jax.jit(lambda x, y: raw_call(x, y, key=key))
    floor_name = floor_target()

    want = np.asarray(x) + np.asarray(y)
    for fn in (ours, theirs, raw):  # compiles (ours first: it loads the kernel) and checks
        np.testing.assert_array_equal(np.asarray(fn(x, y)), want)

    contenders = {
        "jaxtile": lambda: ours(x, y).block_until_ready(),
        "jnp": lambda: theirs(x, y).block_until_ready(),
        "raw_ffi_call": lambda: raw(x, y).block_until_ready(),
        "jaxtile_eager": lambda: jt.ops.add(x, y, block=N).block_until_ready(),
        "jnp_eager": lambda: (x + y).block_until_ready(),
    }
    if floor_name is not None:
        floor_call = jax.ffi.ffi_call(floor_name, jax.ShapeDtypeStruct((N,), jnp.float32))
        floor = jax.jit(lambda x, y: floor_call(x, y, key=key))
        floor(x, y).block_until_ready()
        contenders["xla_floor"] = lambda: floor(x, y).block_until_ready()
    log(f"dispatch: {args.rounds} rounds x {args.calls} calls of each contender ...")
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    interleaved(contenders, rounds=2, calls=args.calls // 4 or 1)  # warm-up, discarded
    samples = interleaved(contenders, rounds=args.rounds, calls=args.calls, clock=clock)

    r = ratio(samples, "jaxtile", "jnp")
    eager = ratio(samples, "jaxtile_eager", "jnp_eager")
    emit({
        "benchmark": "dispatch",
        "description": f"jax.jit call on a {N}-element f32 array, block_until_ready each call",
        "unit": "us per call",
        "clock": args.clock,
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "jaxtile": summary(samples["jaxtile"], 1e6),
        "jnp": summary(samples["jnp"], 1e6),
        "raw_ffi_call": summary(samples["raw_ffi_call"], 1e6),
        "ratio": r["of_medians"],
        "ratio_paired_median": r["paired_median"],
        "ratio_raw_ffi_call_vs_jnp": ratio(samples, "raw_ffi_call", "jnp")["of_medians"],
        "target_ratio": TARGET_RATIO,
        "meets_target": r["of_medians"] <= TARGET_RATIO,
        **({
            "xla_floor": summary(samples["xla_floor"], 1e6),
            "ratio_floor_vs_jnp": ratio(samples, "xla_floor", "jnp")["of_medians"],
            "ratio_vs_floor": ratio(samples, "jaxtile", "xla_floor")["of_medians"],
            "handler_ns_paired_median": round(1e9 * statistics.median(
                [a - b for a, b in zip(samples["jaxtile"], samples["xla_floor"])]), 1),
        } if "xla_floor" in samples else {}),
        "eager": {
            "jaxtile": summary(samples["jaxtile_eager"], 1e6),
            "jnp": summary(samples["jnp_eager"], 1e6),
            "ratio": eager["of_medians"],
            "ratio_paired_median": eager["paired_median"],
            "target_ratio": TARGET_EAGER_RATIO,
            "meets_target": eager["of_medians"] <= TARGET_EAGER_RATIO,
        },
        "environment": environment(),
    })


if __name__ == "__main__":
    main()
