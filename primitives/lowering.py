"""MLIR lowering of ``kernel_call``: an XLA FFI custom call that names the kernel by its key."""

from __future__ import annotations

from typing import Any

import jax
from jax.interpreters import mlir

from jaxtile import _ffi

from .kernel_call import KernelHandle, kernel_call_p

CPU_TARGET_NAME = "jaxtile_cpu_call"


def _cpu_lowering(ctx: Any, *args: Any, kernel: KernelHandle) -> Any:
    return jax.ffi.ffi_lowering(CPU_TARGET_NAME)(ctx, *args, key=kernel.key)


mlir.register_lowering(kernel_call_p, _cpu_lowering, platform="cpu")
jax.ffi.register_ffi_target(CPU_TARGET_NAME, _ffi.cpu_handler(), platform="cpu")
