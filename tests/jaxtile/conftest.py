"""The tile-language tests run on every backend: the CPU, CUDA in the SIMT emulator (as
Pallas reruns its tests in interpret mode, id ``emu``) and HIP for gfx942 in the emulator's
wave64 mode (id ``hip``). Each ``test_language_*`` test is parametrised over
``kernel_backend``; the emulator runs are marked slow (a g++ build per kernel).

Where the GPU's semantics knowingly differ from XLA:CPU's, or a feature is not lowered for
the target yet, the emulator run is a strict xfail that names the reason, so that a fix shows.
"""

import re

import jax
import pytest

import jaxtile as jt

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
            pytest.param("hip-emulator", marks=pytest.mark.slow, id="hip")],
            indirect=True)


@pytest.fixture(autouse=True)
def kernel_backend(request):
    """The backend kernels of the test compile for."""
    name = getattr(request, "param", "cpu")
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
