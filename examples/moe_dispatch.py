"""Mixture-of-experts routing: top-k experts per token, dispatch by gather, combine by gather.

The router's top-k and the slot each (token, choice) takes in its expert's buffer are a few
small jnp operations (``jax.lax.top_k``, a cumulative count); the data movement, which is
where the time goes, is two kernels:

- ``dispatch`` gathers the tokens routed to each expert into a dense (experts, capacity, d)
  buffer, reading the row numbers from the routing table (``jt.gather``; empty slots hold -1,
  out of range, and read zeros);
- ``combine`` gathers each token's k expert outputs back and sums them with the router's
  weights (a token whose choice overflowed its expert's capacity gets nothing from it).

The experts' own matmuls are ``jax.vmap(jt.ops.matmul)``: one kernel launch for all experts.

    python examples/moe_dispatch.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxtile as jt


@jt.kernel(threads=128)
def dispatch(x, token_of, *, slots=16):
    """``out[e, c] = x[token_of[e, c]]`` for ``x`` (tokens, d) and ``token_of`` (experts,
    capacity) int32; a slot holding -1 (or any row out of range) gets zeros."""
    _, d = x.shape
    experts, capacity = token_of.shape
    out = jt.empty((experts, capacity, d), x.dtype)
    c, e = jt.grid(jt.cdiv(capacity, slots), experts)
    ids = jt.fragment((slots,), jnp.int32)
    rows = jt.fragment((slots, d), x.dtype)
    jt.copy(token_of.at[e, c * slots], ids, pad=-1)
    jt.gather(x, ids[...], rows)                    # rows[i] = x[ids[i]], zeros when -1
    jt.copy(rows, out.at[e, c * slots, 0])
    return out


@jt.kernel(threads=128)
def combine(expert_out, slot_of, weight, *, rows=8):
    """``out[t] = sum_j weight[t, j] * expert_out[slot_of[t, j]]`` for ``expert_out``
    (experts * capacity, d), ``slot_of`` (tokens, k) int32 (-1: dropped) and ``weight``
    (tokens, k); summed in float32, returned in ``expert_out.dtype``."""
    tokens, k = slot_of.shape
    d = expert_out.shape[1]
    out = jt.empty((tokens, d), expert_out.dtype)
    r = jt.grid(jt.cdiv(tokens, rows))
    ids = jt.fragment((rows, k), jnp.int32)
    w_t = jt.fragment((rows, k), jnp.float32)
    got = jt.fragment((rows, d), jnp.float32)
    acc = jt.fragment((rows, d), jnp.float32)
    jt.copy(slot_of.at[r * rows, 0], ids, pad=-1)
    jt.copy(weight.at[r * rows, 0], w_t)
    acc[...] = jnp.zeros((rows, d), jnp.float32)
    for j in range(k):                              # k is static: unrolled at trace time
        jt.gather(expert_out, ids[...][:, j], got)
        acc[...] += w_t[...][:, j:j + 1] * got[...]
    jt.copy(acc, out.at[r * rows, 0])
    return out


def route(x, w_router, k, capacity):
    """Top-k routing in jnp: ``(token_of, slot_of, weight, experts)``.

    ``experts`` (tokens, k): the chosen experts; ``weight``: their softmax probabilities;
    ``token_of`` (experts, capacity): the token in each slot of each expert's buffer, -1 for
    an empty slot; ``slot_of`` (tokens, k): the row of that choice in the flattened
    (experts * capacity) buffer, -1 where the expert was already full."""
    tokens = x.shape[0]
    n_experts = w_router.shape[1]
    probs = jax.nn.softmax(jnp.dot(x, w_router, precision=jax.lax.Precision.HIGHEST), axis=-1)
    weight, experts = jax.lax.top_k(probs, k)
    flat = experts.reshape(-1)                                   # choice order: token-major
    onehot = jax.nn.one_hot(flat, n_experts, dtype=jnp.int32)
    pos = jnp.take_along_axis(jnp.cumsum(onehot, axis=0) - 1, flat[:, None], axis=1)[:, 0]
    keep = pos < capacity
    token = jnp.repeat(jnp.arange(tokens, dtype=jnp.int32), k)
    token_of = jnp.full((n_experts, capacity), -1, jnp.int32)
    token_of = token_of.at[flat, jnp.where(keep, pos, capacity)].set(token, mode="drop")
    slot_of = jnp.where(keep, flat * capacity + pos, -1).astype(jnp.int32).reshape(tokens, k)
    return token_of, slot_of, weight, experts


def moe(x, w_router, w_experts, *, k=2, capacity=16):
    """A mixture-of-experts layer whose dispatch, expert matmuls and combine are kernels."""
    n_experts, d, f = w_experts.shape
    token_of, slot_of, weight, _ = route(x, w_router, k, capacity)
    buf = dispatch(x, token_of)                                  # (experts, capacity, d)
    h = jax.vmap(jt.ops.matmul)(buf, w_experts)                  # (experts, capacity, f)
    return combine(h.reshape(n_experts * capacity, f), slot_of, weight)


def moe_jnp(x, w_router, w_experts, *, k=2, capacity=16):
    """The same layer token by token in jnp: each kept choice adds ``weight * x @ w_e``."""
    _, slot_of, weight, experts = route(x, w_router, k, capacity)
    per_choice = jnp.einsum("td,tkdf->tkf", x, w_experts[experts],
                            precision=jax.lax.Precision.HIGHEST)
    kept = (slot_of >= 0)[..., None]
    return jnp.sum(jnp.where(kept, weight[..., None] * per_choice, 0.0), axis=1)


def main() -> None:
    kx, kr, ke = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (40, 32))
    w_router = jax.random.normal(kr, (32, 4))
    w_experts = jax.random.normal(ke, (4, 32, 48)) / 6
    got = jax.jit(moe)(x, w_router, w_experts)
    dropped = int(jnp.sum(route(x, w_router, 2, 16)[1] < 0))
    err = float(jnp.max(jnp.abs(got - moe_jnp(x, w_router, w_experts))))
    print(f"MoE, 40 tokens, top-2 of 4 experts, capacity 16 ({dropped} choices over capacity): "
          f"max |jaxtile - jnp| = {err:.2e}")
    if not err < 1e-4:
        raise SystemExit(f"FAILED: the MoE layer differs from jnp by {err}")
    print("OK")


if __name__ == "__main__":
    main()
