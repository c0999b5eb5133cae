"""Lowering for ROCm on a machine without an AMD GPU: the call carries its code object.

``jax.export(..., platforms=["rocm"])`` compiles the kernel with clang for the gfx target and
puts the code object, with its launch, into the ``jaxtile_rocm_call``'s payload, which the
ROCm handler's own decoder (``_ffi.decode_hip_payload``) reads back here: the artifact needs
no compiler where it runs."""

import re
import struct

import jax
import jax.numpy as jnp
import pytest

import jaxtile as jt
from jaxtile import _ffi
from jaxtile.compiler import cache
from jaxtile.compiler.gpu.launch import Launch
from jaxtile.compiler.hip import toolchain
from jaxtile.compiler.target import for_platform
from jaxtile.primitives import payload
from jaxtile.primitives.lowering import ROCM_TARGET_NAME

needs_clang = pytest.mark.skipif(toolchain.clang_path() is None,
                                 reason=f"no clang for AMD GPUs: {toolchain.INSTALL_HINT}")

EM_AMDGPU = 224
# e_flags' EF_AMDGPU_MACH field (LLVM's AMDGPUUsage "AMDGPU ELF Header"): the gfx it is for.
MACH = {"gfx90a": 0x3F, "gfx942": 0x4C}


def _kernel(**options):
    # A fresh kernel per test: specialisations keep their compiled entries.
    @jt.kernel(threads=128, **options)
    def exp_add(x, y, *, block=256):
        (n,) = x.shape
        out = jt.empty((n,), x.dtype)
        i = jt.grid(jt.cdiv(n, block))
        t = jt.fragment((block,), x.dtype)
        u = jt.fragment((block,), y.dtype)
        jt.copy(x.at[i * block], t)
        jt.copy(y.at[i * block], u)
        t[...] = jnp.exp(t[...]) + u[...]
        jt.copy(t, out.at[i * block])
        return out
    return exp_add


def _calls(mlir_text: str) -> list[tuple[str, str]]:
    """(key, payload) of the module's ROCm kernel calls, MLIR escapes undone."""
    found = []
    for line in mlir_text.splitlines():
        if ROCM_TARGET_NAME not in line:
            continue
        key = re.search(r'key = "([0-9a-f]+)"', line).group(1)
        text = re.search(r'payload = "((?:[^"\\]|\\.)*)"', line).group(1)
        found.append((key, re.sub(r"\\([0-9A-Fa-f]{2})",
                                  lambda m: chr(int(m.group(1), 16)), text)))
    return found


def test_the_target_is_the_devices_gfx_name():
    # JAX's ROCm devices name the ISA with its features.
    assert for_platform("rocm", "gfx942:sramecc+:xnack-").name == "hip:gfx942"
    assert for_platform("rocm", "gfx90a").name == "hip:gfx90a"
    with pytest.raises(jt.KernelError, match="unknown target 'hip:gfx1100'"):
        for_platform("rocm", "gfx1100")


@needs_clang
def test_export_for_rocm_carries_the_code_object(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    cache.clear_memory()
    spec = jax.ShapeDtypeStruct((1000,), jnp.float32)
    exported = jax.export.export(jax.jit(_kernel()), platforms=["rocm"],
                                 disabled_checks=jt.export_checks())(spec, spec)
    restored = jax.export.deserialize(exported.serialize())
    assert restored.platforms == ("rocm",)
    ((key, text),) = _calls(restored.mlir_module())
    fields = _ffi.decode_hip_payload(key, text)  # the handler's decoder: checksum, key
    # Without a device the lowering compiles for gfx90a.
    assert fields["arch"] == "gfx90a" and fields["symbol"] == "jt_exp_add"
    assert fields["name"] == "exp_add"
    code = fields["code_object"]
    assert code[:4] == b"\x7fELF"
    (machine,) = struct.unpack_from("<H", code, 18)
    (flags,) = struct.unpack_from("<I", code, 48)
    assert machine == EM_AMDGPU and flags & 0xFF == MACH["gfx90a"]
    assert b"jt_exp_add.kd" in code  # the kernel descriptor hipModuleGetFunction finds
    launch = Launch.decode(fields["launch"])
    # ceil(1000 / 256) workgroups of 128 threads; x, y, then the result.
    assert launch.grid == (4, 1, 1) and launch.block == (128, 1, 1)
    assert launch.params == ("b0", "b1", "b2")
    # What the cache holds is what the payload carries.
    entry, _ = cache.find(key)
    assert entry is not None and entry.kind == cache.HIP_CODE_OBJECT
    with open(entry.library, "rb") as f:
        assert f.read() == code
    cache.clear_memory()


@needs_clang
def test_a_dynamic_size_goes_into_the_launch(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    cache.clear_memory()
    kernel = _kernel(dynamic={"x": (0,), "y": (0,)})
    launches = []
    for n in (1000, 300):
        spec = jax.ShapeDtypeStruct((n,), jnp.float32)
        exported = jax.export.export(jax.jit(kernel), platforms=["rocm"],
                                     disabled_checks=jt.export_checks())(spec, spec)
        ((key, text),) = _calls(exported.mlir_module())
        launches.append((key, _ffi.decode_hip_payload(key, text)["launch"]))
    # One code object for every size: the grid and a size parameter come from the shapes.
    assert launches[0] == launches[1]
    launch = Launch.decode(launches[0][1])
    assert "dim0_0" in str(launch.grid[0]) and "dim0_0" in launch.params
    # The grid the handler computes (the launch parser is shared with CUDA's).
    for n, blocks in ((1000, 4), (300, 2)):
        geometry = _ffi.cuda_launch_geometry(launch.encode(), [[n], [n], [n]])
        assert geometry["grid"] == (blocks, 1, 1)
    cache.clear_memory()


def test_an_unknown_platform_names_rocm_among_the_supported_ones():
    # jaxtile compiles for cpu, cuda and rocm; tpu is an error naming them.
    spec = jax.ShapeDtypeStruct((1000,), jnp.float32)
    with pytest.raises(jt.KernelError, match=r"CPU, CUDA and ROCm.*\['rocm'\]"):
        jax.export.export(jax.jit(_kernel()), platforms=["tpu"],
                          disabled_checks=jt.export_checks())(spec, spec)


def test_without_clang_lowering_for_rocm_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(toolchain, "clang_path", lambda: None)
    cache.clear_memory()
    spec = jax.ShapeDtypeStruct((1000,), jnp.float32)
    with pytest.raises(jt.KernelError, match=r"'exp_add'.*no clang for AMD GPUs.*clang-19"):
        jax.export.export(jax.jit(_kernel()), platforms=["rocm"],
                          disabled_checks=jt.export_checks())(spec, spec)
    cache.clear_memory()


def test_the_rocm_decoder_refuses_another_platforms_payload():
    key = "ab" * 32
    cuda = payload.pack_cuda(key=key, name="k", symbol="k", arch="sm_80",
                             launch="grid=1,1,1;block=64,1,1;smem=0;params=b0", cubin=b"x")
    with pytest.raises(RuntimeError, match="'k'.*not a ROCm kernel's payload"):
        _ffi.decode_hip_payload(key, cuda)
    hip = payload.pack_hip(key=key, name="k", symbol="k", arch="gfx942",
                           launch="grid=1,1,1;block=64,1,1;smem=0;params=b0", code_object=b"x")
    with pytest.raises(RuntimeError, match="not a CUDA kernel's payload"):
        _ffi.decode_cuda_payload(key, hip)
    fields, artifact = payload.unpack(hip)
    assert fields["platform"] == "rocm" and fields["arch"] == "gfx942" and artifact == b"x"
