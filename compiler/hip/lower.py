"""Tile IR (after the GPU passes) -> HIP source written against ``jaxtile/device.h``.

The GPU code generator (:mod:`..gpu.codegen.lower`) writes the text; what differs from CUDA
comes from the target's capabilities (64-lane waves, LDS size, the MFMA shapes the gemm
planner picks from) and from the device header's HIP implementation (``device_hip.h``), which
the same text compiles against with clang.
"""

from __future__ import annotations

from .. import ir
from ..emulator.build import ToolchainError
from ..errors import KernelError
from ..gpu.codegen.lower import generate, symbol_name
from ..gpu.launch import Launch, buffer, dimension, launch_grid
from ..target import Target
from .artifact import CompiledHip
from .resources import KernelResources
from .toolchain import CodeObject, compile_hip


def check_supported(kernel: ir.Kernel, target: Target) -> None:
    """Raise a KernelError naming what ``kernel`` uses that HIP lowering does not have yet."""
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Op) and s.kind == "print":
            # AMD's device printf lives in the device library, which kernels are compiled
            # without (-nogpulib): there is nothing to print through.
            where = f" (at {s.line})" if s.line else ""
            raise KernelError(f"kernel {kernel.name!r}: jt.print is not supported on "
                              f"{target.name} (AMD's printf needs the ROCm device library, "
                              "which jaxtile does not link); print on the CPU, the CUDA "
                              f"emulator or in interpret mode{where}")


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


def compile_to_library(kernel: ir.Kernel, target: Target) -> CompiledHip:
    """``kernel`` compiled for ``target`` with its launch configuration, for the ROCm
    handler: one workgroup per grid block, the buffers passed in order, then the dynamic
    sizes. Raises KernelError naming the kernel when clang is missing or rejects the code
    (threads and LDS beyond the target's are refused before: the kernel's specialisation and
    the shared-memory planner check them)."""
    check_supported(kernel, target)
    code = generate(kernel, target)
    caps = target.caps
    grid = code.num_blocks or launch_grid(code.grid_size, code.size_params)
    launch = Launch((grid, 1, 1), (code.threads, 1, 1), code.shared_bytes,
                    tuple(buffer(i) for i in range(len(code.params))) +
                    tuple(dimension(i, d) for _, i, d in code.size_params))
    try:
        compiled = compile_hip(code.source, caps.gfx, file=f"{code.symbol}.hip")
    except ToolchainError as e:
        raise KernelError(f"kernel {kernel.name!r}: {e}") from None
    return CompiledHip(compiled.data, code.symbol, caps.gfx, launch,
                       compiled.kernels[code.symbol], compiled.log)
