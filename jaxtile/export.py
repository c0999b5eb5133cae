"""Exporting programs that call jaxtile kernels with ``jax.export``.

Each kernel call of an exported program carries the kernel's compiled library (versioned and
checksummed), so the artifact runs in any process that has done ``import jaxtile`` on a
machine of the same kind (architecture and CPU extensions), with no kernel cache and no
compiler::

    exported = jax.export.export(jax.jit(f), disabled_checks=jt.export_checks())(x)
    blob = exported.serialize()
    ...                                    # elsewhere, after `import jaxtile`:
    y = jax.export.deserialize(blob).call(x)

For ``platforms=["cuda"]`` each call carries its cubin and launch configuration instead, so
an export made on a machine without a GPU runs on one with only jaxlib's CUDA plugin and an
NVIDIA driver (no CUDA compiler); exporting for CUDA needs a CUDA compiler (NVRTC or nvcc)
where the export is made. Other ``platforms`` raise :class:`jaxtile.KernelError`.

Errors, and what to do:

- ``jaxtile.KernelError: ... pass disabled_checks=jt.export_checks()``: the export was made
  without ``disabled_checks``; pass :func:`export_checks`.
- ``No FFI handler registered for jaxtile_cpu_exported_call``: the process running the
  artifact never imported jaxtile, whose import registers the handler with XLA; add
  ``import jaxtile`` before calling it.
"""

from __future__ import annotations

import jax

from jaxtile.primitives.lowering import (
    CPU_EXPORTED_TARGET_NAME,
    CUDA_TARGET_NAME,
    ROCM_TARGET_NAME,
)

__all__ = ["export_checks"]


def export_checks() -> list[jax.export.DisabledSafetyCheck]:
    """The safety checks ``jax.export.export(..., disabled_checks=...)`` must skip for jaxtile.

    ``jax.export`` rejects custom calls whose targets it does not know to be stable. jaxtile's
    export targets, ``jaxtile_cpu_exported_call``, ``jaxtile_cuda_call`` and
    ``jaxtile_rocm_call``, are: their
    payload format is versioned, and a jaxtile that cannot read a payload says so instead of
    running it.
    """
    return [jax.export.DisabledSafetyCheck.custom_call(name)
            for name in (CPU_EXPORTED_TARGET_NAME, CUDA_TARGET_NAME, ROCM_TARGET_NAME)]
