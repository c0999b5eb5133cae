"""A kernel compiled for an AMD GPU, ready for the ROCm handler: its code object and launch.

Kept apart from :mod:`.lower` (which imports the code generator) so that the build can name
the type without loading the GPU tiers.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import cache, sizes
from ..gpu.launch import Launch
from .resources import KernelResources

ALIGNMENT = 16
"""Byte alignment the generated code assumes of every buffer (16-byte vector accesses; the
GPU code generator is CUDA's, ``compiler/cuda/compile.py``'s ALIGNMENT, and the ROCm handler
checks it as the CUDA one does: ``ffi/common/launch_spec.h``'s kBufferAlignment)."""


@dataclass(frozen=True)
class CompiledHip:
    """A code object ready to launch, with clang's resource figures for the kernel."""

    code_object: bytes
    """The AMDGPU ELF that ``hipModuleLoadData`` loads."""
    kernel_name: str
    """The kernel's (``extern "C"``) symbol in the code object."""
    arch: str
    """``gfx90a``, ``gfx942``: a code object runs on that architecture only."""
    launch: Launch
    resources: KernelResources
    log: str

    def store(self, key: str) -> cache.Entry:
        """Put the code object into the build cache under ``key`` (kind
        ``hip-code-object``)."""
        # A grid computed from the shapes is no number of blocks (Entry.launched_with sets
        # one per call, for the key).
        blocks = self.launch.num_blocks if sizes.is_static(self.launch.grid) else 1
        return cache.store(key, self.code_object, self.kernel_name, blocks,
                           alignment=ALIGNMENT, kind=cache.HIP_CODE_OBJECT,
                           launch=self.launch.encode())
