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


def test_isa_level_description_is_the_same_on_every_model(monkeypatch):
    # Code for an ISA level is compiled for the level's generic CPU, so its key must not
    # name the host's model (prebuilt code is found on every machine of the level), while
    # the host's own target keeps it.
    descriptions = set()
    for model in ("85", "143"):
        _with_cpuinfo(monkeypatch, flags="sse2 avx2 fma", vendor_id="GenuineIntel",
                      model=model)
        descriptions.add(target.parse_target("cpu:x86-64-v3").describe())
    assert len(descriptions) == 1
    assert target.parse_target("cpu:x86-64-v3").describe() != \
        target.parse_target("cpu:x86-64-v4").describe()


def test_cpu_description_names_the_toolchain():
    assert "apache-tvm" in target.parse_target("cpu").describe()


KIB = 1024
# (name, compute capability x 10, arch-specific, max shared memory per block): the limits of
# the CUDA programming guide's table of compute capabilities.
CUDA_TARGETS = [("cuda:sm_80", 80, False, 163 * KIB), ("cuda:sm_86", 86, False, 99 * KIB),
                ("cuda:sm_87", 87, False, 163 * KIB), ("cuda:sm_89", 89, False, 99 * KIB),
                ("cuda:sm_90", 90, False, 227 * KIB), ("cuda:sm_90a", 90, True, 227 * KIB),
                ("cuda:sm_100", 100, False, 227 * KIB), ("cuda:sm_100a", 100, True, 227 * KIB),
                ("cuda:sm_103", 103, False, 227 * KIB), ("cuda:sm_120", 120, False, 99 * KIB),
                ("cuda:sm_121", 121, False, 99 * KIB)]


@pytest.mark.parametrize("name,sm,specific,smem", CUDA_TARGETS)
def test_cuda_targets(name, sm, specific, smem):
    t = target.parse_target(name)
    assert t.name == name and t.kind == "cuda" and t.caps.sm == sm and t.caps.warp_size == 32
    assert t.caps.arch_specific == specific and t.caps.async_copy and t.caps.ldmatrix
    assert ("m16n8k16", "f16") in t.caps.mma_shapes
    assert t.caps.static_smem_bytes == 48 * 1024 < t.caps.max_smem_bytes == smem
    assert t.caps.tma == (sm >= 90)
    assert not target.missing_for_lowering(t.caps)


def test_the_arch_specific_targets_are_their_own():
    # sm_90a has wgmma, sm_90 not (Blackwell has neither: tcgen05 on sm_100a); each name is
    # its own content key.
    plain, specific = target.parse_target("cuda:sm_90"), target.parse_target("cuda:sm_90a")
    assert (plain.caps.wgmma, specific.caps.wgmma) == (False, True)
    assert plain.describe() != specific.describe()
    b, ba = target.parse_target("cuda:sm_100"), target.parse_target("cuda:sm_100a")
    assert not b.caps.wgmma and not ba.caps.wgmma and (b.caps.tcgen05, ba.caps.tcgen05) == (
        False, True)
    assert len({target.parse_target(n).describe() for n, *_ in CUDA_TARGETS}) == len(
        CUDA_TARGETS)


def test_turing_is_a_clear_error_naming_what_it_lacks():
    with pytest.raises(KernelError) as info:
        target.parse_target("cuda:sm_75")
    msg = str(info.value)
    for words in ("cuda:sm_75 lacks", "cp.async", "m16n8k16 on bf16", "m16n8k8 on tf32",
                  "sm_80, sm_86", "on the CPU"):
        assert words in msg, (words, msg)
    assert "sm_75," not in msg.split("compiled for")[1]


@pytest.mark.parametrize("cc,name", [("8.0", "cuda:sm_80"), ("8.6", "cuda:sm_86"),
                                     ("8.7", "cuda:sm_87"), ("9.0", "cuda:sm_90"),
                                     ("10.0", "cuda:sm_100"), ("10.3", "cuda:sm_103"),
                                     ("12.1", "cuda:sm_121"),
                                     # Newer than every known GPU, or between known ones: the
                                     # highest plain target below, whose PTX the driver
                                     # compiles for it (never sm_100a's, which runs on
                                     # sm_100 only).
                                     ("11.0", "cuda:sm_103"), ("13.0", "cuda:sm_121"),
                                     ("10.1", "cuda:sm_100"), ("8.8", "cuda:sm_87")])
def test_the_target_of_a_gpu(cc, name):
    assert target.for_platform("cuda", cc).name == name


@pytest.mark.parametrize("cc,name", [("9.0", "cuda:sm_90a"), ("10.0", "cuda:sm_100a"),
                                     # No architecture-specific target of exactly these:
                                     # the plain rule.
                                     ("8.0", "cuda:sm_80"), ("10.3", "cuda:sm_103"),
                                     ("11.0", "cuda:sm_103"), ("9.1", "cuda:sm_90")])
def test_a_present_gpu_gets_its_architecture_specific_target(cc, name):
    # Code lowered for the GPU at hand runs on it alone; an export keeps the plain target.
    assert target.for_platform("cuda", cc, present=True).name == name
    plain = target.for_platform("cuda", cc)
    assert not plain.name.endswith("a")
    if cc == "9.0":
        caps = target.for_platform("cuda", cc, present=True).caps
        assert caps.wgmma and caps.setmaxnreg and not plain.caps.wgmma


def test_without_a_compute_capability_there_is_no_device_to_be_specific_to():
    assert target.for_platform("cuda", None, present=True).name == "cuda:sm_80"


def test_gpus_older_than_the_lowering_are_clear_errors():
    with pytest.raises(KernelError, match="cuda:sm_75 lacks .*cp.async"):
        target.for_platform("cuda", "7.5")
    with pytest.raises(KernelError, match="compute capability 7.0 is older than every CUDA "
                                          "target jaxtile knows"):
        target.for_platform("cuda", "7.0")


def test_hip_target():
    t = target.parse_target("hip:gfx90a")
    assert t.kind == "hip" and t.caps.warp_size == 64 and t.caps.lds_bytes == 65536
    assert t.caps.mfma


def test_gpu_targets_answer_what_the_gpu_tier_asks():
    """compiler/gpu/ reads a GPU's caps through GpuCaps, whatever its vendor."""
    sm80, sm90a, gfx = (target.parse_target(n).caps
                        for n in ("cuda:sm_80", "cuda:sm_90a", "hip:gfx90a"))
    assert all(isinstance(c, target.GpuCaps) for c in (sm80, sm90a, gfx))
    assert not isinstance(target.parse_target("cpu").caps, target.GpuCaps)
    assert (sm80.arch, sm90a.arch, gfx.arch) == ("sm_80", "sm_90a", "gfx90a")
    assert (sm80.warp_size, gfx.warp_size) == (32, 64)
    assert (sm80.static_smem_bytes, sm80.max_smem_bytes) == (48 * KIB, 163 * KIB)
    assert gfx.static_smem_bytes == gfx.max_smem_bytes == 64 * KIB
    assert gfx.max_threads_per_block == 1024
    assert gfx.mma_shapes == tuple((f"{s.m}x{s.n}x{s.k}", s.operand) for s in gfx.mfma)
    assert ("16x16x16", "f16") in gfx.mma_shapes
    # The derived answers are properties, not fields: the content key holds each fact once.
    assert "mma_shapes" not in target.parse_target("hip:gfx90a").describe()


def test_cuda_targets_carry_the_registered_toolchain(monkeypatch):
    """target.py asks the CUDA toolchain's identity through TOOLCHAINS (filled by
    jaxtile.compiler's __init__ from cuda/fingerprint.py, imported on the first call),
    importing no backend itself."""
    from jaxtile.compiler.cuda import fingerprint

    assert target.TOOLCHAINS["cuda"]() == fingerprint.toolchain_fingerprint()
    monkeypatch.setitem(target.TOOLCHAINS, "cuda", lambda: "nvrtc 99.9; device.h 0")
    assert target.parse_target("cuda:sm_80").toolchain == "nvrtc 99.9; device.h 0"

def test_descriptions_differ_between_targets():
    names = ["cpu", "cuda:sm_80", "cuda:sm_90", "hip:gfx90a"]
    assert len({target.parse_target(n).describe() for n in names}) == len(names)


def test_capabilities_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        target.parse_target("cuda:sm_80").caps.sm = 75


@pytest.mark.parametrize("name", ["tpu", "cuda", "cuda:sm_7", "cuda:sm_70", "cuda:sm_80a",
                                  "cuda:sm_110", "hip:gfx000", "CPU"])
def test_unknown_target_is_a_clear_error(name):
    with pytest.raises(KernelError,
                       match="unknown target.*known targets: cpu, cpu:x86-64-v3, cpu:x86-64-v4, "
                       "cpu:sapphirerapids, "
                       "cuda:sm_75, cuda:sm_80"):
        target.parse_target(name)


@pytest.mark.parametrize("platform,cc,name", [("cpu", None, "cpu"),
                                               ("cuda", "8.0", "cuda:sm_80"),
                                               ("cuda", "9.0", "cuda:sm_90"),
                                               ("cuda", None, "cuda:sm_80"),
                                               ("rocm", "gfx942", "hip:gfx942")])
def test_target_for_a_jax_platform(platform, cc, name):
    assert target.for_platform(platform, cc).name == name
