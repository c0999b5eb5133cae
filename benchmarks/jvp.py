"""Forward mode through jaxtile kernels vs the same function in jnp on XLA:CPU.

The function is the layer of ``grad.py``, ``softmax(x @ w1) @ w2`` on (512, 512) inputs,
pushed forward with ``jax.jvp`` along tangents of x, w1 and w2. The jaxtile version uses
``jt.ops.matmul`` and ``jt.ops.softmax``, whose ``defjvp`` rules call compiled kernels; the
jnp version the same formula. Both are jitted and timed alternately; the tangents are
checked against each other. Also reported: the first call (trace, compile, run) of each.
No target yet.

    python benchmarks/jvp.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from _timing import emit, environment, interleaved, log, ratio, summary

import jaxtile as jt

N = 512


def layer_jaxtile(x, w1, w2):
    return jt.ops.matmul(jt.ops.softmax(jt.ops.matmul(x, w1)), w2)


def layer_jnp(x, w1, w2):
    return jax.nn.softmax(x @ w1, axis=-1) @ w2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()

    keys = jax.random.split(jax.random.key(0), 6)
    primals = tuple(jax.random.normal(k, (N, N)) / np.sqrt(N) for k in keys[:3])
    tangents = tuple(jax.random.normal(k, (N, N)) / np.sqrt(N) for k in keys[3:])
    ours = jax.jit(lambda p, t: jax.jvp(layer_jaxtile, p, t))
    theirs = jax.jit(lambda p, t: jax.jvp(layer_jnp, p, t))
    first = {}
    for name, fn in (("jaxtile", ours), ("jnp", theirs)):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(primals, tangents))
        first[name] = round(time.perf_counter() - t0, 4)
    (_, t_ours), (_, t_theirs) = ours(primals, tangents), theirs(primals, tangents)
    err = float(jnp.max(jnp.abs(t_ours - t_theirs)) / jnp.max(jnp.abs(t_theirs)))
    log("relative max difference of the output tangents:", err)

    samples = interleaved({
        "jaxtile": lambda: jax.block_until_ready(ours(primals, tangents)),
        "jnp": lambda: jax.block_until_ready(theirs(primals, tangents)),
    }, rounds=args.rounds, calls=args.calls)
    emit({
        "benchmark": "jvp",
        "function": "softmax(x @ w1) @ w2, jax.jvp along x, w1 and w2",
        "shape": [N, N],
        "unit": "ms per jitted jvp call",
        **{k: summary(v, 1e3) for k, v in samples.items()},
        "ratio_jaxtile_vs_jnp": ratio(samples, "jaxtile", "jnp"),
        "first_call_s": first,
        "max_relative_tangent_difference": err,
        "environment": environment(),
    })


if __name__ == "__main__":
    main()
