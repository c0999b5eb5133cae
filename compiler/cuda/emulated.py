"""The ``cuda-emulator`` runner: CUDA code compiled for the SIMT emulator, as a CPU kernel
library that jaxtile's CPU FFI handler runs (``docs/emulator.md``).

The `.cu` text is exactly what the CUDA backend hands to NVRTC / nvcc (:func:`.lower.generate`);
only the launch shim the emulator appends differs.
"""

from __future__ import annotations

from pathlib import Path

from .. import ir
from ..emulator.build import Buffer, LaunchConfig, Size, build_library
from ..emulator.shim import ALIGNMENT, grid_of, load_runtime
from ..gpu.codegen.lower import generate
from ..target import Target

__all__ = ["ALIGNMENT", "compile_to_library", "load_runtime"]


def compile_to_library(kernel: ir.Kernel, target: Target) -> tuple[bytes, str]:
    """The emulator library of ``kernel`` (bytes) and its entry symbol."""
    code = generate(kernel, target)
    params = [Buffer(name, dtype) for name, dtype in code.params]
    params += [Size(name, i, d) for name, i, d in code.size_params]
    launch = LaunchConfig((max(code.num_blocks, 1), 1, 1), (code.threads, 1, 1),
                          code.shared_bytes, grid_of=grid_of(code))
    path = build_library(code.source, code.symbol, params, launch, file=f"{kernel.name}.cu")
    return Path(path).read_bytes(), code.symbol

