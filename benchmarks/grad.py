"""Reverse mode through jaxtile kernels vs the same loss in jnp on XLA:CPU.

The loss is a small attention-like layer on (512, 512) inputs:
``softmax(matmul(x, w1)) @ w2`` with a sum of squares on top; ``jax.grad`` with respect to
x, w1 and w2. The jaxtile version uses ``jt.ops.matmul`` and ``jt.ops.softmax`` (whose vjp
rules call compiled backward kernels); the jnp version the same formula. Both are jitted
and timed alternately; gradients are checked against each other. No target yet.

    python benchmarks/grad.py [--rounds 15]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from _timing import emit, environment, interleaved, log, ratio, summary

import jaxtile as jt

N = 512


def loss_jaxtile(x, w1, w2):
    h = jt.ops.softmax(jt.ops.matmul(x, w1))
    return jnp.sum(jt.ops.matmul(h, w2) ** 2)


def loss_jnp(x, w1, w2):
    h = jax.nn.softmax(x @ w1, axis=-1)
    return jnp.sum((h @ w2) ** 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()

    keys = jax.random.split(jax.random.key(0), 3)
    x, w1, w2 = (jax.random.normal(k, (N, N)) / np.sqrt(N) for k in keys)
    ours = jax.jit(jax.grad(loss_jaxtile, argnums=(0, 1, 2)))
    theirs = jax.jit(jax.grad(loss_jnp, argnums=(0, 1, 2)))
    errs = [float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
            for a, b in zip(ours(x, w1, w2), theirs(x, w1, w2))]
    log("relative max differences of the gradients:", errs)

    samples = interleaved({
        "jaxtile": lambda: jax.block_until_ready(ours(x, w1, w2)),
        "jnp": lambda: jax.block_until_ready(theirs(x, w1, w2)),
    }, rounds=args.rounds, calls=args.calls)
    emit({
        "benchmark": "grad",
        "loss": "sum((softmax(x @ w1) @ w2) ** 2), grad wrt x, w1, w2",
        "shape": [N, N],
        "unit": "ms per jitted grad call",
        **{k: summary(v, 1e3) for k, v in samples.items()},
        "ratio_jaxtile_vs_jnp": ratio(samples, "jaxtile", "jnp"),
        "max_relative_gradient_difference": max(errs),
        "environment": environment(),
    })


if __name__ == "__main__":
    main()
