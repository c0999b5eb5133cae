"""The ``cuda-emulator`` runner: CUDA code compiled for the SIMT emulator, as a CPU kernel
library that jaxtile's CPU FFI handler runs (``docs/emulator.md``).

The `.cu` text is exactly what the CUDA backend hands to NVRTC / nvcc (:func:`.lower.generate`);
only the launch shim the emulator appends differs.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from .. import ir
from ..emulator.build import Buffer, LaunchConfig, Size, build_library, runtime_library
from ..gpu.codegen.context import size_c
from ..gpu.codegen.lower import CudaKernel, generate
from ..target import Target

ALIGNMENT = 16
"""The buffer alignment generated code assumes (16-byte vector accesses)."""


@functools.cache
def load_runtime() -> None:
    """Load the emulator runtime (compiled on first use) into the process, globally: kernel
    libraries name it by its soname, which the dynamic loader then finds already loaded,
    wherever the cache keeps them."""
    ctypes.CDLL(str(runtime_library()), mode=ctypes.RTLD_GLOBAL)


def compile_to_library(kernel: ir.Kernel, target: Target) -> tuple[bytes, str]:
    """The emulator library of ``kernel`` (bytes) and its entry symbol."""
    code = generate(kernel, target)
    params = [Buffer(name, dtype) for name, dtype in code.params]
    params += [Size(name, i, d) for name, i, d in code.size_params]
    launch = LaunchConfig((max(code.num_blocks, 1), 1, 1), (code.threads, 1, 1),
                          code.shared_bytes, grid_of=grid_of(code))
    path = build_library(code.source, code.symbol, params, launch, file=f"{kernel.name}.cu")
    return Path(path).read_bytes(), code.symbol



def grid_of(code: CudaKernel) -> str:
    """C text of a dynamic grid's block count over the launch shim's buffers ('' if static)."""
    if code.num_blocks:
        return ""
    where = {name: Size(name, i, d).c_value for name, i, d in code.size_params}
    return size_c(code.grid_size, leaf=where.__getitem__)
