"""vmap of ``kernel_call``: one more grid axis, not a loop.

The rule asks the kernel's specialisation for a batched variant: the same body traced with
an extra (outermost) batch level, whose grid has one more axis and whose blocks each work on
one batch element through ``ref.at[b]`` views. Batched operands are moved to axis 0;
unbatched ones are passed as they are (no broadcast copies); outputs come back batched at 0.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax.interpreters import batching

from .kernel_call import KernelHandle, kernel_call_p


def _batch_kernel_call(args: Any, dims: Any, *, kernel: KernelHandle):
    # JAX marks an unbatched operand with dimension None.
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    if size == 0:  # an empty batch: every output is empty, and nothing is compiled
        return [jnp.zeros((0, *a.shape), a.dtype) for a in kernel.out_avals], \
            [0] * len(kernel.out_avals)
    flags = tuple(d is not None for d in dims)
    moved = [jnp.moveaxis(a, d, 0) if d is not None else a for a, d in zip(args, dims)]
    outs = kernel_call_p.bind(*moved, kernel=kernel.spec.batched(flags, size))
    return outs, [0] * len(outs)


batching.primitive_batchers[kernel_call_p] = _batch_kernel_call
