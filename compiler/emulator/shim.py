"""What the CUDA and HIP emulator runners share: the runtime loaded into the process, the
buffer alignment generated code assumes, and a dynamic grid's block count as C text for the
launch shim the emulator appends to a kernel."""

from __future__ import annotations

import ctypes
import functools

from ..gpu.codegen.context import size_c
from ..gpu.codegen.lower import GpuKernel
from .build import Size, runtime_library

ALIGNMENT = 16
"""The buffer alignment generated code assumes (16-byte vector accesses)."""


@functools.cache
def load_runtime() -> None:
    """Load the emulator runtime (compiled on first use) into the process, globally: kernel
    libraries name it by its soname, which the dynamic loader then finds already loaded,
    wherever the cache keeps them."""
    ctypes.CDLL(str(runtime_library()), mode=ctypes.RTLD_GLOBAL)


def grid_of(code: GpuKernel) -> str:
    """C text of a dynamic grid's block count over the launch shim's buffers ('' if static)."""
    if code.num_blocks:
        return ""
    where = {name: Size(name, i, d).c_value for name, i, d in code.size_params}
    return size_c(code.grid_size, leaf=where.__getitem__)
