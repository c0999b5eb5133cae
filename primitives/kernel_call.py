"""``kernel_call``: the primitive that stands for one compiled kernel in a user's program.

Its only kernel-identifying parameter is the content key, so the lowered HLO is a plain FFI
custom call (``jaxtile_cpu_call`` with a string attribute ``key``) that survives caching and
serialisation. The kernel must be loaded into this process's registry (``jaxtile._ffi``) before
the program runs; :func:`load` does that, and an unknown key fails with a clear error.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

from jaxtile import _ffi
from jaxtile.compiler import cache
from jaxtile.compiler import jax_internals as ji

kernel_call_p = ji.Primitive("jaxtile_kernel_call")
kernel_call_p.multiple_results = True


@dataclasses.dataclass(frozen=True, eq=False)
class KernelHandle:
    """A traced kernel, target-neutral: its IR's key, name and output types. Each
    platform's lowering rule compiles it for its own target
    (``spec.for_target(target).build(target)``).

    Equality goes by the key and the specialisation (whose rules may differ between two
    kernels that compile to the same code), hashing by the key.
    """

    key: str
    """The target-neutral key of the kernel's Tile IR (``build.ir_key``)."""
    name: str
    out_avals: tuple[ji.ShapedArray, ...]
    spec: Any = None
    """The frontend's specialisation: ``for_target(target)`` (the specialisation with the
    tiles that target's table chooses), ``build(target)`` (compile or fetch from the cache),
    ``reference(*args)``, ``batched(flags, size)``, ``resized(shapes)``, ``vjp``,
    ``start_vjp_builds(primals)`` and ``shard_rule`` (see ``jaxtile._specialisation``), used
    by the lowering, batching, AD and sharding rules."""
    per_shard: bool = False
    """Set on the per-device kernels that a sharded call lowers to, which must not be
    partitioned again."""
    label: str = ""
    """The kernel's name and specialisation (``softmax(f32[1000,1000], rows=4)``), which
    the lowering gives the custom call so that profiler traces show which kernel ran."""

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, KernelHandle) and other.key == self.key
                and other.spec is self.spec and other.per_shard == self.per_shard)

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"{self.name}@{self.key[:12]}"


def load(entry: cache.Entry) -> None:
    """Load a cached library into the FFI registry (a no-op if its key is loaded)."""
    _ffi.load_kernel(entry.key, entry.library, entry.symbol, entry.num_blocks, entry.alignment,
                     entry.meta.signature)


def _abstract_eval(*avals: Any, kernel: KernelHandle) -> tuple[ji.ShapedArray, ...]:
    del avals
    return kernel.out_avals


@functools.cache
def _jitted(kernel: KernelHandle):
    return jax.jit(functools.partial(kernel_call_p.bind, kernel=kernel))


def _impl(*args: Any, kernel: KernelHandle) -> Any:
    return _jitted(kernel)(*args)


@functools.cache
def eager_function(kernel: KernelHandle, out_tree: Any) -> Callable[..., Any]:
    """The kernel as a jitted function of concrete arrays returning its outputs in the
    structure ``out_tree``: what an eager call runs, without going through ``bind`` (what
    the primitive's impl would do anyway) or rebuilding the structure in Python."""
    def run(*args: Any) -> Any:
        return jax.tree.unflatten(out_tree, kernel_call_p.bind(*args, kernel=kernel))

    # The jitted function's name is what profiler traces call the eager call's program
    # (``jit_softmax``, ``PjitFunction(softmax)``).
    run.__name__ = run.__qualname__ = kernel.name
    return jax.jit(run)


kernel_call_p.def_abstract_eval(_abstract_eval)
kernel_call_p.def_impl(_impl)
