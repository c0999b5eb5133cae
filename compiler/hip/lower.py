"""Tile IR (after the GPU passes) -> HIP source written against ``jaxtile/device.h``.

The GPU code generator (:mod:`..gpu.codegen.lower`) writes the text; what differs from CUDA
comes from the target's capabilities (64-lane waves, LDS size) and from the device header's
HIP implementation (``device_hip.h``), which the same text compiles against with clang.
Kernels with a gemm are not lowered yet: the gemm planner knows NVIDIA's ``mma.sync`` only
(MFMA's layouts are :mod:`.mfma`'s, for the planner to use).
"""

from __future__ import annotations

from .. import ir
from ..errors import KernelError
from ..gpu.codegen.lower import generate, symbol_name
from ..target import Target
from .resources import KernelResources
from .toolchain import CodeObject, compile_hip


def check_supported(kernel: ir.Kernel, target: Target) -> None:
    """Raise a KernelError naming what ``kernel`` uses that HIP lowering does not have yet."""
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Op) and s.kind == "gemm":
            raise KernelError(f"kernel {kernel.name!r}: jt.gemm is not lowered for "
                              f"{target.name} yet (MFMA layouts exist, the gemm planner does "
                              "not use them)")


def source(kernel: ir.Kernel, target: Target) -> str:
    """The HIP source of ``kernel`` for ``target``, for inspection."""
    check_supported(kernel, target)
    return generate(kernel, target).source


def compile_code_object(kernel: ir.Kernel, target: Target) -> CodeObject:
    """``kernel`` compiled for ``target`` by clang: the code object, its assembly and the
    kernel's resource figures (``.kernels[symbol_name(kernel)]``)."""
    text = source(kernel, target)
    return compile_hip(text, target.caps.gfx, file=f"{symbol_name(kernel)}.hip")


def resources(kernel: ir.Kernel, target: Target) -> KernelResources:
    """The resource figures of ``kernel`` compiled for ``target`` (see :mod:`.resources`)."""
    return compile_code_object(kernel, target).kernels[symbol_name(kernel)]


def compile_to_library(kernel: ir.Kernel, target: Target) -> CodeObject:
    """No ROCm handler runs HIP kernels yet: building for a call is an error saying so."""
    raise KernelError(f"kernel {kernel.name!r}: jaxtile cannot run kernels on {target.name} "
                      "yet (no ROCm handler); kernel.lower(..., target=...) gives the HIP "
                      "source and compile_code_object its code object")
