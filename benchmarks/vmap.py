"""vmap as a grid axis: a batched softmax costs what one big call costs.

- ``jax.vmap(jt.ops.softmax)`` over B=16 arrays of (256, 1024) f32: one kernel launch whose
  grid has an extra batch axis;
- the same data as one (16*256, 1024) call: the target is vmap / one call <= 1.2;
- a sequential loop over the batch (``lax.map`` of the unbatched kernel), which is what an
  ``ffi_call(..., vmap_method="sequential")`` does: reported as a ratio.

    python benchmarks/vmap.py [--rounds 20]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
from _timing import emit, environment, interleaved, log, ratio, summary

import jaxtile as jt

B, ROWS, COLS = 16, 256, 1024
TARGET = 1.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()

    x = jax.random.normal(jax.random.key(0), (B, ROWS, COLS))
    flat = x.reshape(B * ROWS, COLS)
    vmapped = jax.jit(jax.vmap(jt.ops.softmax))
    one_call = jax.jit(jt.ops.softmax)
    sequential = jax.jit(lambda x: jax.lax.map(jt.ops.softmax, x))
    results = {"vmap": vmapped(x), "one_call": one_call(flat).reshape(x.shape),
               "sequential": sequential(x)}
    err = {k: float(np.max(np.abs(np.asarray(v) - np.asarray(results["one_call"]))))
           for k, v in results.items()}
    log("max abs differences vs one call:", err)

    samples = interleaved({
        "vmap": lambda: vmapped(x).block_until_ready(),
        "one_call": lambda: one_call(flat).block_until_ready(),
        "sequential": lambda: sequential(x).block_until_ready(),
    }, rounds=args.rounds, calls=args.calls)
    vmap_vs_one = ratio(samples, "vmap", "one_call")
    emit({
        "benchmark": "vmap",
        "shape": [B, ROWS, COLS],
        "unit": "ms per call",
        **{k: summary(v, 1e3) for k, v in samples.items()},
        "ratio_vmap_vs_one_call": vmap_vs_one,
        "ratio_sequential_vs_vmap": ratio(samples, "sequential", "vmap"),
        "target_ratio_vmap_vs_one_call": TARGET,
        "meets_target": vmap_vs_one["of_medians"] <= TARGET,
        "max_abs_diff_vs_one_call": err,
        "environment": environment(),
    })


if __name__ == "__main__":
    main()
