"""The build cache: content keys, atomic entries, corruption recovery, concurrent builders."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import _ffi
from jaxtile.compiler import cache
from jaxtile.compiler.cpu import lower


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    cache.clear_memory()
    yield tmp_path
    cache.clear_memory()


def _scale_kernel():
    @jt.kernel
    def scale(x, *, factor=3.0):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * factor
        return out

    return scale


def _count_compiles(monkeypatch):
    calls = []
    real = lower.compile_to_library

    def counting(kernel, target):
        calls.append(kernel.name)
        return real(kernel, target)

    monkeypatch.setattr(lower, "compile_to_library", counting)
    return calls


def test_warm_disk_cache_skips_compilation(fresh_cache, monkeypatch):
    calls = _count_compiles(monkeypatch)
    x = jnp.arange(8, dtype=jnp.float32)
    np.testing.assert_array_equal(_scale_kernel()(x), np.arange(8) * 3.0)
    assert calls == ["scale"]
    assert list(fresh_cache.glob("*/*.so"))
    cache.clear_memory()
    np.testing.assert_array_equal(_scale_kernel()(x), np.arange(8) * 3.0)
    assert calls == ["scale"], "a warm disk entry must be loaded, not rebuilt"


def test_key_depends_on_params_shapes_and_dtypes(fresh_cache):
    k = _scale_kernel()
    keys = {k.lower(jnp.ones(8)).key, k.lower(jnp.ones(8), factor=2.0).key,
            k.lower(jnp.ones(9)).key, k.lower(jnp.ones(8, jnp.bfloat16)).key}
    assert len(keys) == 4
    assert k.lower(jnp.ones(8)).key == _scale_kernel().lower(jnp.ones(8)).key


def _replace(path, data):
    """Damage a file by putting another in its place: the library is mapped by this process,
    and truncating that mapping in place would crash it (SIGBUS), not test the cache."""
    tmp = path.with_name(path.name + ".damaged")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# The empty files are what a power loss can leave of an entry renamed into place before
# its data reached the disk (the cache does not fsync).
@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete-meta", "empty-library",
                                    "empty-meta"])
def test_corrupt_entry_is_rebuilt(fresh_cache, monkeypatch, damage):
    calls = _count_compiles(monkeypatch)
    x = jnp.arange(8, dtype=jnp.float32)
    _scale_kernel()(x)
    (lib,) = fresh_cache.glob("*/*.so")
    if damage == "truncate":
        _replace(lib, lib.read_bytes()[:100])
    elif damage == "garbage":
        _replace(lib, b"\0" * 4096)
    elif damage == "empty-library":
        _replace(lib, b"")
    elif damage == "empty-meta":
        _replace(lib.with_suffix(".json"), b"")
    else:
        lib.with_suffix(".json").unlink()
    cache.clear_memory()
    assert cache.lookup(_scale_kernel().lower(x).key) is None
    np.testing.assert_array_equal(_scale_kernel()(x), np.arange(8) * 3.0)
    assert len(calls) == 2


def test_prebuilt_entry_that_cannot_load_is_compiled_and_left_alone(fresh_cache,
                                                                    monkeypatch):
    """A prebuilt entry whose checksums pass but whose library cannot be loaded is a miss
    for this process: the kernel compiles into the cache directory and the prebuilt
    directory, read-only data, keeps its files."""
    calls = _count_compiles(monkeypatch)
    x = jnp.arange(8, dtype=jnp.float32)
    # A factor no other test uses (tests/reliability/test_cache_integrity.py has 5.0): a key
    # this process has loaded before is not reloaded.
    key = _scale_kernel().lower(x, factor=13.5).key
    prebuilt = fresh_cache / "prebuilt"
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(prebuilt))
    cache.store(key, b"\0" * 4096, "scale", 1)     # consistent checksums, not a library
    files = {p: p.read_bytes() for p in prebuilt.rglob("*") if p.is_file()}
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(fresh_cache / "cache"))
    monkeypatch.setenv("JAXTILE_PREBUILT_DIR", str(prebuilt))
    cache.clear_memory()
    assert cache.find(key)[1] == "prebuilt"
    cache.clear_memory()
    np.testing.assert_array_equal(_scale_kernel()(x, factor=13.5), np.arange(8) * 13.5)
    assert calls == ["scale"]
    assert {p: p.read_bytes() for p in prebuilt.rglob("*") if p.is_file()} == files
    cache.clear_memory()
    assert cache.find(key)[1] == "disk"


def test_two_processes_compile_the_same_kernel(fresh_cache):
    script = textwrap.dedent("""
        import jax.numpy as jnp, numpy as np, jaxtile as jt
        x = jnp.arange(4096, dtype=jnp.float32)
        np.testing.assert_array_equal(jt.ops.add(x, x, block=512), np.asarray(x) * 2)
        print("ok")
    """)
    env = {**os.environ, "JAXTILE_CACHE_DIR": str(fresh_cache)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "ok" in out
    assert len(list(fresh_cache.glob("*/*.so"))) == 1
    assert not list(fresh_cache.glob("*/.*")), "temporary files must not be left behind"


def test_cached_and_find_prebuilt(fresh_cache, monkeypatch):
    """``cached`` answers for memory, the cache directory and prebuilt directories without
    counting a lookup; ``find_prebuilt`` reads prebuilt directories only, and not a key
    this process refused (``discard``)."""
    prebuilt, own = fresh_cache / "prebuilt", fresh_cache / "cache"
    in_prebuilt, in_cache = cache.content_key("prebuilt"), cache.content_key("cache")
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(prebuilt))
    cache.store(in_prebuilt, b"p" * 64, "f", 1)
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(own))
    cache.store(in_cache, b"c" * 64, "f", 1)
    cache.clear_memory()
    before = cache.stats()
    assert not cache.cached(in_prebuilt)             # no prebuilt directory named yet
    monkeypatch.setenv("JAXTILE_PREBUILT_DIR", str(prebuilt))
    assert cache.cached(in_prebuilt) and cache.cached(in_cache)
    assert not cache.cached(cache.content_key("neither"))
    assert cache.stats() == before
    assert cache.find_prebuilt(in_cache) == (None, "miss")   # the cache directory is not read
    entry, where = cache.find_prebuilt(in_prebuilt)
    assert where == "prebuilt" and entry.library.startswith(str(prebuilt))
    assert cache.stats()["prebuilt_hits"] == before["prebuilt_hits"] + 1
    assert cache.stats()["misses"] == before["misses"]
    assert cache.find_prebuilt(in_prebuilt) == (entry, "memory")
    cache.discard(in_prebuilt)
    assert cache.find_prebuilt(in_prebuilt) == (None, "miss")
    assert not cache.cached(in_prebuilt)
    assert (prebuilt / in_prebuilt[:2] / f"{in_prebuilt}.so").is_file()    # left alone


def test_find_prebuilt_ignores_what_this_process_compiled(fresh_cache, monkeypatch):
    """An entry this process stored (compiled for a level, say) is not a prebuilt one: the
    host compiles its own code rather than take it."""
    key = cache.content_key("compiled here")
    monkeypatch.setenv("JAXTILE_PREBUILT_DIR", str(fresh_cache / "prebuilt"))
    cache.store(key, b"c" * 64, "f", 1)
    assert cache.lookup(key) is not None and cache.find_prebuilt(key) == (None, "miss")


def test_the_signature_is_recorded_and_checksummed(fresh_cache):
    sig = "x:float32[?,4];out0:float32[dim0_0,4]"
    entry = cache.store("ab" * 32, b"library", "f", 1, signature=sig)
    cache.clear_memory()
    assert cache.lookup(entry.key).meta.signature == sig
    # The record's checksum covers it: an edited signature is a miss.
    record = fresh_cache / entry.key[:2] / f"{entry.key}.json"
    record.write_text(record.read_text().replace("[?,4]", "[?,5]"))
    cache.clear_memory()
    assert cache.lookup(entry.key) is None
    with pytest.raises(ValueError, match="CPU kernel's artifact only"):
        cache.store("cd" * 32, b"code", "f", 1, kind=cache.HIP_CODE_OBJECT, launch="x",
                    signature=sig)
    with pytest.raises(ValueError, match="bad signature"):
        cache.store("ef" * 32, b"library", "f", 1, signature="x:float32[1]\nmore")


def _rewrite(root, key, artifact, record):
    """An entry for ``key`` in ``root`` holding ``artifact`` and ``record`` (re-checksummed)."""
    record = {**record, "key": key, "sha256": hashlib.sha256(artifact).hexdigest()}
    record["checksum"] = cache._record_digest(record)
    folder = root / key[:2]
    folder.mkdir(exist_ok=True)
    (folder / f"{key}.so").write_bytes(artifact)
    (folder / f"{key}.json").write_text(json.dumps(record))


def test_entries_of_format_3_still_load(fresh_cache, tmp_path_factory):
    """Format 3 entries hold shared libraries: still read and run (dlopen). A CPU object
    came with format 4, so a format-3 record that claims one is a miss, and so is format 2."""
    from jaxtile.primitives import kernel_call

    if not _ffi.CPU_LINKS_OBJECTS:
        pytest.skip("the FFI links objects on x86-64 Linux only")
    ld = shutil.which("ld")
    if ld is None:
        pytest.skip("making a shared library as jaxtile did before format 4 needs ld")
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(_scale_kernel()(jnp.asarray(x)), x * 3)
    (meta,) = fresh_cache.glob("*/*.json")
    record = json.loads(meta.read_text())
    assert record["format"] == cache.FORMAT == 4 and record["kind"] == cache.CPU_OBJECT
    library = tmp_path_factory.mktemp("old") / "kernel.so"
    subprocess.run([ld, "-shared", "-o", str(library), str(meta.with_suffix(".so"))], check=True)
    old = {**record, "format": 3, "kind": cache.CPU_SHARED_LIBRARY}
    # Keys of their own: this process already runs the object under the first.
    key, claims_object, format_2 = "0f" * 32, "1f" * 32, "2f" * 32
    _rewrite(fresh_cache, key, library.read_bytes(), old)
    _rewrite(fresh_cache, claims_object, meta.with_suffix(".so").read_bytes(),
             {**old, "kind": cache.CPU_OBJECT})
    _rewrite(fresh_cache, format_2, library.read_bytes(), {**old, "format": 2})
    cache.clear_memory()
    assert cache.lookup(claims_object) is None and cache.lookup(format_2) is None
    entry = cache.lookup(key)
    assert entry is not None and entry.kind == cache.CPU_SHARED_LIBRARY
    kernel_call.load(entry)
    aligned_x, out = _aligned(8, entry.alignment), _aligned(8, entry.alignment)
    aligned_x[:] = x
    _ffi.call_kernel(key, [aligned_x, out])
    np.testing.assert_array_equal(out, x * 3)


def _aligned(n, alignment):
    """n float32 zeros at the alignment a kernel assumes (numpy only promises 16 bytes)."""
    raw = np.zeros(n + alignment // 4, np.float32)
    start = -raw.ctypes.data % alignment // 4
    return raw[start:start + n]
