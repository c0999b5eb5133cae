"""Train a transformer block whose norms, matmuls and flash attention are jaxtile kernels,
with Flax NNX and optax (adam) under jax.jit, next to the same block in plain jnp.

    python examples/flax_train.py [--steps N] [--small]

Both models start from the same parameters and see the same batches; the script prints each
step's loss and time for both, and succeeds (exit status 0) when the losses agree within
rtol 1e-4 at every step and the loss fell.
"""

from __future__ import annotations

import _transformer as tb
import optax
from flax import nnx

LEARNING_RATE = 3e-3
RTOL = 1e-4


class Block(nnx.Module):
    """The transformer block of ``_transformer.block`` as an NNX module."""

    def __init__(self, size: tb.Size, ops: tb.Ops, *, rngs: nnx.Rngs):
        for name, value in tb.init_params(rngs.params(), size).items():
            setattr(self, name, nnx.Param(value))
        self.ops = ops
        self.heads = size.heads

    def __call__(self, x):
        params = {name: getattr(self, name)[...] for name in tb.PARAM_NAMES}
        return tb.block(params, x, self.ops, self.heads)


@nnx.jit
def train_step(model: Block, optimizer: nnx.Optimizer, x, y):
    """One adam step on the mean squared error; returns the loss before the step."""
    loss, grads = nnx.value_and_grad(lambda m: tb.mse(m(x), y))(model)
    optimizer.update(model, grads)
    return loss


def train(ops: tb.Ops, size: tb.Size, data) -> tuple[list[float], list[float]]:
    """Train a fresh block (seed 0) with ``ops``; its per-step losses and seconds."""
    model = Block(size, ops, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(LEARNING_RATE), wrt=nnx.Param)
    return tb.timed_steps(lambda x, y: train_step(model, optimizer, x, y), data)


def main(steps: int = 20, size: str = "default") -> int:
    """Train with jaxtile kernels and with jnp, compare; 0 on success, 1 otherwise."""
    shape = tb.SIZES[size]
    data = tb.batches(shape, steps)
    runs = {ops.name: train(ops, shape, data) for ops in (tb.JAXTILE, tb.JNP)}
    return tb.compare("flax", runs, RTOL)


if __name__ == "__main__":
    tb.cli(main, __doc__)
