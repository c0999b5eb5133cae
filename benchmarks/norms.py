"""Throughput of the library norms: ``jt.ops.layer_norm`` and ``jt.ops.rms_norm`` forward
on (4096, 1024) f32 vs the same formula in jnp, both under ``jax.jit``, timed alternately
(see ``softmax_matmul.compare``). Ratio = jaxtile / jnp; no target yet.

    python benchmarks/norms.py [--rounds 25]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from _timing import emit, environment
from softmax_matmul import compare

import jaxtile as jt


def layer_norm_formula(x, w, b, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * w + b


def rms_norm_formula(x, w, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def layer_norm_f64(x, w, b, eps=1e-5):
    x, w, b = (np.asarray(t, np.float64) for t in (x, w, b))
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * w + b


def rms_norm_f64(x, w, eps=1e-6):
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    kx, kw, kb = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (4096, 1024), jnp.float32) * 3 + 1
    w = jax.random.normal(kw, (1024,), jnp.float32)
    b = jax.random.normal(kb, (1024,), jnp.float32)
    emit({
        "benchmark": "norms",
        "description": "jax.jit(jaxtile norm) vs jax.jit(jnp formula) on XLA:CPU; "
                       "ratio = jaxtile / jnp (lower is better for jaxtile)",
        "layer_norm": compare("layer_norm", jax.jit(jt.ops.layer_norm),
                              jax.jit(layer_norm_formula), layer_norm_f64, (x, w, b),
                              rounds=args.rounds, calls=10),
        "rms_norm": compare("rms_norm", jax.jit(jt.ops.rms_norm), jax.jit(rms_norm_formula),
                            rms_norm_f64, (x, w), rounds=args.rounds, calls=10),
        "environment": environment(),
    })


if __name__ == "__main__":
    main()
