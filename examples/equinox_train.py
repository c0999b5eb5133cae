"""Train a transformer block whose norms, matmuls and flash attention are jaxtile kernels,
with Equinox and optax (adam) under jax.jit, next to the same block in plain jnp.

    python examples/equinox_train.py [--steps N] [--small]

Both models start from the same parameters and see the same batches; the script prints each
step's loss and time for both, and succeeds (exit status 0) when the losses agree within
rtol 1e-4 at every step and the loss fell.
"""

from __future__ import annotations

import _transformer as tb
import equinox as eqx
import jax
import optax

LEARNING_RATE = 3e-3
RTOL = 1e-4


class Block(eqx.Module):
    """The transformer block of ``_transformer.block`` as an Equinox module."""

    norm1: jax.Array
    wqkv: jax.Array
    wo: jax.Array
    norm2: jax.Array
    w1: jax.Array
    w2: jax.Array
    ops: tb.Ops = eqx.field(static=True)
    heads: int = eqx.field(static=True)

    def __init__(self, size: tb.Size, ops: tb.Ops, key: jax.Array):
        for name, value in tb.init_params(key, size).items():
            setattr(self, name, value)
        self.ops = ops
        self.heads = size.heads

    def __call__(self, x):
        params = {name: getattr(self, name) for name in tb.PARAM_NAMES}
        return tb.block(params, x, self.ops, self.heads)


def make_train_step(optimizer: optax.GradientTransformation):
    """A jitted adam step on the mean squared error; returns the loss before the step."""

    @eqx.filter_jit
    def train_step(model: Block, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(lambda m: tb.mse(m(x), y))(model)
        updates, opt_state = optimizer.update(grads, opt_state, model)
        return eqx.apply_updates(model, updates), opt_state, loss

    return train_step


def train(ops: tb.Ops, size: tb.Size, data) -> tuple[list[float], list[float]]:
    """Train a fresh block (key 0) with ``ops``; its per-step losses and seconds."""
    model = Block(size, ops, jax.random.key(0))
    optimizer = optax.adam(LEARNING_RATE)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
    train_step = make_train_step(optimizer)

    def step(x, y):
        nonlocal model, opt_state
        model, opt_state, loss = train_step(model, opt_state, x, y)
        return loss

    return tb.timed_steps(step, data)


def main(steps: int = 20, size: str = "default") -> int:
    """Train with jaxtile kernels and with jnp, compare; 0 on success, 1 otherwise."""
    shape = tb.SIZES[size]
    data = tb.batches(shape, steps)
    runs = {ops.name: train(ops, shape, data) for ops in (tb.JAXTILE, tb.JNP)}
    return tb.compare("equinox", runs, RTOL)


if __name__ == "__main__":
    tb.cli(main, __doc__)
