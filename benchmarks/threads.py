"""Threads in a training step that mixes jaxtile kernels with XLA ops (issue 20, point 6).

    python benchmarks/threads.py [--rounds 9] [--steps 4] [--size medium] > threads.json

The step is ``examples/flax_train.py``'s (Flax NNX, adam, ``jax.jit``) on a bigger block
than the example's. Each configuration runs in a process of its own (the pool's size is
fixed at import), started once; the processes then take turns, ``--steps`` steps each per
round, so that the machine's slow phases fall on all of them alike. Per step: the wall
time, and the process's CPU time (all its threads): CPU time above the wall time times the
cores is work the threads did not need (spinning, or preempting each other).

Configurations: ``jaxtile`` (the default: a kernel's blocks spread over XLA's own intra-op
threads, as many as the process's affinity mask allows), ``jaxtile-own-pool``
(``JAXTILE_NUM_THREADS`` set to that same count: jaxtile's own worker threads beside XLA's,
the default before issue 20), ``jaxtile-1thread`` (``JAXTILE_NUM_THREADS=1``: every kernel
on XLA's calling thread), ``jaxtile-xla1`` (XLA's own intra-op work on one thread:
``--xla_cpu_multi_thread_eigen=false``) and ``jnp`` (the same block in plain jnp).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _timing

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"medium": dict(batch=16, seq=128, dim=256, heads=4, hidden=1024),
         "small": dict(batch=8, seq=64, dim=128, heads=4, hidden=512)}
CORES = len(os.sched_getaffinity(0))
CONFIGS = {
    "jaxtile": ("jaxtile", {}),
    "jaxtile-own-pool": ("jaxtile", {"JAXTILE_NUM_THREADS": str(CORES)}),
    "jaxtile-1thread": ("jaxtile", {"JAXTILE_NUM_THREADS": "1"}),
    "jaxtile-xla1": ("jaxtile", {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}),
    "jnp": ("jnp", {}),
}


def worker(ops_name: str, size: str) -> None:
    """Build and compile the step, then serve ``N`` on stdin: run N steps, answer with
    each step's wall and process CPU seconds (one JSON line)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import _transformer as tb
    import flax_train
    import jax
    import optax
    from flax import nnx

    shape = tb.Size(**SIZES[size])
    ops = {"jaxtile": tb.JAXTILE, "jnp": tb.JNP}[ops_name]
    model = flax_train.Block(shape, ops, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    x, y = tb.batches(shape, 1)[0]
    for _ in range(3):  # compile, load, warm up
        jax.block_until_ready(flax_train.train_step(model, optimizer, x, y))
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
    print(json.dumps({"ready": True, "threads": threads}), flush=True)
    for line in sys.stdin:
        wall, cpu = [], []
        for _ in range(int(line)):
            w0, c0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(flax_train.train_step(model, optimizer, x, y))
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
        print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=4, help="steps per process per round")
    parser.add_argument("--size", choices=SIZES, default="medium")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.size)
        return
    names = args.configs.split(",")
    procs = {}
    for name in names:
        ops, env = CONFIGS[name]
        full = {k: v for k, v in os.environ.items() if k != "JAXTILE_NUM_THREADS"} | env
        procs[name] = subprocess.Popen(
            [sys.executable, __file__, "--worker", ops, "--size", args.size],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=full)
        # One at a time: the compiles would otherwise compete.
        ready = json.loads(procs[name].stdout.readline())
        _timing.log(f"{name}: ready, {ready['threads']} threads in the process")
        procs[name].threads = ready["threads"]
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            p = procs[name]
            p.stdin.write(f"{args.steps}\n")
            p.stdin.flush()
            got = json.loads(p.stdout.readline())
            wall[name] += got["wall"]
            cpu[name] += got["cpu"]
        _timing.log(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{n} {1e3 * statistics.median(wall[n]):.1f} ms" for n in names))
    for p in procs.values():
        p.stdin.close()
        p.wait()
    cores = CORES
    _timing.emit({
        "benchmark": "threads", "size": SIZES[args.size], "rounds": args.rounds,
        "steps_per_round": args.steps, "cores": cores, **_timing.environment(),
        "configs": {n: {"threads_in_process": procs[n].threads,
                        "step_ms": _timing.summary(wall[n], 1e3),
                        "cpu_ms_per_step": _timing.summary(cpu[n], 1e3),
                        "cpu_over_wall": statistics.median(
                            c / w for c, w in zip(cpu[n], wall[n]))}
                    for n in names},
    })


if __name__ == "__main__":
    main()
