"""The hand-written HIP kernels of tests/compiler/hip/kernels, compiled once per architecture."""

import functools
from pathlib import Path

from jaxtile.compiler.hip import toolchain

KERNELS = Path(__file__).parent / "kernels"


@functools.cache
def compiled(name: str, arch: str) -> toolchain.CodeObject:
    """``kernels/<name>.hip`` compiled for ``arch``."""
    return toolchain.compile_hip((KERNELS / f"{name}.hip").read_text(), arch,
                                 file=f"{name}.hip")
