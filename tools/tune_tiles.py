"""Regenerate the library kernels' stored tile tables (``jaxtile/ops/tiles/*.json``).

    python tools/tune_tiles.py cpu:x86-64-v4            # timed on this machine
    python tools/tune_tiles.py cpu:x86-64-v3            # the AVX2 code, timed here too
    python tools/tune_tiles.py cuda:sm_80 cuda:sm_90    # chosen by pruning, untimed
    python tools/tune_tiles.py cpu:x86-64-v4 --kernels matmul,softmax --json out.json

A CPU table is tuned with ``jax.jit``-ed calls on this machine, compiled for exactly that
ISA level (``JAXTILE_CPU_ISA`` is set from the table's name, so it needs a CPU that has the
level): for every kernel of ``jaxtile/ops/_tiles.py``'s ``SPACES`` and each of its tuning
shapes, :class:`jaxtile.autotune.TunedKernel` times the candidates (interleaved, medians)
and the winner is then timed against the rule (the hand-picked default) in ``--compare``
more interleaved rounds; the faster of the two in those is stored, with both medians (also
in ``--json``). A CUDA table,
where nothing can be timed without the GPU, takes for each shape the first candidate in
the space's order of preference that the autotuner's pruning keeps (the verifier, shared
memory over the architecture's limit, ptxas register spills when nvcc is installed), and
says so in the file. Run it on a quiet machine: the timings are medians, but a loaded one
still blurs close candidates.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1]) + os.sep
"""The checkout's path, left out of the messages stored in the tables."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="+", help="cpu:x86-64-v4, cpu:x86-64-v3, cuda:sm_80...")
    parser.add_argument("--kernels", help="comma-separated kernel names (default: all)")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per candidate")
    parser.add_argument("--compare", type=int, default=15,
                        help="interleaved rounds of the winner against the rule")
    parser.add_argument("--json", help="also write the measurements here")
    args = parser.parse_args()
    cpu = [t for t in args.tables if t.startswith("cpu:")]
    if len(cpu) > 1:
        sys.exit("one CPU table per run: the ISA level is fixed when jaxtile is imported")
    if cpu:
        os.environ["JAXTILE_CPU_ISA"] = cpu[0][4:]

    from jaxtile.ops import _tiles

    kernels = args.kernels.split(",") if args.kernels else list(_tiles.SPACES)
    results = []
    for table in args.tables:
        entries = {}
        for name in kernels:
            kernel = _kernel_named(name)
            for shapes in _tiles.SPACES[name].shapes:
                how = _timed if table.startswith("cpu:") else _pruned
                key, entry = how(table, kernel, shapes, args)
                entries.setdefault(name, {})[key] = entry
                results.append({"table": table, "kernel": name, "bucket": key, **entry})
                print(json.dumps(results[-1]), flush=True)
        _write(table, entries, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


def _kernel_named(name: str):
    import jaxtile as jt

    return getattr(jt.ops, name)


def _specs(shapes):
    import jax
    import numpy as np

    return tuple(jax.ShapeDtypeStruct(tuple(s), np.dtype(dt)) for s, dt in shapes)


def _configs(kernel, specs, target):
    from jaxtile.ops import _tiles

    configs = list(_tiles.SPACES[kernel.name].candidates(target))
    rule = _tiles.rule(kernel, specs)
    if rule not in configs:
        configs.insert(0, rule)
    return configs, rule


def _timed(table, kernel, shapes, args):
    import jax

    from jaxtile.autotune import TunedKernel, tuning_target
    from jaxtile.ops import _tiles

    target = tuning_target()
    if target.name != table:
        sys.exit(f"{table}: this process compiles for {target.name}")
    specs = _specs(shapes)
    configs, rule = _configs(kernel, specs, target)
    tuner = TunedKernel(kernel, configs, inputs=_tiles.inputs_for(kernel.name), runs=args.runs)
    report = tuner.tuning_report(*specs)
    best = report.best
    inputs = tuner._inputs(specs, specs)
    calls = {}
    for which, config in (("rule", rule), ("best", best)):
        k, tuned = tuner._with(config)
        calls[which] = jax.jit(lambda *a, k=k, tuned=tuned: k(*a, **tuned))
        jax.block_until_ready(calls[which](*inputs))
    samples = {w: [] for w in calls}
    for _ in range(args.compare):
        for w, fn in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*inputs))
            samples[w].append(time.perf_counter() - start)
    rule_s, best_s = (statistics.median(samples[w]) for w in ("rule", "best"))
    key = _tiles.bucket(kernel, specs, {})
    # The longer comparison decides: the autotuner's few runs may crown a candidate that
    # is no faster than the rule on a loaded machine, and then the rule stays.
    chosen = best if best_s < rule_s else rule
    return key, {"config": chosen, "autotune_best": best, "seconds": min(best_s, rule_s),
                 "rule": rule, "rule_seconds": rule_s,
                 "timed": sum(c.seconds is not None for c in report.candidates),
                 "pruned": sum(c.pruned is not None for c in report.candidates)}


def _pruned(table, kernel, shapes, args):
    import warnings

    from jaxtile.autotune import TunedKernel, _target_limits
    from jaxtile.compiler.errors import ClampedIndexWarning, KernelError
    from jaxtile.compiler.target import parse_target
    from jaxtile.ops import _tiles

    target = parse_target(table)
    specs = _specs(shapes)
    configs, rule = _configs(kernel, specs, target)
    tuner = TunedKernel(kernel, configs)
    rejected = []
    chosen = None
    for config in _tiles.SPACES[kernel.name].cuda:
        k, tuned = tuner._with(config)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ClampedIndexWarning)
            try:
                k._specialise(specs, tuned).check_threads(target)
                reason = _target_limits(k, tuned, specs, {}, target)
            except (KernelError, ClampedIndexWarning) as e:
                reason = f"{type(e).__name__}: {e}"
        if reason is None:
            chosen = config
            break
        rejected.append({"config": config, "reason": reason.replace(_ROOT, "")})
    key = _tiles.bucket(kernel, specs, {})
    return key, {"config": chosen or rule, "rule": rule, "rejected": rejected}


def _write(table, entries, args):
    from jaxtile.compiler.cuda.fingerprint import toolchain_fingerprint
    from jaxtile.ops import _tiles

    path = _tiles.table_path(table)
    old = json.loads(path.read_text())["kernels"] if path.exists() else {}
    timed = table.startswith("cpu:")
    data = {
        "format": _tiles.FORMAT, "table": table,
        "method": ("timed: jax.jit-ed calls on random inputs, candidates interleaved, median "
                   f"of {args.runs} runs each (jaxtile.autotune); 'seconds' and "
                   f"'rule_seconds' are medians of {args.compare} further interleaved rounds "
                   "of the winner and the rule; the faster of the two is stored"
                   if timed else
                   "pruned, untimed (no GPU here): the first candidate in the space's order of "
                   "preference that passes the verifier, the architecture's shared-memory "
                   "limit and ptxas without register spills; 'rejected' says why the ones "
                   "before it failed"),
        "how": f"python tools/tune_tiles.py {table}",
        "date": datetime.date.today().isoformat(),
        "machine": (f"{platform.machine()} {_cpu_model()}, {os.cpu_count()} CPUs, load "
                    f"{os.getloadavg()[0]:.1f}" if timed else toolchain_fingerprint()),
        "kernels": {**old, **{k: {**old.get(k, {}), **v} for k, v in entries.items()}},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
