"""The ``cuda-emulator`` runner: CUDA code compiled for the SIMT emulator, as a CPU kernel
library that jaxtile's CPU FFI handler runs (``docs/emulator.md``).

The `.cu` text is exactly what the CUDA backend hands to NVRTC / nvcc (:func:`.lower.generate`);
only the launch shim the emulator appends differs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import ir
from ..emulator.build import Buffer, LaunchConfig, Param, Size, TensorMapParam, build_library
from ..emulator.shim import ALIGNMENT, grid_of, load_runtime
from ..gpu.codegen.lower import GpuKernel, generate
from ..target import Target

__all__ = ["ALIGNMENT", "compile_to_library", "emulator_launch", "load_runtime"]


def compile_to_library(kernel: ir.Kernel, target: Target) -> tuple[bytes, str]:
    """The emulator library of ``kernel`` (bytes) and its entry symbol."""
    code = generate(kernel, target)
    params, launch = emulator_launch(code)
    path = build_library(code.source, code.symbol, params, launch, file=f"{kernel.name}.cu")
    return Path(path).read_bytes(), code.symbol


def emulator_launch(code: GpuKernel) -> tuple[list[Param], LaunchConfig]:
    """The emulator's parameters and launch of generated ``code`` (also for an edited copy of
    its source): its buffers, dynamic sizes and tensor maps."""
    params: list[Param] = [Buffer(name, dtype) for name, dtype in code.params]
    params += [Size(name, i, d) for name, i, d in code.size_params]
    # The emulator's own tensor maps, built by the launch shim (the CUDA handler builds
    # CUtensorMaps the same way from the same figures).
    params += [TensorMapParam(m.name, m.buffer, np.dtype(code.params[m.buffer][1]).itemsize,
                              m.box, m.swizzle) for m in code.tensor_maps]
    launch = LaunchConfig((max(code.num_blocks, 1), 1, 1), (code.threads, 1, 1),
                          code.shared_bytes, grid_of=grid_of(code))
    return params, launch

