"""The ``hip-emulator`` runner: the HIP text generated for an AMD GPU, compiled by the C++
compiler against the emulator in its wave64 mode, as a CPU kernel library that jaxtile's CPU
FFI handler runs (``docs/emulator.md``).

The `.hip` text is exactly what clang compiles for gfx90a / gfx942 (:func:`.lower.source`);
only the launch shim the emulator appends differs. With ``-DJAXTILE_WAVE64`` the emulator's
device header keeps ``device_hip.h``'s contract (64-lane waves, MFMA, buffer loads) and its
runtime runs the kernel's threads in waves of 64.
"""

from __future__ import annotations

from pathlib import Path

from .. import ir
from ..emulator.build import Buffer, LaunchConfig, Size, build_library
from ..emulator.shim import ALIGNMENT, grid_of, load_runtime
from ..gpu.codegen.lower import generate
from ..target import Target
from .lower import check_supported

__all__ = ["ALIGNMENT", "compile_to_library", "load_runtime"]


def compile_to_library(kernel: ir.Kernel, target: Target) -> tuple[bytes, str]:
    """The wave64 emulator library of ``kernel`` (bytes) and its entry symbol."""
    check_supported(kernel, target)
    code = generate(kernel, target)
    params = [Buffer(name, dtype) for name, dtype in code.params]
    params += [Size(name, i, d) for name, i, d in code.size_params]
    launch = LaunchConfig((max(code.num_blocks, 1), 1, 1), (code.threads, 1, 1),
                          code.shared_bytes, grid_of=grid_of(code),
                          warp_size=target.caps.warp_size)
    path = build_library(code.source, code.symbol, params, launch, file=f"{kernel.name}.hip")
    return Path(path).read_bytes(), code.symbol
