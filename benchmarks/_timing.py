"""Shared helpers for the benchmarks: interleaved timing, summaries and JSON output.

Every benchmark prints one JSON object to stdout; progress and notes go to stderr.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any


def log(*parts: Any) -> None:
    """Human-readable progress, on stderr so that stdout stays pure JSON."""
    print(*parts, file=sys.stderr, flush=True)


def emit(result: Mapping[str, Any]) -> None:
    """Print the benchmark's single JSON object to stdout."""
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    sys.stdout.flush()


def interleaved(contenders: Mapping[str, Callable[[], Any]], *, rounds: int,
                calls: int, clock: Callable[[], float] = time.perf_counter
                ) -> dict[str, list[float]]:
    """Seconds per call of each contender, one sample per round, by ``clock`` (wall time; or
    e.g. ``time.thread_time``, the calling thread's CPU time, which preemption by other
    processes does not inflate).

    A round times ``calls`` back-to-back calls of every contender in turn; the order of the
    contenders is rotated every round, so that slow phases of a noisy machine fall on all of
    them alike. Each callable must do one complete call (including ``block_until_ready``).
    """
    names = list(contenders)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn = contenders[name]
            t0 = clock()
            for _ in range(calls):
                fn()
            samples[name].append((clock() - t0) / calls)
    return samples


def summary(samples: list[float], scale: float) -> dict[str, float]:
    """Median, quartiles and extremes of ``samples`` multiplied by ``scale`` (e.g. 1e6 for µs)."""
    q1, _, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else samples * 3
    return {
        "median": round(statistics.median(samples) * scale, 4),
        "p25": round(q1 * scale, 4),
        "p75": round(q3 * scale, 4),
        "min": round(min(samples) * scale, 4),
        "max": round(max(samples) * scale, 4),
        "n": len(samples),
    }


def ratio(samples: Mapping[str, list[float]], num: str, den: str) -> dict[str, float]:
    """``num / den``: the ratio of the medians, and the median of the per-round ratios (the
    rounds are paired, so the latter cancels slow drifts of the machine)."""
    paired = [a / b for a, b in zip(samples[num], samples[den])]
    return {
        "of_medians": round(statistics.median(samples[num]) / statistics.median(samples[den]), 4),
        "paired_median": round(statistics.median(paired), 4),
    }


def environment() -> dict[str, Any]:
    """Where and when the numbers were taken."""
    import jax

    import jaxtile

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpus_available": cpus,
        "jaxtile_num_threads": os.environ.get("JAXTILE_NUM_THREADS"),
        "jaxtile_keep_freed_memory": os.environ.get("JAXTILE_KEEP_FREED_MEMORY", "0 (default)"),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxtile": jaxtile.__version__,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
