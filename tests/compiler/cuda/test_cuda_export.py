"""Lowering for CUDA on a machine without a GPU: the call carries its cubin.

Until the CUDA code generator lands, a stand-in backend compiles a hand-written kernel of the
same meaning through the interface the generator uses (``compile_kernel`` -> ``CompiledCuda``
as ``compile_to_library``'s result)."""

import re
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cuda_kernels import SCALE_SHIFT, needs_compiler

import jaxtile as jt
from jaxtile import _ffi
from jaxtile.compiler import build, cache
from jaxtile.compiler.cuda.compile import compile_kernel
from jaxtile.compiler.gpu.launch import Launch, buffer, scalar
from jaxtile.primitives import payload
from jaxtile.primitives.lowering import CUDA_TARGET_NAME

pytestmark = needs_compiler


@pytest.fixture
def stand_in_backend(monkeypatch, tmp_path):
    """A CUDA backend compiling SCALE_SHIFT for any kernel; yields what it compiled."""
    compiled = []

    def compile_to_library(kernel, target):
        (x,) = [b for b in kernel.params if b.role == "input"]
        n = int(np.prod(x.shape))
        launch = Launch((-(-n // 128), 1, 1), (128, 1, 1), 0,
                        (buffer(0), buffer(1), scalar("i32", n), scalar("f32", 2.0),
                         scalar("f32", 1.0)))
        compiled.append(compile_kernel(SCALE_SHIFT, "scale_shift", target, launch))
        return compiled[-1]

    module = types.ModuleType("_jaxtile_stand_in_cuda_backend")
    module.compile_to_library = compile_to_library
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(build._BACKENDS, "cuda", module.__name__)
    # Its cubins must not be found by later tests under the same keys.
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    cache.clear_memory()
    yield compiled
    cache.clear_memory()


def _scale_shift_kernel():
    # A fresh kernel per test: specialisations keep their compiled entries.
    @jt.kernel
    def scale_shift(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * 2 + 1
        return out
    return scale_shift


def _payloads(mlir_text: str) -> list[str]:
    """The payload attributes of the module's CUDA kernel calls, MLIR escapes undone."""
    calls = [line for line in mlir_text.splitlines() if CUDA_TARGET_NAME in line]
    found = [re.search(r'payload = "((?:[^"\\]|\\.)*)"', line).group(1) for line in calls]
    return [re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), p)
            for p in found]


def test_export_for_cuda_carries_the_cubin(stand_in_backend):
    kernel = _scale_shift_kernel()
    spec = jax.ShapeDtypeStruct((1000,), jnp.float32)
    exported = jax.export.export(jax.jit(kernel), platforms=["cuda"],
                                 disabled_checks=jt.export_checks())(spec)
    blob = exported.serialize()
    restored = jax.export.deserialize(blob)
    assert restored.platforms == ("cuda",)
    (text,) = _payloads(restored.mlir_module())
    (compiled,) = stand_in_backend
    # Python's reading and the handler's agree with what was compiled, byte for byte.
    header, artifact = payload.unpack(text)
    assert artifact == compiled.cubin + compiled.ptx and artifact.startswith(b"\x7fELF")
    assert header["ptx_size"] == str(len(compiled.ptx)) and b".target sm_80" in compiled.ptx
    assert header["platform"] == "cuda" and header["arch"] == "sm_80"
    assert Launch.decode(header["launch"]) == compiled.launch
    fields = _ffi.decode_cuda_payload(header["key"], text)
    assert fields["cubin"] == compiled.cubin and fields["ptx"] == compiled.ptx
    assert fields["symbol"] == "scale_shift"
    assert fields["name"] == "scale_shift" and fields["launch"] == compiled.launch.encode()
    assert compiled.launch.grid == (8, 1, 1)


def test_jit_lowering_for_cuda_carries_the_cubin_too(stand_in_backend):
    # A persistent-compilation-cache hit runs the HLO without lowering again: the cubin must
    # be in it under jit as well, not only in exports.
    kernel = _scale_shift_kernel()
    x = jax.ShapeDtypeStruct((300,), jnp.float32)
    lowered = jax.jit(kernel).trace(x).lower(lowering_platforms=("cuda",))
    (text,) = _payloads(lowered.as_text())
    (compiled,) = stand_in_backend
    assert payload.unpack(text)[1] == compiled.cubin + compiled.ptx


def test_export_for_cpu_and_cuda_holds_both_calls(stand_in_backend):
    kernel = _scale_shift_kernel()
    spec = jax.ShapeDtypeStruct((64,), jnp.float32)
    exported = jax.export.export(jax.jit(kernel), platforms=["cpu", "cuda"],
                                 disabled_checks=jt.export_checks())(spec)
    module = exported.mlir_module()
    assert "jaxtile_cpu_exported_call" in module and len(_payloads(module)) == 1
    # The CPU branch still runs here.
    x = np.arange(64, dtype=np.float32)
    np.testing.assert_allclose(exported.call(x), x * 2 + 1)


def test_a_gpu_newer_than_every_target_gets_the_highest_plain_one(stand_in_backend,
                                                                     monkeypatch):
    # Compute capability 11.0 (newer than every known target): sm_103's cubin, which the
    # handler finds is not for this GPU, and its PTX, which the driver compiles for it.
    from jaxtile.primitives import lowering
    monkeypatch.setattr(lowering.ji, "compute_capability", lambda ctx: "11.0")
    spec = jax.ShapeDtypeStruct((64,), jnp.float32)
    lowered = jax.jit(_scale_shift_kernel()).trace(spec).lower(lowering_platforms=("cuda",))
    (text,) = _payloads(lowered.as_text())
    header, _ = payload.unpack(text)
    (compiled,) = stand_in_backend
    assert header["arch"] == compiled.arch == "sm_103"
    assert int(header["ptx_size"]) > 0 and b".target sm_103" in compiled.ptx


def test_a_hopper_at_hand_gets_sm_90a_and_an_export_for_it_plain_sm_90(stand_in_backend,
                                                                          monkeypatch):
    # The program lowered for the devices at hand runs on them: sm_90a's code (wgmma, TMA
    # rings, setmaxnreg), which runs on compute capability 9.0 alone. An export may meet any
    # later GPU, so it keeps plain sm_90, whose PTX the driver compiles for them.
    from jaxtile.primitives import lowering
    monkeypatch.setattr(lowering.ji, "compute_capability", lambda ctx: "9.0")
    spec = jax.ShapeDtypeStruct((64,), jnp.float32)
    lowered = jax.jit(_scale_shift_kernel()).trace(spec).lower(lowering_platforms=("cuda",))
    (text,) = _payloads(lowered.as_text())
    assert payload.unpack(text)[0]["arch"] == stand_in_backend[-1].arch == "sm_90a"
    # Its PTX would run on no other GPU either: the call carries the cubin alone.
    assert payload.unpack(text)[0]["ptx_size"] == "0" and not stand_in_backend[-1].ptx
    exported = jax.export.export(jax.jit(_scale_shift_kernel()), platforms=["cuda"],
                                 disabled_checks=jt.export_checks())(spec)
    (text,) = _payloads(exported.mlir_module())
    assert payload.unpack(text)[0]["arch"] == stand_in_backend[-1].arch == "sm_90"


def test_a_gpu_older_than_the_lowering_is_a_kernel_error_naming_the_kernel(stand_in_backend,
                                                                            monkeypatch):
    from jaxtile.primitives import lowering
    monkeypatch.setattr(lowering.ji, "compute_capability", lambda ctx: "7.5")
    spec = jax.ShapeDtypeStruct((64,), jnp.float32)
    with pytest.raises(jt.KernelError) as info:
        jax.jit(_scale_shift_kernel()).trace(spec).lower(lowering_platforms=("cuda",))
    msg = str(info.value)
    for words in ("kernel 'scale_shift'", "cannot be compiled for this GPU", "cuda:sm_75 lacks",
                  "cp.async", "test_cuda_export.py"):
        assert words in msg, (words, msg)


def test_export_for_cuda_without_export_checks_says_what_to_pass(stand_in_backend):
    spec = jax.ShapeDtypeStruct((64,), jnp.float32)
    with pytest.raises(jt.KernelError, match="export_checks.*jaxtile_cuda_call"):
        jax.export.export(jax.jit(_scale_shift_kernel()), platforms=["cuda"])(spec)


def test_export_for_cuda_without_a_cuda_backend_is_a_kernel_error(monkeypatch):
    monkeypatch.delitem(build._BACKENDS, "cuda", raising=False)
    spec = jax.ShapeDtypeStruct((64,), jnp.float32)
    with pytest.raises(jt.KernelError) as info:
        jax.export.export(jax.jit(_scale_shift_kernel()), platforms=["cpu", "cuda"],
                          disabled_checks=jt.export_checks())(spec)
    msg = str(info.value)
    for words in ("scale_shift", "'cuda'", "['cpu', 'cuda']", "cannot compile for cuda:sm_80"):
        assert words in msg, msg


@pytest.mark.parametrize("target", ["cuda:sm_80", "cuda:sm_90a"])
def test_generated_kernels_compile_to_cubins(target):
    # The real backend: Tile IR -> CUDA source -> NVRTC (or nvcc) -> a cached cubin.
    from jaxtile.compiler.target import parse_target
    tgt = parse_target(target)
    for k, args in [(jt.ops.softmax, (jnp.ones((100, 256)),)),
                    (jt.ops.matmul_relu, (jnp.ones((200, 256), jnp.float16),
                                          jnp.ones((256, 136), jnp.float16)))]:
        lowered = k.lower(*args, target=target)
        entry = build.build(lowered.kernel, tgt)
        assert entry.kind == cache.CUDA_CUBIN
        with open(entry.library, "rb") as f:
            assert f.read(4) == b"\x7fELF"      # a cubin is an ELF image


def test_export_of_a_generated_kernel_for_cuda_needs_no_compiler_to_run():
    spec = jax.ShapeDtypeStruct((100, 256), jnp.float32)
    exported = jax.export.export(jax.jit(jt.ops.softmax), platforms=["cuda"],
                                 disabled_checks=jt.export_checks())(spec)
    text = exported.mlir_module()
    (p,) = _payloads(text)
    fields, artifact = payload.unpack(p)
    assert fields["platform"] == "cuda" and fields["arch"] == "sm_80"
    assert artifact[:4] == b"\x7fELF"                  # the cubin travels in the call


def _attention_reference(q, k, v):
    s = jnp.einsum("bhtd,bhsd->bhts", q, k) / np.sqrt(q.shape[-1])
    return jnp.einsum("bhts,bhsd->bhtd", jax.nn.softmax(s, axis=-1), v)


def test_export_for_cuda_on_a_cpu_host_uses_the_gpu_table():
    # The trace chooses tiles from the host CPU's table (f32 attention at 128 x 128, which
    # needs 225 KiB of shared memory); each platform's lowering chooses again for its own
    # target, so the CUDA call is sm_80's kernel and the CPU call stays the CPU's.
    from jaxtile.compiler.target import parse_target
    q = jax.ShapeDtypeStruct((1, 8, 1024, 64), jnp.float32)
    lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
    exported = jax.export.export(jax.jit(lambda q, k, v: jt.ops.attention(q, k, v)),
                                 platforms=["cpu", "cuda"],
                                 disabled_checks=jt.export_checks())(q, q, q)
    module = exported.mlir_module()
    (text,) = _payloads(module)
    header, _ = payload.unpack(text)
    sm80 = parse_target("cuda:sm_80")
    assert header["arch"] == "sm_80"
    assert Launch.decode(header["launch"]).dynamic_smem <= sm80.caps.max_smem_bytes
    fwd = jt.ops.attention_fwd
    assert header["key"] == fwd.lower(q, q, q, lengths, target="cuda:sm_80").key
    (cpu_call,) = [line for line in module.splitlines()
                   if "jaxtile_cpu_exported_call" in line]
    assert fwd.lower(q, q, q, lengths).key in cpu_call
    # The CPU branch runs here (its kernel against the reference semantics:
    # tests/jaxtile/test_ops_attention.py; running them at this size takes seconds).
    rng = np.random.default_rng(0)
    x = [jnp.asarray(rng.standard_normal(q.shape), jnp.float32) for _ in range(3)]
    np.testing.assert_allclose(exported.call(*x), _attention_reference(*x), rtol=2e-4,
                               atol=2e-5)


def test_export_of_attention_grad_for_cuda_on_a_cpu_host_fits_the_gpu():
    # The differentiation rules run at trace time; they get the tiles the call passed, not
    # the CPU table's, so the forward kernel they call chooses again at lowering and the
    # backward kernels (which have no table) take default_tiles.
    from jaxtile.compiler.target import parse_target
    q = jax.ShapeDtypeStruct((1, 8, 1024, 64), jnp.float32)
    loss = jax.jit(jax.grad(lambda q, k, v: jt.ops.attention(q, k, v).sum(), (0, 1, 2)))
    exported = jax.export.export(loss, platforms=["cuda"],
                                 disabled_checks=jt.export_checks())(q, q, q)
    headers = [payload.unpack(p)[0] for p in _payloads(exported.mlir_module())]
    assert sorted(h["name"] for h in headers) == ["attention_dkdv", "attention_dq",
                                                  "attention_fwd"]
    most = parse_target("cuda:sm_80").caps.max_smem_bytes
    for h in headers:
        assert Launch.decode(h["launch"]).dynamic_smem <= most, h["name"]
