"""The tile-language tests run on every backend: the CPU, CUDA in the SIMT emulator (as
Pallas reruns its tests in interpret mode, id ``emu``) and HIP for gfx942 in the emulator's
wave64 mode (id ``hip``). Each ``test_language_*`` test is parametrised over
``kernel_backend``; the emulator runs are marked slow (a g++ build per kernel).

The id ``hipcc`` (slow too) is the AMD compile sweep: the test runs on the CPU while every
kernel it builds is recorded, and afterwards each is compiled by clang for gfx90a and for
gfx942 (no emulator) and its resource figures read back from the assembly.

Where the GPU's semantics knowingly differ from XLA:CPU's, or a feature is not lowered for
the target yet, the emulator run is a strict xfail that names the reason, so that a fix shows.
"""

import re

import jax
import pytest
from described_cpu import describe_host

import jaxtile as jt
from jaxtile.compiler import build, ir, target
from jaxtile.compiler.hip import toolchain as hip_toolchain
from jaxtile.compiler.target import parse_target

_LANGUAGE = re.compile(r"test_language_")
_SUBNORMALS = "the GPU keeps float32 subnormals that XLA:CPU flushes to zero"
_TF32 = "float32 gemms use tf32 tensor cores on CUDA (as jnp.dot's default precision does)"
_XF32 = "float32 gemms use xf32 MFMA on gfx942 (10-bit mantissas, as CUDA's tf32)"
_HIP_PRINT = "jt.print is a KernelError on HIP (AMD's printf needs the ROCm device library)"
_GPU_DIFFERS = {
    r"test_language_math\.py::test_binary_float\[(emu|hip)-(f32|bf16)\]": _SUBNORMALS,
    r"test_language_casts\.py::test_cast_float_to_bool\[(emu|hip)-f32\]": _SUBNORMALS,
    r"test_language_gemm_control\.py::test_gemm_transposes_f32\[emu-": _TF32,
    r"test_language_gemm_control\.py::test_multiple_gemms_accumulate_in_a_loop\[emu-f32\]":
        _TF32,
    r"test_language_atomics\.py::test_split_k_gemm\[emu-": _TF32,
    r"test_language_atomics\.py::test_split_k_gemm\[hip-": _XF32,
    r"test_language_attention\.py::test_flash_attention_forward\[emu-f32-": _TF32,
    r"test_language_attention\.py::test_flash_attention_forward\[hip-f32-": _XF32,
    r"test_language_print\.py::test_(a_compiled|integer_unsigned|a_grid_of|prints_inside"
    r"|nested_vmaps)\w*\[hip\]": _HIP_PRINT,
}
"""Emulator runs (regular expressions matched at the start of test ids) expected to fail,
and why."""


def pytest_generate_tests(metafunc):
    if "kernel_backend" in metafunc.fixturenames and _LANGUAGE.match(metafunc.module.__name__):
        metafunc.parametrize("kernel_backend", [
            "cpu", pytest.param("cuda-emulator", marks=pytest.mark.slow, id="emu"),
            pytest.param("hip-emulator", marks=pytest.mark.slow, id="hip"),
            pytest.param("hip-compile", marks=[pytest.mark.slow, _NEEDS_CLANG], id="hipcc")],
            indirect=True)


_NEEDS_CLANG = pytest.mark.skipif(hip_toolchain.clang_path() is None,
                                  reason=f"no clang for AMD GPUs: {hip_toolchain.INSTALL_HINT}")
_SWEPT: set[str] = set()
"""Content keys of the kernels the ``hipcc`` runs compiled already (tests share some)."""


def _compile_for_amd(kernels) -> None:
    """Compile each (target-neutral) kernel for gfx90a and gfx942 with clang and check that
    its resource figures were read: registers, waves per SIMD (jaxtile's, and LLVM's own
    figure, which must agree), LDS within the target's. A kernel using ``jt.print`` must be
    refused, naming it (AMD's printf needs the device library)."""
    from jaxtile.compiler.gpu.codegen.lower import generate
    from jaxtile.compiler.hip import lower as hip_lower

    for kernel in kernels:
        for gfx in hip_toolchain.ARCHS:
            target = parse_target(f"hip:{gfx}")
            key = build.kernel_key(kernel, target)
            if key in _SWEPT:
                continue
            lowered = build.lowered_ir(kernel, target)
            if any(isinstance(s, ir.Op) and s.kind == "print" for s in ir.walk(lowered.body)):
                with pytest.raises(jt.KernelError, match="jt.print is not supported"):
                    hip_lower.source(lowered, target)
                _SWEPT.add(key)
                continue
            code = generate(lowered, target)
            co = hip_toolchain.compile_hip(code.source, gfx, file=f"{code.symbol}.hip")
            r = co.kernels[code.symbol]
            what = f"{kernel.name} on {gfx}: {r}"
            assert r.wave_size == 64 and r.vgprs > 0 and r.sgprs > 0, what
            assert r.max_workgroup_size == code.threads, what
            assert r.llvm_occupancy is not None, what
            assert r.waves_per_simd(target.caps) == r.llvm_occupancy >= 1, what
            assert code.shared_bytes + r.lds_bytes <= target.caps.lds_bytes, what
            _SWEPT.add(key)


@pytest.fixture(autouse=True)
def kernel_backend(request):
    """The backend kernels of the test compile for."""
    name = getattr(request, "param", "cpu")
    if name == "hip-compile":
        yield from _sweep()
        return
    if name != "cpu":
        node = request.node.nodeid.split("/")[-1]
        for pattern, reason in _GPU_DIFFERS.items():
            if re.match(pattern, node):
                request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    before = jt.backend()
    # jax.jit's caches do not know the backend: without clearing them around a run on
    # another backend, a kernel jitted on one would run its executable from the other.
    if name != "cpu":
        jax.clear_caches()
    jt.set_backend(name)
    yield name
    jt.set_backend(before)
    if name != "cpu":
        jax.clear_caches()


def _sweep():
    """The ``hipcc`` run: the test on the CPU, recording the kernels it builds, which are
    then compiled for AMD (:func:`_compile_for_amd`)."""
    built = []
    mp = pytest.MonkeyPatch()
    for fn in ("build", "submit"):
        real = getattr(build, fn)

        def spy(kernel, target, *args, _real=real, **kwargs):
            built.append(kernel)
            return _real(kernel, target, *args, **kwargs)

        mp.setattr(build, fn, spy)
    try:
        yield "cpu"
    finally:
        mp.undo()
    build.wait_idle()
    _compile_for_amd(built)


@pytest.fixture(params=["amx_emulated", "dot"])
def relaying(request, monkeypatch):
    """A bfloat16 gemm path that re-lays its operands first: AMX's tiles, emulated (any
    machine; ``tests/compiler/cpu/test_gemm_amx.py`` runs them natively too), or
    ``vdpbf16ps`` (this machine described without AMX, where it has AVX512-BF16, and as an
    AMD CPU: an Intel one widens for FMAs instead, ``CpuCaps.bf16_dot``)."""
    if request.param == "dot":
        if "avx512_bf16" not in target._cpuinfo().get("flags", "").split():
            pytest.skip("the host CPU has no AVX512-BF16 (vdpbf16ps)")
        describe_host(monkeypatch, remove=target.AMX_FLAGS, vendor="AuthenticAMD")
    else:
        describe_host(monkeypatch, add={"amx_bf16", "amx_tile", "avx512f", "avx512_bf16"})
        monkeypatch.setattr(target, "AMX_EMULATION", True)
    caps = parse_target("cpu").caps
    assert caps.bf16_dot and caps.amx_bf16 == (request.param == "amx_emulated")
    return request.param
