"""What the training examples share: a transformer block written once against an ``Ops``
namespace (jaxtile kernels, or plain jnp for comparison), its initial parameters, the
synthetic task, the training loop's timing, and the comparison that decides success.

The block: ``x + attn(rms_norm(x))`` then ``x + mlp(rms_norm(x))``, causal multi-head
self-attention, a GELU MLP. With ``JAXTILE`` its norms and matmuls are jaxtile kernels (2-D;
batch and sequence go through a reshape) and the attention is ``jt.ops.attention``, a flash
kernel on (batch, heads, seq, head_dim); all are differentiated by their backward kernels.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt

HI = jax.lax.Precision.HIGHEST
PARAM_NAMES = ("norm1", "wqkv", "wo", "norm2", "w1", "w2")


@dataclasses.dataclass(frozen=True)
class Ops:
    """The three operations the block needs."""

    name: str
    matmul: Callable   # (a, b) -> a @ b, 2-D
    attention: Callable  # causal attention of (batch, heads, seq, head_dim) q, k, v
    rms_norm: Callable  # (x, w) -> x / rms(x) * w over the last axis, 2-D


def _jnp_matmul(a, b):
    return jnp.matmul(a, b, precision=HI)


def _jnp_attention(q, k, v):
    """Causal softmax attention written out: scores, mask, softmax, weighted values."""
    s = q.shape[2]
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=HI) / np.sqrt(q.shape[-1])
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v, precision=HI)


def _jaxtile_attention(q, k, v):
    return jt.ops.attention(q, k, v, causal=True)


def _jnp_rms_norm(x, w, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


JAXTILE = Ops("jaxtile", jt.ops.matmul, _jaxtile_attention, jt.ops.rms_norm)
JNP = Ops("jnp", _jnp_matmul, _jnp_attention, _jnp_rms_norm)


@dataclasses.dataclass(frozen=True)
class Size:
    batch: int
    seq: int
    dim: int
    heads: int
    hidden: int


SIZES = {"default": Size(batch=8, seq=32, dim=64, heads=4, hidden=256),
         "small": Size(batch=8, seq=16, dim=32, heads=2, hidden=64)}


def init_params(key: jax.Array, size: Size) -> dict[str, jax.Array]:
    """The block's initial parameters (float32), a pure function of ``key``."""
    d, h = size.dim, size.hidden
    k = jax.random.split(key, 4)
    normal = jax.random.normal
    return {"norm1": jnp.ones((d,)), "wqkv": normal(k[0], (d, 3 * d)) / np.sqrt(d),
            "wo": normal(k[1], (d, d)) / np.sqrt(d), "norm2": jnp.ones((d,)),
            "w1": normal(k[2], (d, h)) / np.sqrt(d), "w2": normal(k[3], (h, d)) / np.sqrt(h)}


def block(p: Mapping[str, jax.Array], x: jax.Array, ops: Ops, heads: int) -> jax.Array:
    """One pre-norm transformer block on ``x`` of shape (batch, seq, dim)."""
    b, s, d = x.shape
    dh = d // heads

    def rows(f, h, *args):                 # a 2-D op on (batch * seq) rows
        out = f(h.reshape(b * s, h.shape[-1]), *args)
        return out.reshape(b, s, out.shape[-1])

    def split_heads(t):                    # (b, s, d) -> (b, heads, s, dh)
        return t.reshape(b, s, heads, dh).transpose(0, 2, 1, 3)

    h = rows(ops.rms_norm, x, p["norm1"])
    q, k, v = jnp.split(rows(ops.matmul, h, p["wqkv"]), 3, axis=-1)
    o = ops.attention(split_heads(q), split_heads(k), split_heads(v))
    o = o.transpose(0, 2, 1, 3).reshape(b, s, d)
    x = x + rows(ops.matmul, o, p["wo"])
    h = rows(ops.rms_norm, x, p["norm2"])
    return x + rows(ops.matmul, jax.nn.gelu(rows(ops.matmul, h, p["w1"])), p["w2"])


def mse(pred: jax.Array, target: jax.Array) -> jax.Array:
    return jnp.mean((pred - target) ** 2)


def batches(size: Size, steps: int, seed: int = 0) -> list[tuple[jax.Array, jax.Array]]:
    """``steps`` batches of the task: from a sequence of random vectors, predict at each
    position a fixed random linear map of the running mean of the positions so far (the
    causal attention has something to learn)."""
    key_map, key_x = jax.random.split(jax.random.key(seed))
    m = jax.random.normal(key_map, (size.dim, size.dim)) / np.sqrt(size.dim)
    counts = jnp.arange(1, size.seq + 1, dtype=jnp.float32)[None, :, None]
    out = []
    for step in range(steps):
        x = jax.random.normal(jax.random.fold_in(key_x, step), (size.batch, size.seq, size.dim))
        target = jnp.matmul(jnp.cumsum(x, axis=1) / counts, m, precision=HI)
        out.append((x, target))
    return out


def timed_steps(step: Callable[[jax.Array, jax.Array], jax.Array],
                data: list[tuple[jax.Array, jax.Array]]) -> tuple[list[float], list[float]]:
    """Run ``step(x, y) -> loss`` over ``data``; the losses and each step's seconds."""
    losses, seconds = [], []
    for x, y in data:
        t0 = time.perf_counter()
        loss = float(jax.block_until_ready(step(x, y)))
        seconds.append(time.perf_counter() - t0)
        losses.append(loss)
    return losses, seconds


def compare(framework: str, runs: Mapping[str, tuple[list[float], list[float]]],
            rtol: float) -> int:
    """Print both runs' losses and step times, and the verdict; return the exit status.

    Success: every step's jaxtile loss within ``rtol`` of the jnp one, and the loss fell."""
    (ours, t_ours), (theirs, t_theirs) = runs["jaxtile"], runs["jnp"]
    print(f"{framework}: step  loss(jaxtile)  loss(jnp)    rel.diff   ms(jaxtile)  ms(jnp)")
    worst = 0.0
    for i, (a, b) in enumerate(zip(ours, theirs)):
        rel = abs(a - b) / max(abs(b), 1e-30)
        worst = max(worst, rel)
        print(f"{framework}: {i:4d}  {a:12.6f}  {b:12.6f}  {rel:9.2e}  {1e3 * t_ours[i]:10.2f}"
              f"  {1e3 * t_theirs[i]:8.2f}")
    if len(ours) > 1:
        per_ours, per_theirs = np.median(t_ours[1:]), np.median(t_theirs[1:])
        print(f"{framework}: median step after the first (compiling) one: jaxtile "
              f"{1e3 * per_ours:.2f} ms, jnp {1e3 * per_theirs:.2f} ms "
              f"({per_ours / per_theirs:.2f}x); first step {t_ours[0]:.1f} s vs "
              f"{t_theirs[0]:.1f} s")
    matched = worst <= rtol
    decreased = len(ours) > 1 and ours[-1] < ours[0]
    if matched and decreased:
        print(f"OK: losses decreased ({ours[0]:.4f} -> {ours[-1]:.4f}) and matched jnp "
              f"within {rtol:g} (worst {worst:.1e})")
        return 0
    print(f"FAILED: matched jnp within {rtol:g}: {matched} (worst {worst:.1e}); "
          f"loss decreased: {decreased}")
    return 1


def cli(main: Callable[..., int], description: str) -> None:
    """``--steps N`` and ``--small``; exits with ``main``'s status."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--small", action="store_true", help="a small model and batch")
    args = parser.parse_args()
    raise SystemExit(main(steps=args.steps, size="small" if args.small else "default"))
