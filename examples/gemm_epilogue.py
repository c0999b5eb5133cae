"""A GEMM with a fused epilogue: ``act(x @ w + bias)`` in one kernel, for an MLP layer.

The accumulator stays in registers (a ``jt.fragment``) while the bias is added and the
activation applied, so the product never makes a round trip through memory. The activation
is a compile-time constant (a keyword-only parameter), so ``"silu"`` and ``"gelu"`` are two
specialisations of one kernel.

    python examples/gemm_epilogue.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxtile as jt


@jt.kernel(threads=128)
def linear_act(x, w, bias, *, act="silu", bm=64, bn=64, bk=32, stages=2):
    """``act(x @ w + bias)`` for ``x`` (M, K), ``w`` (K, N) and ``bias`` (N,), accumulated in
    float32 and returned in ``x.dtype``; ``act`` is ``"silu"``, ``"gelu"`` (the tanh
    approximation, as ``jax.nn.gelu``'s default) or ``"none"``. Any M, N, K."""
    if act not in ("silu", "gelu", "none"):
        raise ValueError(f"linear_act: act must be 'silu', 'gelu' or 'none', got {act!r}")
    m, k = x.shape
    n = w.shape[1]
    out = jt.empty((m, n), x.dtype)
    bx, by = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    x_s = jt.shared((bm, bk), x.dtype)
    w_s = jt.shared((bk, bn), w.dtype)
    b_t = jt.fragment((bn,), jnp.float32)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.pipelined(jt.cdiv(k, bk), stages=stages)
    def _(kk):
        jt.copy(x.at[by * bm, kk * bk], x_s)
        jt.copy(w.at[kk * bk, bx * bn], w_s)
        jt.gemm(x_s, w_s, acc)

    # The epilogue, on the accumulator in registers: bias, then the activation.
    jt.copy(bias.at[bx * bn], b_t)
    z = acc[...] + b_t[...][None, :]
    if act == "silu":
        z = z * jax.nn.sigmoid(z)
    elif act == "gelu":
        z = jax.nn.gelu(z, approximate=True)
    acc[...] = z
    jt.copy(acc, out.at[by * bm, bx * bn])      # the edge blocks' extra rows are dropped
    return out


def linear_act_jnp(x, w, bias, act="silu"):
    """The same layer in plain jnp, to check the kernel against."""
    z = jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32),
                precision=jax.lax.Precision.HIGHEST) + bias.astype(jnp.float32)
    z = {"silu": jax.nn.silu, "gelu": jax.nn.gelu, "none": lambda v: v}[act](z)
    return z.astype(x.dtype)


def main() -> None:
    kx, kw, kb = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (200, 96))
    w = jax.random.normal(kw, (96, 130)) / 10
    bias = jax.random.normal(kb, (130,))
    for act in ("silu", "gelu"):
        got = jax.jit(lambda x, w, b, act=act: linear_act(x, w, b, act=act))(x, w, bias)
        err = float(jnp.max(jnp.abs(got - linear_act_jnp(x, w, bias, act))))
        print(f"linear + {act}: {got.shape}, max |jaxtile - jnp| = {err:.2e}")
        if not err < 1e-4:
            raise SystemExit(f"FAILED: linear + {act} differs from jnp by {err}")
    print("OK")


if __name__ == "__main__":
    main()
