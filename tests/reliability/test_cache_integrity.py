"""Findings 2-4: the build cache's integrity and its failure modes.

- 2: an export embeds only a library that matches the checksum recorded at compile time;
- 3: the checksum covers the metadata, and an entry that fails its check or fails to load is
  a miss that is rebuilt (in every later process, without clearing the cache by hand);
- 4: an unusable cache directory costs the cache, never the kernel.
"""

import errno
import json
import os
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from probes import assert_ran, run_python

import jaxtile as jt
from jaxtile.compiler import cache
from jaxtile.compiler.errors import KernelError
from jaxtile.export import export_checks

# A kernel of 4 blocks: a wrong num_blocks leaves blocks unwritten or repeats them.
_KERNEL = """
import jax.numpy as jnp, numpy as np
import jaxtile as jt

@jt.kernel
def scale4(x, *, factor=3.0):
    out = jt.empty(x.shape, x.dtype)
    i = jt.grid(4)
    out.at[jt.ds(i * 8, 8)][...] = x.at[jt.ds(i * 8, 8)][...] * factor
    return out
"""

_CHECK = _KERNEL + """
from jaxtile.compiler.cpu import lower
compiles = []
real = lower.compile_to_library
def counting(kernel, target):
    compiles.append(kernel.name)
    return real(kernel, target)
lower.compile_to_library = counting
x = jnp.arange(32, dtype=jnp.float32)
for _ in range(2):
    np.testing.assert_array_equal(np.asarray(scale4(x)), np.arange(32) * 3.0)
print("compiles", len(compiles))
"""


@pytest.fixture(scope="module")
def built_entry(tmp_path_factory):
    """A cache holding scale4, compiled in a child process."""
    cache_dir = tmp_path_factory.mktemp("built")
    proc = run_python(_CHECK, env={"JAXTILE_CACHE_DIR": str(cache_dir)})
    assert_ran(proc)
    assert "compiles 1" in proc.stdout
    return cache_dir


def _copy_cache(src, dst):
    shutil.copytree(src, dst)
    (lib,) = dst.glob("*/*.so")
    return lib, lib.with_suffix(".json")


@pytest.mark.parametrize("edit", [
    {"num_blocks": 0}, {"num_blocks": 5}, {"num_blocks": 6}, {"num_blocks": -3},
    {"symbol": "no_such_symbol"}, {"symbol": "__tvm_ffi__library_ctx"},
], ids=["blocks-0", "blocks-5", "blocks-bitflip", "blocks-negative", "symbol-missing",
        "symbol-other"])
def test_damaged_metadata_is_a_miss_that_is_rebuilt(built_entry, tmp_path, edit):
    _, meta = _copy_cache(built_entry, tmp_path / "cache")
    info = json.loads(meta.read_text())
    info.update(edit)
    meta.write_text(json.dumps(info))
    env = {"JAXTILE_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_python(_CHECK, env=env)
    assert_ran(proc)
    assert "compiles 1" in proc.stdout
    # The rebuilt entry serves the next process, with no cache clearing by hand.
    proc = run_python(_CHECK, env=env)
    assert_ran(proc)
    assert "compiles 0" in proc.stdout


def _scale():
    @jt.kernel
    def scale(x, *, factor=3.0):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * factor
        return out

    return scale


def test_entry_that_fails_to_load_is_rebuilt(fresh_cache):
    # A consistent entry (checksums match) whose library cannot be loaded.
    x = jnp.arange(8, dtype=jnp.float32)
    k = _scale()
    key = k.lower(x, factor=5.0).key
    cache.store(key, b"\x7fELF not really a library", "jt_scale", 1)
    cache.clear_memory()
    np.testing.assert_array_equal(np.asarray(k(x, factor=5.0)), np.arange(8) * 5.0)


@pytest.mark.parametrize("damage", ["flip", "replace"])
def test_export_refuses_a_library_changed_on_disk(fresh_cache, damage):
    x = jnp.arange(8, dtype=jnp.float32)
    k = _scale()
    factor = 7.0 if damage == "flip" else 9.0
    np.testing.assert_array_equal(np.asarray(k(x, factor=factor)), np.arange(8) * factor)
    lib = next(p for p in fresh_cache.glob("*/*.so")
               if p.stem == k.lower(x, factor=factor).key)
    data = bytearray(lib.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        data = bytearray(b"\x7fELF" + bytes(len(data) - 4))
    lib.write_bytes(bytes(data))
    with pytest.raises(KernelError, match="(?s)scale.*changed on disk"):
        jax.export.export(jax.jit(lambda a: k(a, factor=factor)),
                          disabled_checks=export_checks())(x)


@pytest.mark.parametrize("where", ["file", "dev-null", "proc", "erofs", "enospc"])
def test_unusable_cache_dir_falls_back_with_one_warning(tmp_path, monkeypatch, where):
    if where == "file":
        path = tmp_path / "a-file"
        path.write_text("x")
    elif where == "dev-null":
        path = "/dev/null"
    elif where == "proc":
        path = "/proc/jaxtile-cache"
    else:
        path = tmp_path / "cache"
        code = errno.EROFS if where == "erofs" else errno.ENOSPC

        real = cache._write_atomic

        def failing(target, data):
            if str(target).startswith(str(path)):   # the fallback directory still works
                raise OSError(code, os.strerror(code), str(target))
            real(target, data)

        monkeypatch.setattr(cache, "_write_atomic", failing)
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(path))
    cache.clear_memory()
    monkeypatch.setattr(cache, "_warned", False, raising=False)
    x = jnp.arange(8, dtype=jnp.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for factor in (11.0, 12.0):   # two compiles, one warning
            np.testing.assert_array_equal(np.asarray(_scale()(x, factor=factor)),
                                          np.arange(8) * factor)
    cache.clear_memory()
    messages = [str(w.message) for w in caught if "cache" in str(w.message)]
    assert len(messages) == 1, messages
    assert str(path) in messages[0]


def test_stale_temporary_files_are_removed(fresh_cache):
    folder = fresh_cache / "ab"
    folder.mkdir(parents=True)
    stale = folder / ".abcdef.so.k2j3h4"
    fresh = folder / ".abcdef.json.q1w2e3"
    stale.write_bytes(b"half a library")
    fresh.write_bytes(b"being written right now")
    day_ago = os.stat(stale).st_mtime - 86400
    os.utime(stale, (day_ago, day_ago))
    _scale()(jnp.arange(8, dtype=jnp.float32), factor=13.0)
    assert not stale.exists(), "a temporary file left by a killed writer must be removed"
    assert fresh.exists(), "a temporary file another process is writing must be kept"
