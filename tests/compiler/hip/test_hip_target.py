"""The AMD targets' capabilities (compiler/target.py's HipCaps) and toolchain identity."""

import pytest

from jaxtile.compiler import target
from jaxtile.compiler.hip import toolchain


def _instructions(gfx):
    return {(s.m, s.n, s.k, s.operand): s.instruction
            for s in target.parse_target(f"hip:{gfx}").caps.mfma}


def test_cdna2_matrix_instructions():
    assert _instructions("gfx90a") == {
        (32, 32, 8, "f16"): "v_mfma_f32_32x32x8f16",
        (16, 16, 16, "f16"): "v_mfma_f32_16x16x16f16",
        (32, 32, 8, "bf16"): "v_mfma_f32_32x32x8bf16_1k",
        (16, 16, 16, "bf16"): "v_mfma_f32_16x16x16bf16_1k"}


def test_cdna3_adds_xf32_and_float8():
    cdna3 = _instructions("gfx942")
    assert cdna3[32, 32, 8, "bf16"] == "v_mfma_f32_32x32x8_bf16"
    assert cdna3[16, 16, 8, "xf32"] == "v_mfma_f32_16x16x8_xf32"
    assert cdna3[32, 32, 4, "xf32"] == "v_mfma_f32_32x32x4_xf32"
    assert cdna3[16, 16, 32, "fp8"] == "v_mfma_f32_16x16x32_fp8_fp8"
    assert {k[:3] for k in cdna3} >= {k[:3] for k in _instructions("gfx90a")}
    assert not any(op == "xf32" for *_, op in _instructions("gfx90a"))


@pytest.mark.parametrize("gfx", ["gfx90a", "gfx942"])
def test_wave64_registers_and_lds(gfx):
    caps = target.parse_target(f"hip:{gfx}").caps
    assert (caps.warp_size, caps.lds_bytes, caps.lds_banks, caps.lds_bank_bytes) == \
        (64, 65536, 32, 4)
    assert caps.vgprs == caps.arch_vgprs + caps.agprs == 512
    assert caps.max_waves_per_simd == 8 and caps.buffer_loads_zero_out_of_range


def test_toolchain_identity_is_the_compilers_version(monkeypatch):
    t = target.parse_target("hip:gfx942")
    assert t.toolchain == toolchain.identity() and t.toolchain != "rocm"
    assert t.toolchain.endswith(f"; device header {toolchain.header_digest()}")
    if toolchain.clang_path() is not None:
        assert "clang version" in t.toolchain
    # A different compiler is a different content key.
    monkeypatch.setitem(target.TOOLCHAINS, "hip", lambda: "clang version 99.0.0")
    assert target.parse_target("hip:gfx942").describe() != t.describe()
