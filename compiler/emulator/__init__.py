"""The CUDA SIMT emulator's toolchain: build a `.cu` text for the CPU and run it."""

from .build import (
    Buffer,
    LaunchConfig,
    Scalar,
    Size,
    ToolchainError,
    build_library,
    cxx_compiler,
)
from .runner import EmulatedKernel, EmulatorError

__all__ = [
    "Buffer",
    "EmulatedKernel",
    "EmulatorError",
    "LaunchConfig",
    "Scalar",
    "Size",
    "ToolchainError",
    "build_library",
    "cxx_compiler",
]
