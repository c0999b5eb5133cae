"""Throughput baseline: jaxtile's softmax and matmul_relu vs the jnp formula on XLA:CPU.

- softmax over the last axis of a (4096, 1024) f32 array: ``jt.ops.softmax`` vs the
  numerically stable jnp formula (max, exp, sum, divide);
- ``relu(a @ b)`` for (1024, 1024) @ (1024, 1024) f32: ``jt.ops.matmul_relu`` vs
  ``jnp.maximum(a @ b, 0)`` at default precision (on XLA:CPU an f32 dot is a plain f32 dot,
  the same arithmetic as jaxtile's float32 accumulation).

Both sides are ``jax.jit`` functions, timed alternately with ``block_until_ready``. Results are
checked against each other and against a float64 NumPy reference. No targets yet.

    python benchmarks/softmax_matmul.py [--rounds 25]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from _timing import emit, environment, interleaved, log, ratio, summary

import jaxtile as jt


def softmax_formula(x):
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def matmul_relu_formula(a, b):
    return jnp.maximum(a @ b, 0)


def softmax_f64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def matmul_relu_f64(a, b):
    return np.maximum(np.asarray(a, np.float64) @ np.asarray(b, np.float64), 0)


def compare(name, ours, theirs, reference, args, *, rounds, calls):
    """Check both contenders, then time them alternately; one JSON-ready dict."""
    got, want = np.asarray(ours(*args)), np.asarray(theirs(*args))
    exact = reference(*args)
    log(f"{name}: {rounds} rounds x {calls} calls of each contender ...")
    contenders = {
        "jaxtile": lambda: ours(*args).block_until_ready(),
        "jnp": lambda: theirs(*args).block_until_ready(),
    }
    interleaved(contenders, rounds=1, calls=calls)  # warm-up, discarded
    samples = interleaved(contenders, rounds=rounds, calls=calls)
    r = ratio(samples, "jaxtile", "jnp")
    return {
        "shapes": [list(a.shape) for a in args],
        "dtype": str(args[0].dtype),
        "unit": "ms per call",
        "rounds": rounds,
        "calls_per_round": calls,
        "jaxtile": summary(samples["jaxtile"], 1e3),
        "jnp": summary(samples["jnp"], 1e3),
        "ratio": r["of_medians"],
        "ratio_paired_median": r["paired_median"],
        "max_abs_err": float(np.max(np.abs(got - want))),
        "max_abs_err_vs_f64": {"jaxtile": float(np.max(np.abs(got - exact))),
                               "jnp": float(np.max(np.abs(want - exact)))},
        "max_abs_value": float(np.max(np.abs(exact))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()

    kx, ka, kb = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (4096, 1024), jnp.float32) * 4
    a = jax.random.normal(ka, (1024, 1024), jnp.float32)
    b = jax.random.normal(kb, (1024, 1024), jnp.float32)

    results = {
        "softmax": compare("softmax", jax.jit(jt.ops.softmax), jax.jit(softmax_formula),
                           softmax_f64, (x,), rounds=args.rounds, calls=10),
        "matmul_relu": compare("matmul_relu", jax.jit(jt.ops.matmul_relu),
                               jax.jit(matmul_relu_formula), matmul_relu_f64, (a, b),
                               rounds=args.rounds, calls=2),
    }
    emit({
        "benchmark": "softmax_matmul",
        "description": "jax.jit(jaxtile kernel) vs jax.jit(jnp formula) on XLA:CPU; "
                       "ratio = jaxtile / jnp (lower is better for jaxtile); no target yet",
        "jnp_matmul_precision": "default (plain f32 dot on XLA:CPU)",
        **results,
        "environment": environment(),
    })


if __name__ == "__main__":
    main()
