"""``jax.experimental.pallas.triton`` for jaxtile: ``from jaxtile.pallas import triton as
plgpu``. Masked loads and stores, ``dot``, atomics and ``CompilerParams``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

import jaxtile as jt

from ._call import _unsupported
from ._refs import BlockRef
from ._unsupported import stub as _stub


@dataclasses.dataclass(frozen=True)
class CompilerParams:
    """``num_warps``: the block has ``num_warps`` warps of the target (default 4): 32 threads
    each on NVIDIA GPUs and the CPU, 64 on AMD's (a wavefront, as Triton counts there);
    ``num_stages``: the pipeline depth of the kernel's ``pl.loop`` loops (default 3)."""

    num_warps: int | None = None
    num_stages: int | None = None


def _ref(x: Any, api: str) -> BlockRef:
    if not isinstance(x, BlockRef):
        raise _unsupported(f"{api} of a {type(x).__name__}",
                           "pass a kernel ref or a view of one (ref.at[...])")
    return x


def load(ref: Any, *, mask: Any = None, other: Any = None, cache_modifier: Any = None,
         eviction_policy: Any = None, volatile: bool = False) -> jax.Array:
    """The contents of ``ref`` (a ref or ``ref.at[...]`` view); where ``mask`` is False,
    ``other`` (0 when None). Cache hints are accepted and ignored."""
    del cache_modifier, eviction_policy, volatile
    return _ref(ref, "plgpu.load").load(mask, other)


def store(ref: Any, val: Any, *, mask: Any = None, eviction_policy: Any = None) -> None:
    """Write ``val`` to ``ref`` where ``mask`` is True; writes past the operand's end are
    dropped."""
    del eviction_policy
    _ref(ref, "plgpu.store").store(val, mask)


def dot(a: Any, b: Any, trans_a: bool = False, trans_b: bool = False,
        allow_tf32: bool | None = None, precision: Any = None) -> jax.Array:
    """``op(a) @ op(b)`` of 2-D tile values, accumulated in float32 (int32 for integers)."""
    del allow_tf32, precision
    if trans_a:
        a = a.T
    if trans_b:
        b = b.T
    acc = jnp.int32 if jnp.issubdtype(jnp.result_type(a), jnp.integer) else jnp.float32
    return jnp.dot(a, b, preferred_element_type=acc)


def approx_tanh(x: Any) -> jax.Array:
    """``tanh(x)`` (exact; the approximate PTX instruction is a CUDA detail)."""
    return jnp.tanh(x)


def _atomic(fn: Any, identity: Any, api: str) -> Any:
    def update(x_ref_or_view: Any, idx: Any, val: Any, *, mask: Any = None) -> None:
        view = _ref(x_ref_or_view, api).at[idx]
        value = jnp.broadcast_to(jnp.asarray(val).astype(view.dtype), view.shape)
        if mask is not None:
            value = jnp.where(mask, value, identity(view.dtype))
        dst, positions, _ = view._view()
        if positions:
            raise _unsupported(f"{api} with integer-array indices")
        fn(dst, value)
    update.__doc__ = (f"``{api}(ref, idx, val, mask=)``: update ``ref.at[idx]`` atomically "
                      "with ``val`` where ``mask`` holds. Unlike Pallas, returns None, not "
                      "the old values.")
    return update


def _lowest(dtype: Any) -> Any:
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _highest(dtype: Any) -> Any:
    return jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).max


atomic_add = _atomic(jt.atomic_add, lambda d: 0, "plgpu.atomic_add")
atomic_max = _atomic(jt.atomic_max, _lowest, "plgpu.atomic_max")
atomic_min = _atomic(jt.atomic_min, _highest, "plgpu.atomic_min")


def max_contiguous(x: Any, values: Any) -> Any:
    """A contiguity hint; jaxtile's analyses find it themselves."""
    del values
    return x


def debug_barrier() -> None:
    """A no-op: a Pallas block's threads share nothing the layer does not synchronise."""


def __getattr__(name: str) -> Any:
    return _stub("jax.experimental.pallas.triton", name)


__all__ = ["CompilerParams", "approx_tanh", "atomic_add", "atomic_max", "atomic_min",
           "debug_barrier", "dot", "load", "max_contiguous", "store"]
