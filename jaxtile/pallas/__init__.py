"""Pallas kernels compiled by jaxtile: ``from jaxtile import pallas as pl`` in place of
``from jax.experimental import pallas as pl`` (and :mod:`jaxtile.pallas.triton` for
``jax.experimental.pallas.triton``).

A ``pallas_call`` becomes one jaxtile kernel (see ``docs/pallas.md``): the Pallas grid is the
launch grid, each BlockSpec a window of the operand whose reads and writes are tile copies
with Pallas' edge rules, ``num_warps`` the block's threads and ``num_stages`` the depth of
the kernel's ``pl.loop`` pipelines. Names of ``jax.experimental.pallas`` that have no jaxtile
meaning (TPU memory spaces, semaphores, Mosaic GPU) exist and raise ``jt.KernelError``
naming the feature when used.
"""

from typing import Any

import jax.numpy as jnp

from ._call import (
    BlockSpec,
    GridSpec,
    cdiv,
    ds,
    dslice,
    loop,
    next_power_of_2,
    no_block_spec,
    num_programs,
    pallas_call,
    program_id,
    when,
)
from ._port import port
from ._refs import BlockRef
from ._unsupported import stub as _stub

Slice = type(ds(0, 1))
squeezed = None
"""A squeezed block dimension (the same as ``None`` in a block shape)."""


def multiple_of(x: Any, values: Any) -> Any:
    """A hint that ``x`` is a multiple of ``values``; jaxtile's analyses find it themselves."""
    del values
    return x


def reciprocal(x: Any, *, approx: bool = False) -> Any:
    """``1 / x`` (``approx`` is accepted; the division is exact)."""
    del approx
    return 1 / x


def __getattr__(name: str) -> Any:
    return _stub("jax.experimental.pallas", name)


__all__ = [
    "BlockRef", "BlockSpec", "GridSpec", "Slice", "cdiv", "ds", "dslice", "loop",
    "multiple_of", "next_power_of_2", "no_block_spec", "num_programs", "pallas_call",
    "port", "program_id", "reciprocal", "squeezed", "when",
]
del jnp
