"""A kernel with dynamic sizes called with a new size, against compiling for that size.

The same row-scaling kernel is declared twice: with ``dynamic={"x": 0}`` (one compiled
kernel for every number of rows) and without (one kernel per shape). For each of a series of
new row counts, the clock covers ``jax.jit(kernel).trace(x, w).lower()``: tracing, the Tile
IR and, for the static kernel, a compile (for the dynamic one a cache hit: the kernel was
compiled once, for the first size, before the clock). XLA's own compile of the lowered
program is not included. Medians over the sizes, and their ratio; the build counter of the
cache shows how many kernels each variant compiled.

    python benchmarks/dynamic_sizes.py [--sizes 8]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time

os.environ.setdefault("JAXTILE_CACHE_DIR", tempfile.mkdtemp(prefix="jaxtile-bench-"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _timing import emit, environment, log  # noqa: E402

import jaxtile as jt  # noqa: E402
from jaxtile.compiler import cache  # noqa: E402


def _body(x, w, *, rows=8):
    n, d = x.shape
    out = jt.empty((n, d), x.dtype)
    r = jt.grid(jt.cdiv(n, rows))
    t = jt.fragment((rows, d), jnp.float32)
    jt.copy(x.at[r * rows, 0], t)
    t[...] = t[...] * w[...][None, :]
    jt.copy(t, out.at[r * rows, 0])
    return out


def _time_new_sizes(kernel, sizes: list[int], d: int) -> tuple[list[float], int]:
    w = jnp.ones((d,), jnp.float32)
    stored = cache.stats()["stored"]
    times = []
    for n in sizes:
        x = jnp.ones((n, d), jnp.float32)
        gc.collect()
        t0 = time.perf_counter()
        jax.jit(kernel).trace(x, w).lower()
        times.append(time.perf_counter() - t0)
    return times, cache.stats()["stored"] - stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, default=8, help="new sizes to call with")
    args = parser.parse_args()
    d = 256
    dynamic = jt.kernel(dynamic={"x": 0}, name="scale_rows_dynamic")(_body)
    static = jt.kernel(name="scale_rows_static")(_body)
    # Both variants compile once before the clock (also JAX's and TVM's first use).
    warm = jnp.ones((3, d), jnp.float32)
    jax.block_until_ready(dynamic(warm, jnp.ones((d,))))
    jax.block_until_ready(static(warm, jnp.ones((d,))))
    sizes = [1000 + 37 * i for i in range(args.sizes)]
    log(f"new sizes: {sizes}")
    dyn_times, dyn_builds = _time_new_sizes(dynamic, sizes, d)
    static_times, static_builds = _time_new_sizes(static, [n + 1 for n in sizes], d)
    dyn, fresh = statistics.median(dyn_times), statistics.median(static_times)
    emit({
        "benchmark": "dynamic_sizes", "environment": environment(),
        "new_size_dynamic_ms": round(dyn * 1e3, 2),
        "new_size_fresh_compile_ms": round(fresh * 1e3, 2),
        "speedup": round(fresh / dyn, 2),
        "kernels_compiled": {"dynamic": dyn_builds, "static": static_builds},
        "sizes": len(sizes),
    })


if __name__ == "__main__":
    main()
