"""Reference semantics of a kernel: its traced body run as plain JAX ops.

The stateful body is discharged into a pure function of the buffer values, and the grid
becomes a ``fori_loop`` over blocks (block index 0 varies fastest) that threads the outputs
through; scratch buffers start as zeros in every block, outputs start as zeros once (and stay
zeros when the grid has no blocks). This is
``interpret=True``, the oracle of the tests, and the fallback for transformations without a
dedicated rule. It works under ``jit``, ``vmap`` and ``grad`` because it is plain JAX.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax

from jaxtile.compiler import ir
from jaxtile.compiler import jax_internals as ji

from . import tile_ops  # noqa: F401  (registers the discharge rules)


def block_coordinates(flat: Any, grid: Sequence[int]) -> list[Any]:
    """Unflatten a block number into per-axis block indices (axis 0 fastest)."""
    coords, stride = [], 1
    for extent in grid:
        coords.append((flat // stride) % extent)
        stride *= extent
    return coords


def run_reference(jaxpr: ji.ClosedJaxpr, grid: Sequence[int],
                  index_axes: Sequence[int | None], buffers: Sequence[ir.Buffer],
                  inputs: Sequence[Any]) -> list[Any]:
    """Run a traced kernel on ``inputs``; returns the final value of every output buffer.

    ``index_axes`` maps the jaxpr's block-index inputs to grid axes (None reads 0)."""
    n_in = len(inputs)
    allocs = buffers[n_in:]
    out_pos = [i for i, b in enumerate(allocs) if b.role == "output"]
    if math.prod(grid) == 0:
        # No block runs, so the body is not even discharged: its reads of an empty input
        # (``lens[b]`` with no rows) have no JAX meaning.
        return [jnp.zeros(allocs[i].shape, allocs[i].dtype) for i in out_pos]
    pure = ji.discharge_state(ji.widen_narrow_accumulation(ji.saturate_ref_indices(jaxpr)))

    def block(flat, outs):
        values, it = [], iter(outs)
        for b in allocs:
            values.append(next(it) if b.role == "output" else jnp.zeros(b.shape, b.dtype))
        coords = block_coordinates(flat, grid)
        index = [jnp.int32(0) if a is None else coords[a] for a in index_axes]
        final = ji.eval_jaxpr(pure, *index, *inputs, *values)
        return [final[n_in + i] for i in out_pos]

    init = [jnp.zeros(allocs[i].shape, allocs[i].dtype) for i in out_pos]
    return lax.fori_loop(0, math.prod(grid), block, init)
