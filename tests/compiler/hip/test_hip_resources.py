"""Resource figures of compiled AMD kernels (compiler/hip/resources.py) and the toolchain's
errors (compiler/hip/toolchain.py)."""

import re
import struct

import pytest
from hip_kernels import compiled

from jaxtile.compiler import target
from jaxtile.compiler.emulator.build import ToolchainError
from jaxtile.compiler.hip import resources, toolchain

needs_clang = pytest.mark.skipif(toolchain.clang_path() is None,
                                 reason=f"no clang for AMD GPUs: {toolchain.INSTALL_HINT}")
CAPS = target.parse_target("hip:gfx942").caps

# The parts of clang's assembly the figures come from, for two kernels: one spilling with a
# large register budget, one small.
ASM = """
\t.amdhsa_kernel big
\t\t.amdhsa_group_segment_fixed_size 40960
\t\t.amdhsa_private_segment_fixed_size 64
\t\t.amdhsa_next_free_vgpr 304
\t\t.amdhsa_accum_offset 176
\t.end_amdhsa_kernel
; Occupancy: 1
\t.amdhsa_kernel small
\t\t.amdhsa_next_free_vgpr 12
\t.end_amdhsa_kernel
; Occupancy: 8
\t.amdgpu_metadata
---
amdhsa.kernels:
  - .agpr_count:     128
    .args:
      - .address_space:  global
        .name:           nested
        .offset:         0
    .group_segment_fixed_size: 40960
    .max_flat_workgroup_size: 512
    .name:           big
    .private_segment_fixed_size: 64
    .sgpr_count:     40
    .sgpr_spill_count: 2
    .vgpr_count:     304
    .vgpr_spill_count: 9
    .wavefront_size: 64
  - .agpr_count:     0
    .max_flat_workgroup_size: 64
    .name:           small
    .sgpr_count:     10
    .vgpr_count:     12
    .wavefront_size: 64
amdhsa.target:   amdgcn-amd-amdhsa--gfx942
...
\t.end_amdgpu_metadata
"""


def test_figures_from_descriptor_and_metadata():
    big, small = resources.parse_assembly(ASM).values()
    assert (big.name, big.vgprs, big.arch_vgprs, big.agprs, big.sgprs) == ("big", 304, 176,
                                                                          128, 40)
    assert (big.lds_bytes, big.scratch_bytes, big.vgpr_spills, big.sgpr_spills) == \
        (40960, 64, 9, 2)
    assert (big.max_workgroup_size, big.llvm_occupancy) == (512, 1)
    assert (small.vgprs, small.arch_vgprs, small.agprs, small.lds_bytes) == (12, 12, 0, 0)


def test_occupancy_limits():
    big, small = resources.parse_assembly(ASM).values()
    # 304 registers of the 512 a SIMD lane has: one wave (LDS would allow 8 waves of 512
    # lanes over 4 SIMDs: 1 group x 8 waves / 4 = 2).
    assert big.waves_per_simd(CAPS) == 1
    assert small.waves_per_simd(CAPS) == CAPS.max_waves_per_simd == 8
    # 20 KiB of dynamic LDS: 3 one-wave groups per CU, over 4 SIMDs: one wave each at most.
    assert small.waves_per_simd(CAPS, dynamic_lds=20480) == 1
    # 128 VGPRs: 4 waves.
    assert resources.KernelResources("k", 128, 128, 0, 16, 0, 0, 0, 0, 256, 64,
                                     None).waves_per_simd(CAPS) == 4


@pytest.mark.parametrize("sgprs, waves", [(96, 8), (97, 8), (100, 8), (101, 7), (102, 7)])
def test_scalar_registers_limit_waves_as_llvm_counts_them(sgprs, waves):
    # LLVM's rule for GFX9 (<= 100 SGPRs: 8 waves, more: 7), not 800 over a count rounded
    # up to 16 (97 -> 112 -> 7 waves, which LLVM's occupancy comment contradicts: the
    # tile-language compile sweep found it on gfx90a).
    k = resources.KernelResources("k", 32, 32, 0, sgprs, 0, 0, 0, 0, 256, 64, None)
    assert k.waves_per_simd(CAPS) == waves


@needs_clang
@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
@pytest.mark.parametrize("name", ["device_groups", "mfma_ops", "mfma_gemm"])
def test_occupancy_agrees_with_llvm(name, arch):
    caps = target.parse_target(f"hip:{arch}").caps
    for k in compiled(name, arch).kernels.values():
        assert k.llvm_occupancy is not None
        assert k.waves_per_simd(caps) == k.llvm_occupancy, k


@needs_clang
@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
def test_mfma_gemm_figures(arch):
    gemm = compiled("mfma_gemm", arch).kernels["gemm_f16_mfma"]
    # Two operand tiles of 128 rows x 72 bytes; 4 accumulators of 16 registers in AGPRs.
    assert gemm.lds_bytes == 2 * 128 * 72
    assert gemm.agprs >= 64 and gemm.vgprs == gemm.arch_vgprs + gemm.agprs
    assert gemm.scratch_bytes == gemm.vgpr_spills == gemm.sgpr_spills == 0
    # Registers for 2 waves per SIMD; the K loop's MFMAs are the tile math's 2 x 2 x 4.
    assert gemm.vgprs <= 256
    instruction = "v_mfma_f32_32x32x8f16" if arch == "gfx90a" else "v_mfma_f32_32x32x8_f16"
    assert len(re.findall(rf"^\s+{instruction}\s", compiled("mfma_gemm", arch).assembly,
                          re.M)) == 16


@needs_clang
def test_a_rejected_source_names_the_file_and_how_to_reproduce():
    with pytest.raises(ToolchainError, match=r"(?s)gfx942 failed on 'bad.hip'.*"
                                             r"undeclared identifier 'nope'.*reproduce with:.*"
                                             r"--offload-arch=gfx942"):
        toolchain.compile_hip("JT_KERNEL void k() { nope(); }\n#include <jaxtile/device.h>",
                              "gfx942", file="bad.hip")


def test_missing_compiler_and_unknown_arch_are_clear_errors(monkeypatch):
    with pytest.raises(ToolchainError, match="unknown AMD architecture 'gfx1100'"):
        toolchain.compile_hip("", "gfx1100")
    monkeypatch.setattr(toolchain, "clang_path", lambda: None)
    with pytest.raises(ToolchainError, match="no clang for AMD GPUs.*apt-get install -y "
                                             "clang-19 lld-19"):
        toolchain.compile_hip("", "gfx942")


@needs_clang
@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
def test_code_object_is_the_assembly_linked(arch):
    """The code object comes from the assembly the figures are read from (compiled to
    assembly, then assembled and linked): an AMDGPU ELF shared object for the loader whose
    symbols include the kernel and its descriptor."""
    co = compiled("mfma_gemm", arch)
    data = co.data
    assert data[:4] == b"\x7fELF" and data[4] == 2              # 64-bit
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    assert (e_type, e_machine) == (3, 224)                       # ET_DYN, EM_AMDGPU
    for symbol in (b"gemm_f16_mfma\0", b"gemm_f16_mfma.kd\0"):
        assert symbol in data
    assert ".amdhsa_kernel gemm_f16_mfma" in co.assembly
