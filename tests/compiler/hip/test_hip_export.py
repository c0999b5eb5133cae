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


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One build cache for the module's exports: each compiles the same kernel."""
    return tmp_path_factory.mktemp("hip_export_cache")


@pytest.fixture
def rocm_cache(shared_cache, monkeypatch):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(shared_cache))
    monkeypatch.delenv("JAXTILE_ROCM_ARCHS", raising=False)
    cache.clear_memory()
    yield shared_cache
    cache.clear_memory()


def _check_code_object(code: bytes, arch: str) -> None:
    """``code`` is an AMDGPU ELF for ``arch`` holding the kernel's descriptor."""
    assert code[:4] == b"\x7fELF"
    (machine,) = struct.unpack_from("<H", code, 18)
    (flags,) = struct.unpack_from("<I", code, 48)
    assert machine == EM_AMDGPU and flags & 0xFF == MACH[arch], (arch, hex(flags))
    assert b"jt_exp_add.kd" in code  # the kernel descriptor hipModuleGetFunction finds


def _cached(kernel, arch: str, *specs) -> tuple[str, bytes]:
    """The content key and code object the build cache holds for ``kernel`` on ``arch``."""
    key = kernel.lower(*specs, target=f"hip:{arch}").key
    entry, _ = cache.find(key)
    assert entry is not None and entry.kind == cache.HIP_CODE_OBJECT
    with open(entry.library, "rb") as f:
        return key, f.read()


@needs_clang
def test_an_export_for_rocm_carries_a_code_object_per_architecture(rocm_cache):
    spec = jax.ShapeDtypeStruct((1000,), jnp.float32)
    kernel = _kernel()
    exported = jax.export.export(jax.jit(kernel), platforms=["rocm"],
                                 disabled_checks=jt.export_checks())(spec, spec)
    restored = jax.export.deserialize(exported.serialize())
    assert restored.platforms == ("rocm",)
    ((key, text),) = _calls(restored.mlir_module())
    fields = _ffi.decode_hip_payload(key, text)  # the handler's decoder: checksum, key
    assert fields["format"] == payload.HIP_FORMAT == _ffi.HIP_PAYLOAD_FORMAT == 2
    assert fields["name"] == "exp_add"
    # Without a device to ask, every supported architecture: the handler picks its GPU's.
    code = fields["code_objects"]
    assert [c["arch"] for c in code] == ["gfx90a", "gfx942"]
    keys = []
    for c in code:
        _check_code_object(c["code_object"], c["arch"])
        assert c["symbol"] == "jt_exp_add"
        launch = Launch.decode(c["launch"])
        # ceil(1000 / 256) workgroups of 128 threads; x, y, then the result.
        assert launch.grid == (4, 1, 1) and launch.block == (128, 1, 1)
        assert launch.params == ("b0", "b1", "b2")
        # What the cache holds for that architecture is what the payload carries.
        arch_key, cached = _cached(kernel, c["arch"], spec, spec)
        assert cached == c["code_object"]
        keys.append(arch_key)
    # Two different code objects, and a call key of its own naming both.
    assert code[0]["code_object"] != code[1]["code_object"]
    assert key not in keys and len(key) == 64


@needs_clang
def test_rocm_archs_chooses_the_architectures_of_an_export(rocm_cache, monkeypatch):
    monkeypatch.setenv("JAXTILE_ROCM_ARCHS", "GFX942:sramecc+:xnack-")
    spec = jax.ShapeDtypeStruct((1000,), jnp.float32)
    kernel = _kernel()
    exported = jax.export.export(jax.jit(kernel), platforms=["rocm"],
                                 disabled_checks=jt.export_checks())(spec, spec)
    ((key, text),) = _calls(exported.mlir_module())
    (code,) = _ffi.decode_hip_payload(key, text)["code_objects"]
    assert code["arch"] == "gfx942"
    _check_code_object(code["code_object"], "gfx942")
    # One code object: the call's key is its content key.
    assert (key, code["code_object"]) == _cached(kernel, "gfx942", spec, spec)


def test_rocm_archs_refuses_what_jaxtile_does_not_support(monkeypatch):
    from jaxtile import _config

    monkeypatch.setenv("JAXTILE_ROCM_ARCHS", "gfx942,gfx1100")
    with pytest.warns(_config.ConfigWarning, match="JAXTILE_ROCM_ARCHS.*gfx90a, gfx942"):
        assert _config.get("JAXTILE_ROCM_ARCHS") is None  # the default: every one
    monkeypatch.setenv("JAXTILE_ROCM_ARCHS", " gfx942 , gfx90a,gfx942")
    assert _config.get("JAXTILE_ROCM_ARCHS") == ("gfx942", "gfx90a")


@needs_clang
@pytest.mark.parametrize("device,arch", [("gfx942:sramecc+:xnack-", "gfx942"),
                                         ("gfx90a:sramecc-:xnack+", "gfx90a")])
def test_a_lowering_for_a_present_device_compiles_its_architecture_alone(
        rocm_cache, monkeypatch, device, arch):
    from jaxtile.primitives import lowering

    monkeypatch.setattr(lowering.ji, "compute_capability", lambda ctx: device)
    spec = jax.ShapeDtypeStruct((1000,), jnp.float32)
    kernel = _kernel()
    lowered = jax.jit(kernel).trace(spec, spec).lower(lowering_platforms=("rocm",))
    ((key, text),) = _calls(lowered.as_text())
    (code,) = _ffi.decode_hip_payload(key, text)["code_objects"]
    assert code["arch"] == arch
    assert (key, code["code_object"]) == _cached(kernel, arch, spec, spec)
    # An export made where that device is present still carries every architecture.
    exported = jax.export.export(jax.jit(kernel), platforms=["rocm"],
                                 disabled_checks=jt.export_checks())(spec, spec)
    ((key, text),) = _calls(exported.mlir_module())
    archs = [c["arch"] for c in _ffi.decode_hip_payload(key, text)["code_objects"]]
    assert archs == ["gfx90a", "gfx942"]


def test_a_device_of_an_unsupported_architecture_is_a_kernel_error(monkeypatch):
    from jaxtile.primitives import lowering

    monkeypatch.setattr(lowering.ji, "compute_capability", lambda ctx: "gfx1100")
    spec = jax.ShapeDtypeStruct((1000,), jnp.float32)
    with pytest.raises(jt.KernelError, match=r"'exp_add'.*cannot be compiled for this GPU.*"
                       r"unknown target 'hip:gfx1100'"):
        jax.jit(_kernel()).trace(spec, spec).lower(lowering_platforms=("rocm",))


@needs_clang
def test_a_dynamic_size_goes_into_the_launch(rocm_cache, monkeypatch):
    monkeypatch.setenv("JAXTILE_ROCM_ARCHS", "gfx942")
    kernel = _kernel(dynamic={"x": (0,), "y": (0,)})
    launches = []
    for n in (1000, 300):
        spec = jax.ShapeDtypeStruct((n,), jnp.float32)
        exported = jax.export.export(jax.jit(kernel), platforms=["rocm"],
                                     disabled_checks=jt.export_checks())(spec, spec)
        ((key, text),) = _calls(exported.mlir_module())
        (code,) = _ffi.decode_hip_payload(key, text)["code_objects"]
        launches.append((key, code["launch"]))
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


LAUNCH = "grid=1,1,1;block=64,1,1;smem=0;params=b0"


def test_the_rocm_decoder_refuses_another_platforms_payload():
    key = "ab" * 32
    cuda = payload.pack_cuda(key=key, name="k", symbol="k", arch="sm_80", launch=LAUNCH,
                             cubin=b"x")
    with pytest.raises(RuntimeError, match="'k'.*not a ROCm kernel's payload"):
        _ffi.decode_hip_payload(key, cuda)
    hip = payload.pack_hip(key=key, name="k", code=[payload.HipCode("gfx942", "k", LAUNCH, b"x")])
    with pytest.raises(RuntimeError, match="not a CUDA kernel's payload"):
        _ffi.decode_cuda_payload(key, hip)


def test_the_rocm_decoder_splits_the_code_objects_in_order():
    key = "ab" * 32
    code = [payload.HipCode("gfx90a", "k90", LAUNCH, b"\x7fELF-a" * 3),
            payload.HipCode("gfx942", "k94", LAUNCH.replace("64", "128"), b"B")]
    fields = _ffi.decode_hip_payload(key, payload.pack_hip(key=key, name="k", code=code))
    assert [payload.HipCode(c["arch"], c["symbol"], c["launch"], c["code_object"])
            for c in fields["code_objects"]] == code


def test_an_old_rocm_payload_says_to_export_again():
    # Format 1, as jaxtile wrote it before: one code object and its fields.
    key = "ab" * 32
    old = payload._seal([("format", 1), ("jaxtile", "0.9.0"), ("platform", "rocm"),
                         ("key", key), ("name", "k"), ("symbol", "k"), ("arch", "gfx942"),
                         ("launch", LAUNCH), ("size", 1)], b"x")
    with pytest.raises(RuntimeError) as info:
        _ffi.decode_hip_payload(key, old)
    for words in ("'k'", "older jaxtile (jaxtile 0.9.0, ROCm payload format 1",
                  "no longer reads", "export the program again"):
        assert words in str(info.value), (words, str(info.value))
    newer = payload.pack_hip(key=key, name="k", format=3, version="99.0",
                             code=[payload.HipCode("gfx942", "k", LAUNCH, b"x")])
    with pytest.raises(RuntimeError, match="newer jaxtile.*format 3.*up to 2"):
        _ffi.decode_hip_payload(key, newer)


@pytest.mark.parametrize("edit,words", [
    (lambda t: t.replace("code_objects=2", "code_objects=0"), "has no code object"),
    (lambda t: t.replace("code_objects=2", "code_objects=1"), "unexpected fields"),
    (lambda t: t.replace("size=1\n", "size=9\n"), "larger than the whole artifact"),
    (lambda t: t.replace("size=1\n", "size=0\n"), "has 4 bytes where the header says 3"),
])
def test_a_malformed_rocm_payload_is_named(edit, words):
    key = "ab" * 32
    code = [payload.HipCode("gfx90a", "k", LAUNCH, b"abc"),
            payload.HipCode("gfx942", "k", LAUNCH, b"d")]
    text = payload.pack_hip(key=key, name="k", code=code)
    _, artifact = payload.unpack(text)
    # Re-sealed after the edit: the checksum passes, the structure does not.
    header = text.partition("\nsha256=")[0].split("\n")[1:]
    edited = edit("\n".join(header) + "\n").splitlines()
    bad = payload._seal([tuple(line.split("=", 1)) for line in edited], artifact)
    with pytest.raises(RuntimeError, match=f"'k'.*{words}"):
        _ffi.decode_hip_payload(key, bad)
