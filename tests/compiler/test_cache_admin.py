"""Inspecting and pruning a real kernel cache: entries, damage, clearing by age."""

import os
import shutil
import time

import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import _ffi
from jaxtile.compiler import cache, cache_admin

# What this machine compiles CPU kernels to (compiler/cpu/lower.py's compile_to_library).
CPU_KIND = cache.CPU_OBJECT if _ffi.CPU_LINKS_OBJECTS else cache.CPU_SHARED_LIBRARY


@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory):
    """A cache directory holding two compiled kernels (built once for the module)."""
    root = tmp_path_factory.mktemp("filled-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXTILE_CACHE_DIR", str(root))
        cache.clear_memory()

        @jt.kernel
        def admin_add_one(x):
            out = jt.empty(x.shape, x.dtype)
            out[...] = x[...] + 1.0
            return out

        @jt.kernel
        def admin_negate(x):
            out = jt.empty(x.shape, x.dtype)
            out[...] = -x[...]
            return out

        x = jnp.arange(4, dtype=jnp.float32)
        np.testing.assert_allclose(admin_add_one(x), np.arange(4) + 1.0)
        np.testing.assert_allclose(admin_negate(x), -np.arange(4))
        cache.clear_memory()
    return root


@pytest.fixture
def cache_copy(filled_cache, tmp_path, monkeypatch):
    """A private copy of the filled cache, as the cache directory, for tests that change it."""
    root = tmp_path / "cache"
    shutil.copytree(filled_cache, root)
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(root))
    cache.clear_memory()
    yield root
    cache.clear_memory()


def test_entries_are_the_compiled_kernels(filled_cache):
    found = cache_admin.entries(filled_cache)
    assert len(found) == 2
    assert all(e.problem == "" and e.kind == CPU_KIND for e in found)
    # Oldest first: the kernels in the order they were compiled.
    assert ["admin_add_one" in found[0].symbol, "admin_negate" in found[1].symbol] == [True] * 2
    for e in found:
        assert sorted(p.suffix for p in e.files) == [".json", ".so"]
        assert e.size == sum(p.stat().st_size for p in e.files)


def test_damage_is_reported_as_a_lookup_sees_it(cache_copy):
    first, second = cache_admin.entries()
    lib = next(p for p in first.files if p.suffix == ".so")
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    next(p for p in second.files if p.suffix == ".json").unlink()
    problems = {e.key: e.problem for e in cache_admin.entries()}
    assert problems == {first.key: "its record or artifact fails its checksum or format check",
                        second.key: "its record (.json) is missing"}
    # The same verdict as a kernel call's lookup: both would be rebuilt.
    assert cache.lookup(first.key) is None and cache.lookup(second.key) is None


def test_clear_older_than_keeps_recent_entries(cache_copy):
    old, recent = cache_admin.entries()
    long_ago = time.time() - 3 * 86400
    for path in old.files:
        os.utime(path, (long_ago, long_ago))
    removed, size = cache_admin.clear(older_than=cache_admin.parse_duration("2d"))
    assert (removed, size) == (2, old.size)
    assert [e.key for e in cache_admin.entries()] == [recent.key]
    removed, _ = cache_admin.clear()
    assert removed == 2 and cache_admin.entries() == []


def test_clear_removes_emulator_builds(cache_copy):
    build = cache_copy / cache_admin.EMULATOR_FOLDER / "libjaxtile_emu-0123.so"
    build.parent.mkdir()
    build.write_bytes(b"\0" * 10)
    assert cache_admin.other_files() == [build]
    removed, _ = cache_admin.clear()
    assert removed == 5 and not build.exists()


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("12h", 43200),
                                               ("1d12h", 129600), ("2w", 1209600),
                                               ("0.5h", 1800)])
def test_parse_duration(text, seconds):
    assert cache_admin.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "7x", "d", "1d 2", "-1d"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="expected a number and a unit s, m, h, d or w"):
        cache_admin.parse_duration(text)
