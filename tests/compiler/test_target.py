"""Targets as capabilities (compiler/target.py)."""

import dataclasses

import pytest

from jaxtile.compiler import target
from jaxtile.compiler.errors import KernelError


def _with_cpuinfo(monkeypatch, **fields):
    monkeypatch.setattr(target, "_cpuinfo", lambda: fields)


@pytest.mark.parametrize("flags,bits", [("fpu sse2 avx avx2 fma", 256),
                                        ("sse2 avx2 avx512f avx512bw", 512),
                                        ("fp asimd", 128), ("", 128)])
def test_vector_width_from_cpu_flags(monkeypatch, flags, bits):
    _with_cpuinfo(monkeypatch, flags=flags)
    assert target.parse_target("cpu").caps.vector_bits == bits


def test_isa_keeps_only_code_relevant_flags(monkeypatch):
    _with_cpuinfo(monkeypatch, flags="fpu hypervisor sse2 avx2 fma tsc")
    assert target.host_isa() == ("avx2", "fma", "sse2")
    _with_cpuinfo(monkeypatch, Features="fp asimd evtstrm atomics")
    assert target.host_isa() == ("asimd", "atomics", "fp")


def test_cpu_description_changes_with_what_drives_code_generation(monkeypatch):
    # A kernel compiled for one register width, ISA or CPU model must not be loaded for
    # another: each is part of the description that the content key hashes.
    base = dict(flags="sse2 avx2 fma", vendor_id="GenuineIntel", model="85")
    _with_cpuinfo(monkeypatch, **base)
    first = target.parse_target("cpu").describe()
    for change in (dict(flags="sse2 avx2 fma avx512f"), dict(model="143")):
        _with_cpuinfo(monkeypatch, **{**base, **change})
        assert target.parse_target("cpu").describe() != first
    _with_cpuinfo(monkeypatch, **{**base, "flags": "sse2 avx2 fma hypervisor"})
    assert target.parse_target("cpu").describe() == first


def test_cpu_description_names_the_toolchain():
    assert "apache-tvm" in target.parse_target("cpu").describe()


@pytest.mark.parametrize("name,sm,wgmma", [("cuda:sm_80", 80, False),
                                            ("cuda:sm_90", 90, True),
                                            ("cuda:sm_90a", 90, True)])
def test_cuda_targets(name, sm, wgmma):
    t = target.parse_target(name)
    assert t.kind == "cuda" and t.caps.sm == sm and t.caps.warp_size == 32
    assert t.caps.wgmma == wgmma and t.caps.async_copy and t.caps.ldmatrix
    assert ("m16n8k16", "f16") in t.caps.mma_shapes
    assert t.caps.static_smem_bytes == 48 * 1024 < t.caps.max_smem_bytes


def test_hip_target():
    t = target.parse_target("hip:gfx90a")
    assert t.kind == "hip" and t.caps.wavefront == 64 and t.caps.lds_bytes == 65536
    assert t.caps.mfma_shapes


def test_descriptions_differ_between_targets():
    names = ["cpu", "cuda:sm_80", "cuda:sm_90", "hip:gfx90a"]
    assert len({target.parse_target(n).describe() for n in names}) == len(names)


def test_capabilities_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        target.parse_target("cuda:sm_80").caps.sm = 75


@pytest.mark.parametrize("name", ["tpu", "cuda", "cuda:sm_7", "cuda:sm_75", "hip:gfx000",
                                  "CPU"])
def test_unknown_target_is_a_clear_error(name):
    with pytest.raises(KernelError, match="unknown target.*known targets: cpu, cuda:sm_80"):
        target.parse_target(name)


@pytest.mark.parametrize("platform,cc,name", [("cpu", None, "cpu"),
                                               ("cuda", "8.0", "cuda:sm_80"),
                                               ("cuda", "9.0", "cuda:sm_90"),
                                               ("rocm", "gfx942", "hip:gfx942")])
def test_target_for_a_jax_platform(platform, cc, name):
    assert target.for_platform(platform, cc).name == name
