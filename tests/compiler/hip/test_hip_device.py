"""device_hip.h, the device header's HIP implementation: hand-written kernels using every
group of it compile for gfx90a and gfx942 with no HIP headers and no device library, and
their assembly holds the instructions each group stands for."""

import re
import subprocess
from pathlib import Path

import pytest
from hip_kernels import compiled

from jaxtile.compiler import target
from jaxtile.compiler.emulator.build import DEVICE_INCLUDE, ToolchainError
from jaxtile.compiler.hip import toolchain

pytestmark = pytest.mark.skipif(toolchain.clang_path() is None,
                                reason=f"no clang for AMD GPUs: {toolchain.INSTALL_HINT}")

ARCHS = ["gfx90a", "gfx942"]


def _opcodes(asm: str) -> set[str]:
    """The instructions of ``asm``, without their encoding suffix (``_e32``, ``_e64``...)."""
    ops = re.findall(r"^\s+([a-z][a-z0-9_]+)", asm, re.M)
    return {re.sub(r"_(e32|e64|sdwa|dpp)$", "", op) for op in ops}


@pytest.mark.parametrize("arch", ARCHS)
def test_every_group_of_the_header_compiles_to_its_instructions(arch):
    co = compiled("device_groups", arch)
    assert co.data[:4] == b"\x7fELF"  # a code object, not an offload bundle
    ops = _opcodes(co.assembly)
    expected = {
        "s_barrier",            # sync_threads
        "ds_bpermute_b32",      # shfl_idx / _down / _up / xor by a run-time mask
        "buffer_load_dword", "buffer_load_dwordx2", "buffer_load_dwordx4",  # buffer_load
        "ds_write_b32", "ds_read_b32",  # LDS, static and dynamic
        "global_load_dwordx4",  # ptr_cast<f32x4> vector load
        "v_exp_f32",            # fast_exp2
        "v_cvt_f16_f32",        # to_half
        # agent-scope acquire: the vector L1 invalidated
        "buffer_wbinvl1_vol" if arch == "gfx90a" else "buffer_inv",
    }
    assert expected <= ops, sorted(expected - ops)
    # DPP quad permutes for the constant xor 1 and 2 shuffles.
    assert "quad_perm:[1,0,3,2]" in co.assembly and "quad_perm:[2,3,0,1]" in co.assembly
    # 64-lane ballots and votes read the 64-bit exec / compare masks.
    assert re.search(r"v_cmp_\w+_e64 s\[\d+:\d+\]", co.assembly)
    # Atomics: native adds and min/max, and compare-and-swap loops (atomics.h) for the rest.
    assert {"global_atomic_add", "global_atomic_smax", "global_atomic_smin",
            "global_atomic_swap"} <= ops
    assert any(op.startswith("global_atomic_cmpswap") for op in ops)
    # s_waitcnt vmcnt(0) and lgkmcnt(0) from wait_vmcnt<0> / wait_lgkmcnt<0>.
    assert "s_waitcnt vmcnt(0)" in co.assembly and "lgkmcnt(0)" in co.assembly
    assert co.kernels["groups"].scratch_bytes == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_mfma_wrappers_are_the_targets_instructions(arch):
    co = compiled("mfma_ops", arch)
    ops = _opcodes(co.assembly)
    want = {s.instruction for s in target.parse_target(f"hip:{arch}").caps.mfma
            if s.operand in ("f16", "bf16", "xf32")}
    assert want <= ops and len(want) == (6 if arch == "gfx942" else 4)
    assert co.kernels["mfma_ops"].agprs > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_math_functions_need_no_device_library(arch):
    co = compiled("device_groups", arch)
    # No call is left (s_swappc) in any kernel and the math kernel uses no scratch.
    assert "s_swappc" not in co.assembly and co.kernels["math"].scratch_bytes == 0


def test_printf_is_a_clear_compile_error():
    source = """#include <jaxtile/device.h>
using namespace jaxtile;
JT_KERNEL void show(ptr<float> x) { device_printf("%f", static_cast<double>(x[0])); }
"""
    with pytest.raises(ToolchainError, match="jt.print is not supported on AMD GPUs"):
        toolchain.compile_hip(source, "gfx942")


def test_the_toolchain_identity_covers_every_header_a_compile_reads(tmp_path):
    # clang -M lists the files the preprocessor opens; those of jaxtile/ must all be in the
    # digest that the HIP targets' content key holds.
    src = tmp_path / "k.hip"
    src.write_text("#include <jaxtile/device.h>\n#include <jaxtile/tile_gemm.h>\n")
    out = subprocess.run([toolchain.clang_path(), "-x", "hip", "--offload-arch=gfx942",
                          "--cuda-device-only", "-nogpuinc", "-nogpulib",
                          f"-I{DEVICE_INCLUDE}", "-M", str(src)],
                         capture_output=True, text=True, check=True).stdout
    read = {Path(p).name for p in out.replace("\\\n", " ").split()
            if "/jaxtile/" in p and p.endswith(".h")}
    assert "tile_gemm.h" in read and read <= set(toolchain.HEADERS)
    assert "device_ptx.h" not in toolchain.HEADERS


LDS_DIRECT = """#include <jaxtile/device.h>
using namespace jaxtile;
JT_KERNEL JT_LAUNCH_BOUNDS(256) void fill(ptr<const float> x, ptr<float> out) {
  JT_SHARED(float, tile, 256);
  const unsigned t = thread_idx().x;
  lds_direct_load<4>(x + t, tile + warp_id() * kWarpSize);
  wait_vmcnt<0>();
  sync_threads();
  out[t] = tile[255 - t];
}
"""


def test_lds_direct_load_is_global_load_lds_dword_on_gfx942():
    co = toolchain.compile_hip(LDS_DIRECT, "gfx942")
    asm = co.assembly
    ops = _opcodes(asm)
    # The data goes to LDS, not to a VGPR: no ds_write, and the load is the LDS form, its
    # wave-uniform LDS base in M0 (set before the load), waited for with vmcnt(0) before the
    # barrier and the LDS read.
    assert "global_load_lds_dword" in ops and "ds_write_b32" not in ops
    m0 = asm.index("s_mov_b32 m0,")
    load = asm.index("global_load_lds_dword")
    wait = asm.index("s_waitcnt vmcnt(0)", load)
    assert m0 < load < wait < asm.index("s_barrier", load) < asm.index("ds_read_b32", load)


LDS_DIRECT_BUFFER = """#include <jaxtile/device.h>
using namespace jaxtile;
JT_KERNEL JT_LAUNCH_BOUNDS(256) void fill(ptr<const float> x, ptr<float> out, int n) {
  JT_SHARED(float, tile, 256);
  const unsigned t = thread_idx().x;
  lds_direct_buffer_load<4>(buffer_resource(x, n * 4), t * 4, tile + warp_id() * kWarpSize);
  wait_vmcnt<0>();
  sync_threads();
  out[t] = tile[255 - t];
}
"""


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
def test_lds_direct_buffer_load_is_buffer_load_dword_lds(arch):
    asm = toolchain.compile_hip(LDS_DIRECT_BUFFER, arch).assembly
    # the buffer form with the lds bit, its LDS base in M0, waited for before the barrier
    load = next(ln for ln in asm.splitlines() if "buffer_load_dword" in ln)
    assert load.split()[-1] == "lds" and "offen" in load, load
    at = asm.index(load)
    assert asm.index("s_mov_b32 m0,") < at < asm.index("s_waitcnt vmcnt(0)", at) < asm.index(
        "s_barrier", at) < asm.index("ds_read_b32", at)
    assert "ds_write_b32" not in _opcodes(asm)


def test_lds_direct_load_is_a_clear_compile_error_on_gfx90a():
    with pytest.raises(ToolchainError,
                       match="lds_direct_load needs global_load_lds_dword .*gfx90a"):
        toolchain.compile_hip(LDS_DIRECT, "gfx90a")
