"""jax.export of programs calling jaxtile kernels: the artifact carries its kernels.

Exported artifacts are run in a fresh Python process with an empty kernel cache, which has
never compiled or loaded the kernels: that is the point of a self-contained export.
"""

import base64
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import _ffi
from jaxtile.compiler import cache
from jaxtile.compiler.target import parse_target
from jaxtile.export import export_checks
from jaxtile.primitives import kernel_call, payload
from jaxtile.primitives.lowering import CPU_EXPORTED_TARGET_NAME

matmul_relu = functools.partial(jt.ops.matmul_relu, bm=32, bn=32, bk=16)

SHAPES = {"x": (10, 200), "a": (70, 40), "b": (40, 50)}


def _program():
    # A fresh function per export: JAX caches lowerings per traced function, and some tests
    # must lower again with a patched encoder.
    return jax.jit(lambda x, a, b: (jt.ops.softmax(x), matmul_relu(a, b)))


def _inputs():
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def _export(**kwargs):
    x = jax.ShapeDtypeStruct(SHAPES["x"], jnp.float32)
    a = jax.ShapeDtypeStruct(SHAPES["a"], jnp.float32)
    b = jax.ShapeDtypeStruct(SHAPES["b"], jnp.float32)
    return jax.export.export(_program(), disabled_checks=export_checks(), **kwargs)(x, a, b)


def _flip_library_byte(blob: bytes) -> bytes:
    """The artifact with one base64 digit of the first embedded library changed."""
    start = blob.find(b"jaxtile-kernel-payload\n")
    assert start >= 0, "the serialized artifact does not hold the payload as plain text"
    body = blob.index(b"\n", blob.index(b"sha256=", start)) + 1
    at = body + 1000
    tampered = bytearray(blob)
    tampered[at] = ord("B") if blob[at] == ord("A") else ord("A")
    return bytes(tampered)


# Runs artifacts in order, each with the same inputs, and reports per artifact the outputs
# (saved as .npy) or the error. The first call of the good artifact comes from several
# threads at once, to exercise concurrent first loads.
_RUNNER = r"""
import json, os, sys, threading
import jax, numpy as np
import jaxtile

work = sys.argv[1]
inputs = [np.load(os.path.join(work, f"{n}.npy")) for n in ("x", "a", "b")]
report = {}
for name in sys.argv[2:]:
    with open(os.path.join(work, name + ".bin"), "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))
    compiled = jax.jit(exported.call).lower(*inputs).compile()
    results, errors = [None] * 4, []
    def run(i):
        try:
            results[i] = compiled(*inputs)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        report[name] = {"error": errors[0]}
        continue
    for i, outs in enumerate(results):
        for j, out in enumerate(outs):
            np.save(os.path.join(work, f"{name}-{i}-{j}.npy"), np.asarray(out))
    report[name] = {"outputs": len(results[0])}
report["loaded"] = sorted(jaxtile._ffi.loaded_keys())
report["cache"] = sorted(os.listdir(os.environ["JAXTILE_CACHE_DIR"]))
print(json.dumps(report))
"""


def _run_fresh(work, names):
    cache = work / "empty-cache"
    cache.mkdir()
    env = dict(os.environ, JAXTILE_CACHE_DIR=str(cache), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _RUNNER, str(work), *names], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory):
    """Exports the program three ways and runs each artifact in one fresh process."""
    work = tmp_path_factory.mktemp("export")
    for name, value in _inputs().items():
        np.save(work / f"{name}.npy", value)
    good = _export()
    blob = good.serialize()

    def newer(name, e, isa):
        with open(e.library, "rb") as f:
            library = f.read()
        return payload.pack(key=e.key, name=name, symbol=e.symbol,
                            num_blocks=e.num_blocks, library=library, isa=isa,
                            signature=e.meta.signature, format=payload.FORMAT + 1,
                            version="99.0.0")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(payload, "encode", newer)
        newer_blob = _export().serialize()

    artifacts = {"tampered": _flip_library_byte(blob), "newer": newer_blob, "good": blob}
    for name, data in artifacts.items():
        (work / f"{name}.bin").write_bytes(data)
    # Bad artifacts first: they must fail without loading anything, and then the good one
    # still finds no kernel loaded.
    report = _run_fresh(work, ["tampered", "newer", "good"])
    return work, good, report


def test_exported_program_runs_in_a_fresh_process_without_cache(fresh_run):
    work, exported, report = fresh_run
    assert report["good"] == {"outputs": 2}, report["good"]
    inputs = _inputs()
    want_softmax = jax.nn.softmax(inputs["x"], axis=-1)
    want_matmul = jax.nn.relu(jnp.matmul(inputs["a"], inputs["b"],
                                         precision=jax.lax.Precision.HIGHEST))
    for i in range(4):
        np.testing.assert_allclose(np.load(work / f"good-{i}-0.npy"), want_softmax,
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.load(work / f"good-{i}-1.npy"), want_matmul,
                                   rtol=1e-4, atol=1e-4)
    text = exported.mlir_module()
    keys = {k for k in _ffi.loaded_keys() if f'key = "{k}"' in text}
    assert len(keys) == 2
    assert sorted(keys) == report["loaded"]
    assert report["cache"] == []  # nothing was compiled or cached there


def test_tampered_payload_is_a_clear_error(fresh_run):
    error = fresh_run[2]["tampered"]["error"]
    for words in ("jaxtile", "payload", "checksum mismatch", "'softmax'"):
        assert words in error, error


def test_payload_from_a_newer_jaxtile_is_a_clear_error(fresh_run):
    error = fresh_run[2]["newer"]["error"]
    for words in ("newer jaxtile", "jaxtile 99.0.0", f"format {payload.FORMAT + 1}",
                  "upgrade jaxtile"):
        assert words in error, error


def test_only_exports_carry_the_payload():
    x, a, b = _inputs().values()
    plain = _program().lower(x, a, b).as_text()
    assert plain.count("@jaxtile_cpu_call(") == 2
    assert "payload" not in plain
    exported = _export().mlir_module()
    assert exported.count("@jaxtile_cpu_exported_call(") == 2
    assert exported.count("jaxtile-kernel-payload") == 2
    assert "@jaxtile_cpu_call(" not in exported


def test_export_without_the_checks_says_to_pass_them():
    """jax.export's own rejection of an unknown custom call prints the op, base64 payload and
    all (tens of thousands of characters); the lowering says what to pass instead."""
    spec = jax.ShapeDtypeStruct(SHAPES["x"], jnp.float32)
    with pytest.raises(jt.KernelError) as info:
        jax.export.export(jax.jit(jt.ops.softmax))(spec)  # MARK-export
    msg = str(info.value)
    for words in ("'softmax'", "disabled_checks=jt.export_checks()", CPU_EXPORTED_TARGET_NAME):
        assert words in msg, msg
    assert len(msg) < 1000, len(msg)
    with open(__file__) as f:
        line = next(n for n, text in enumerate(f, 1) if "# MARK-export" in text)
    assert f"{__file__}:{line}" in msg, msg
    # Checks that do not cover jaxtile's call are still refused; allowing every call works.
    other = [jax.export.DisabledSafetyCheck.custom_call("some_other_target")]
    with pytest.raises(jt.KernelError, match="export_checks"):
        jax.export.export(jax.jit(jt.ops.softmax), disabled_checks=other)(spec)
    every = [jax.export.DisabledSafetyCheck.custom_call("ALL")]
    exported = jax.export.export(jax.jit(jt.ops.softmax), disabled_checks=every)(spec)
    assert CPU_EXPORTED_TARGET_NAME in exported.mlir_module()


@pytest.mark.parametrize("platforms", [["tpu"], ["cpu", "tpu"]])
def test_export_for_another_platform_is_a_kernel_error(platforms):
    # CUDA exports: tests/compiler/cuda/test_cuda_export.py; ROCm's:
    # tests/compiler/hip/test_hip_export.py.
    with pytest.raises(jt.KernelError) as info:
        _export(platforms=platforms)
    msg = str(info.value)
    for words in ("softmax", "'tpu'", str(platforms), "CPU, CUDA and ROCm"):
        assert words in msg, msg


# The decoder, in this process: payloads for keys nothing else uses.


def _fake_key():
    return "test-export-" + uuid.uuid4().hex


def _handle_of(kernel, *args, **params):
    """The handle of a kernel specialisation, its CPU cache entry (compiled here) and its
    library."""
    jaxpr = jax.make_jaxpr(functools.partial(kernel, **params))(*args)
    (handle,) = [e.params["kernel"] for e in jaxpr.eqns if "kernel" in e.params]
    entry = handle.spec.build(parse_target("cpu"), kernel_call.load)
    with open(entry.library, "rb") as f:
        return handle, entry, f.read()


def _load(key, text):
    with pytest.raises(RuntimeError) as info:
        _ffi.load_exported_kernel(key, text)
    return str(info.value)


def _fake(key, library=b"\x7fELF not really", **fields):
    fields = {"name": "fake", "symbol": "fake", "num_blocks": 1,
              "signature": "x:float32[1]", **fields}
    return payload.pack(key=key, library=library, **fields)


def test_payload_format_matches_the_runtime():
    assert _ffi.PAYLOAD_FORMAT == payload.FORMAT


def test_the_first_exported_call_loads_the_payload():
    x = jnp.arange(40, dtype=jnp.float32)
    handle, entry, library = _handle_of(jt.ops.add, x, x, block=16)
    key = _fake_key()
    text = payload.pack(key=key, name="add", symbol=entry.symbol, num_blocks=entry.num_blocks,
                        library=library, signature=entry.meta.signature)
    call = jax.ffi.ffi_call(CPU_EXPORTED_TARGET_NAME, jax.ShapeDtypeStruct(x.shape, x.dtype))
    assert not _ffi.is_loaded(key)
    np.testing.assert_array_equal(call(x, x, key=key, payload=text), 2 * x)
    assert _ffi.is_loaded(key)
    # Once loaded, the payload is not read again.
    np.testing.assert_array_equal(call(x, x + 1, key=key, payload="junk"), 2 * x + 1)
    _ffi.load_exported_kernel(key, "junk")  # a no-op too


def test_an_exported_call_is_checked_against_the_signature():
    # The library has no entry assertions: the handler checks the buffers before the call.
    x = jnp.arange(40, dtype=jnp.float32)
    _, entry, library = _handle_of(jt.ops.add, x, x, block=16)
    assert entry.meta.signature
    key = _fake_key()
    text = payload.pack(key=key, name="add", symbol=entry.symbol, num_blocks=entry.num_blocks,
                        library=library, signature=entry.meta.signature)

    def call(a, b, out=x):
        return jax.ffi.ffi_call(CPU_EXPORTED_TARGET_NAME, jax.ShapeDtypeStruct(
            out.shape, out.dtype))(a, b, key=key, payload=text)

    np.testing.assert_array_equal(call(x, x), 2 * x)
    for a, b, out, words in [
            (x, x[:39], x, r"is float32\[39\] but the kernel was compiled for float32\[40\]"),
            (x, x.astype(jnp.int32), x, r"is int32\[40\] .*the element type differs"),
            (x.reshape(4, 10), x, x, r"is float32\[4,10\] .*the rank differs"),
            (x, x, x[:20], r"is float32\[20\] but the kernel was compiled for float32\[40\]")]:
        with pytest.raises(Exception, match=r"INVALID_ARGUMENT: jaxtile: kernel '" + key +
                           r"' \(.*in the library of kernel 'add' in an exported program\): "
                           r"argument '\w+' \(buffer #\d\) " + words):
            call(a, b, out).block_until_ready()


def test_a_payload_of_format_1_is_still_read():
    # Format 1 has no signature; its libraries were built with TVM's entry assertions.
    key = _fake_key()
    text = _fake(key, format=1)
    assert "signature=" not in text
    msg = _load(key, text)
    assert "cannot load the exported kernel 'fake'" in msg and "malformed" not in msg, msg


def test_a_payload_of_format_2_with_a_shared_library_still_runs(tmp_path):
    """What jaxtile exported before format 3: the kernel linked into a shared library, which
    is opened with dlopen. A format-3 payload must hold an object."""
    if not _ffi.CPU_LINKS_OBJECTS:
        pytest.skip("this machine's exports are format 2 already")
    ld = shutil.which("ld")
    if ld is None:
        pytest.skip("making a shared library as jaxtile did before format 3 needs ld")
    x = jnp.arange(40, dtype=jnp.float32)
    _, entry, library = _handle_of(jt.ops.add, x, x, block=16)
    assert entry.kind == cache.CPU_OBJECT
    (tmp_path / "kernel.o").write_bytes(library)
    subprocess.run([ld, "-shared", "-o", str(tmp_path / "kernel.so"), str(tmp_path / "kernel.o")],
                   check=True)
    shared = (tmp_path / "kernel.so").read_bytes()
    fields = {"name": "add", "symbol": entry.symbol, "num_blocks": entry.num_blocks,
              "signature": entry.meta.signature}
    key = _fake_key()
    text = payload.pack(key=key, library=shared, format=payload.SHARED_LIBRARY_FORMAT, **fields)
    call = jax.ffi.ffi_call(CPU_EXPORTED_TARGET_NAME, jax.ShapeDtypeStruct(x.shape, x.dtype))
    np.testing.assert_array_equal(call(x, x + 1, key=key, payload=text), 2 * x + 1)
    key = _fake_key()
    msg = _load(key, payload.pack(key=key, library=shared, **fields))
    assert "cannot link" in msg and "not a relocatable object" in msg, msg


def test_a_payload_of_format_2_needs_a_signature():
    key = _fake_key()
    with pytest.raises(ValueError, match="signature"):
        _fake(key, signature="")
    text = _reseal(_fake(key), "signature=x:float32[1]\n", "signature=\n")
    assert "its kernel signature is empty" in _load(key, text)
    bad = _reseal(_fake(key), "signature=x:float32[1]\n", "signature=x:float32[\n")
    assert "bad kernel signature" in _load(key, bad)


def _sealed(header: str, library: bytes = b"") -> str:
    """A payload of ``header`` lines and ``library`` with a valid checksum line."""
    digest = hashlib.sha256(header.encode() + library).hexdigest()
    return f"{header}sha256={digest}\n{base64.b64encode(library).decode()}"


def _reseal(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced by ``new`` in its header, checksummed again."""
    header, rest = text.split("sha256=", 1)
    return _sealed(header.replace(old, new, 1), base64.b64decode(rest.split("\n", 1)[1]))


@pytest.mark.parametrize("text,words", [
    ("", "is empty"),
    ("MZ\x90\x00", "not a jaxtile kernel payload"),
    ("jaxtile-kernel-payload\nformat=1\n", "has no checksum line"),
    (_sealed("jaxtile-kernel-payload\nformat=1\n"), "expected the field 'jaxtile'"),
    (_sealed("jaxtile-kernel-payload\nformat=x\njaxtile=1\n"), "'format' is not a count"),
    (_sealed("jaxtile-kernel-payload\nformat=0\njaxtile=1\n"), "format 0 does not exist"),
    (_sealed("jaxtile-kernel-payload\nformat=1\njaxtile=1\nname=x\n"),
     "expected the field 'key'"),
])
def test_malformed_payloads(text, words):
    msg = _load(_fake_key(), text)
    assert msg.startswith("jaxtile: cannot run") and "payload" in msg, msg
    assert words in msg, msg


def test_damaged_payloads():
    key = _fake_key()
    good = _fake(key)
    header, body = good.rsplit("\n", 1)
    assert "not valid base64" in _load(key, header + "\n" + body[:-1] + "*")
    # Integrity comes first: a cut library, or any edited field, is a checksum mismatch.
    assert "checksum mismatch" in _load(key, header + "\n" + body[:-4])
    assert "checksum mismatch" in _load(key, good.replace("name=fake", "name=faux"))
    size = next(line for line in good.split("\n") if line.startswith("size="))
    assert "bytes where the header says" in _load(key, _reseal(good, size, size + "0"))
    assert "belongs to another kernel" in _load(_fake_key(), good)


def test_payload_for_another_machine():
    key = _fake_key()
    assert "compiled for riscv128 but this machine is" in _load(key, _fake(key, arch="riscv128"))
    msg = _load(key, _fake(key, isa=("jaxtile_test_isa",)))
    assert "extensions this machine lacks (jaxtile_test_isa)" in msg, msg


@pytest.mark.parametrize("size", [0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 4097])
def test_checksums_of_every_padding_case(size, tmp_path, monkeypatch):
    # A verified object that is not one reaches the in-process linker, from memory.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    key = _fake_key()
    library = np.random.default_rng(size).integers(0, 256, size, np.uint8).tobytes()
    msg = _load(key, _fake(key, library=library))
    assert "cannot load the exported kernel 'fake'" in msg and "cannot link" in msg, msg
    assert list(tmp_path.iterdir()) == [] and not _ffi.is_loaded(key)
    # A verified library of format 2 that is not one reaches dlopen, tried from a memory
    # file and then from a temporary file, which is deleted.
    msg = _load(key, _fake(key, library=library, format=payload.SHARED_LIBRARY_FORMAT))
    assert "cannot load the exported kernel 'fake'" in msg, msg
    assert "; then " in msg and str(tmp_path) in msg, msg
    assert list(tmp_path.iterdir()) == []
    assert not _ffi.is_loaded(key)


def test_encode_describes_the_kernel():
    x = jnp.ones((8, 40), jnp.float32)
    handle, entry, library = _handle_of(jt.ops.softmax, x)
    text = payload.encode(handle.name, entry, ("avx2", "fma"))
    fields = dict(line.split("=", 1) for line in text.split("\n")[1:-1])
    assert fields["isa"] == "avx2,fma"
    assert fields["key"] == entry.key and fields["symbol"] == entry.symbol
    assert int(fields["num_blocks"]) == entry.num_blocks and int(fields["size"]) == len(library)
    assert fields["format"] == str(payload.FORMAT if entry.kind == cache.CPU_OBJECT
                                   else payload.SHARED_LIBRARY_FORMAT)
    assert fields["name"] == "softmax"
    # An entry holding a shared library (cache format 3, or a machine whose FFI does not
    # link objects) exports as format 2, which every jaxtile since format 2 reads.
    shared = dataclasses.replace(entry, kind=cache.CPU_SHARED_LIBRARY)
    assert "\nformat=2\n" in payload.encode(handle.name, shared, ("avx2",))
