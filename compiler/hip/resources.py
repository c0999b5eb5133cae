"""Resource figures of compiled AMD GPU kernels, read from clang's assembly: what ptxas' report
is for CUDA.

Each kernel's ``.amdhsa_kernel`` block (the kernel descriptor) and its entry in the HSA
metadata (``amdhsa.kernels``, code object v5) give the registers, LDS and scratch it
allocates; :meth:`KernelResources.waves_per_simd` turns them into occupancy with the
register-file and LDS sizes of :class:`~jaxtile.compiler.target.HipCaps`, which a test checks
against LLVM's own ``; Occupancy:`` comment.

The figures (AMDGPU's "Code Object V3+ Metadata" and "Kernel Descriptor" in LLVM's
AMDGPUUsage document):

- ``vgpr_count``: the unified vector registers per lane: the architectural VGPRs, padded to a
  multiple of 4 (``.amdhsa_accum_offset``), then the AGPRs;
- ``agpr_count``: accumulation registers (MFMA's C and D);
- ``sgpr_count``: scalar registers, VCC and the other reserved ones included;
- ``group_segment_fixed_size``: static LDS bytes per workgroup;
- ``private_segment_fixed_size``: scratch bytes per lane (spills and stack arrays);
- ``vgpr_spill_count`` / ``sgpr_spill_count``: registers spilled to scratch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..target import HipCaps


@dataclass(frozen=True)
class KernelResources:
    """What one kernel allocates per lane, per wave and per workgroup."""

    name: str
    vgprs: int
    """Unified vector registers per lane: ``arch_vgprs`` then ``agprs``."""
    arch_vgprs: int
    agprs: int
    sgprs: int
    lds_bytes: int
    """Static LDS per workgroup (dynamic LDS is given at launch)."""
    scratch_bytes: int
    """Private (scratch) memory per lane: non-zero means spills or stack arrays."""
    vgpr_spills: int
    sgpr_spills: int
    max_workgroup_size: int
    wave_size: int
    llvm_occupancy: int | None
    """Waves per SIMD as LLVM computed it for the maximum workgroup size (its ``;
    Occupancy:`` comment), None where the assembly has no such comment."""

    def waves_per_simd(self, caps: HipCaps, workgroup_size: int | None = None,
                       dynamic_lds: int = 0) -> int:
        """How many waves of this kernel one SIMD holds at once: the least of the limit of
        the architecture and those of the vector registers (in blocks of ``vgpr_granule``),
        the scalar registers and LDS
        (a compute unit's LDS shared by the workgroups on it, whose waves spread over its
        SIMDs)."""
        limits = [caps.max_waves_per_simd]
        if self.vgprs:
            limits.append(caps.vgprs // _round_up(self.vgprs, caps.vgpr_granule))
        if self.sgprs:
            # LLVM's GCNSubtarget::getOccupancyWithNumSGPRs for GFX8 and GFX9 (CDNA
            # included): at most 80 SGPRs give 10 waves, 88 give 9, 100 give 8, more give
            # 7, which is 800 // n without rounding n up to an allocation block.
            limits.append(caps.sgprs // self.sgprs)
        lds = self.lds_bytes + dynamic_lds
        if lds:
            waves_per_group = math.ceil((workgroup_size or self.max_workgroup_size)
                                        / caps.warp_size)
            groups = caps.lds_bytes // lds
            limits.append(max(1, groups * waves_per_group // caps.simds_per_cu) if groups
                          else 0)
        return min(limits)


def _round_up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


_DIRECTIVE = re.compile(r"^\s*\.(amdhsa_\w+)\s+(\S+)")
_META_ITEM = re.compile(r"^  - \.(\w+):\s*(.*)$")
_META_KEY = re.compile(r"^    \.(\w+):\s*(.*)$")
_OCCUPANCY = re.compile(r"^; Occupancy: (\d+)")


def _descriptors(asm: str) -> tuple[dict[str, dict[str, str]], dict[str, int]]:
    """Each kernel's ``.amdhsa_*`` directives, and LLVM's occupancy comment per kernel (the
    comment follows the kernel's descriptor block)."""
    blocks: dict[str, dict[str, str]] = {}
    occupancy: dict[str, int] = {}
    current = last = None
    for line in asm.splitlines():
        stripped = line.strip()
        if stripped.startswith(".amdhsa_kernel "):
            current = last = stripped.split()[1]
            blocks[current] = {}
        elif stripped == ".end_amdhsa_kernel":
            current = None
        elif current and (m := _DIRECTIVE.match(line)):
            blocks[current][m.group(1)] = m.group(2)
        elif last and (m := _OCCUPANCY.match(line)):
            occupancy[last] = int(m.group(1))
    return blocks, occupancy


def _metadata(asm: str) -> list[dict[str, str]]:
    """The kernels' top-level fields in the ``amdhsa.kernels`` metadata list."""
    start = asm.find("amdhsa.kernels:")
    if start < 0:
        return []
    kernels: list[dict[str, str]] = []
    for line in asm[start:].splitlines()[1:]:
        if line and not line.startswith(" "):
            break
        if m := _META_ITEM.match(line):
            kernels.append({m.group(1): m.group(2).strip()})
        elif kernels and (m := _META_KEY.match(line)):
            kernels[-1][m.group(1)] = m.group(2).strip()
    return kernels


def parse_assembly(asm: str) -> dict[str, KernelResources]:
    """The resource figures of every kernel in ``asm`` (clang's AMDGPU assembly with code
    object v4/v5 metadata), by kernel name."""
    blocks, occupancy = _descriptors(asm)
    out: dict[str, KernelResources] = {}
    for meta in _metadata(asm):
        name = meta["name"]
        block = blocks.get(name, {})
        vgprs = int(meta.get("vgpr_count", 0))
        agprs = int(meta.get("agpr_count", 0))
        arch = int(block["amdhsa_accum_offset"]) if agprs else vgprs
        out[name] = KernelResources(
            name=name, vgprs=vgprs, arch_vgprs=arch, agprs=agprs,
            sgprs=int(meta.get("sgpr_count", 0)),
            lds_bytes=int(meta.get("group_segment_fixed_size", 0)),
            scratch_bytes=int(meta.get("private_segment_fixed_size", 0)),
            vgpr_spills=int(meta.get("vgpr_spill_count", 0)),
            sgpr_spills=int(meta.get("sgpr_spill_count", 0)),
            max_workgroup_size=int(meta.get("max_flat_workgroup_size", 1024)),
            wave_size=int(meta.get("wavefront_size", 64)),
            llvm_occupancy=occupancy.get(name))
    return out
