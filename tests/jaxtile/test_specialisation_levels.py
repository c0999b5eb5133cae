"""How a specialisation finds code prebuilt for an x86-64 level on the host CPU target: only
levels whose extensions the host has, the highest first, and never over the host's own
cached entry. The hosts here are the real host target with its ISA flags replaced, so every
case runs on any x86-64 machine: nothing prebuilt is run, only looked up."""

import dataclasses
import platform
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import build, cache
from jaxtile.compiler.target import ISA_LEVELS, parse_target

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="the ISA levels are x86-64's")


@jt.kernel
def _level_scale(x, *, factor=2.0):
    out = jt.empty(x.shape, x.dtype)
    out[...] = x[...] * factor
    return out


def _host_with(isa):
    """The host CPU target with the ISA flags ``isa`` (the host's own model and level)."""
    host = parse_target("cpu")
    return dataclasses.replace(host, caps=dataclasses.replace(host.caps, isa=tuple(isa)))


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """An empty cache directory and a prebuilt directory holding ``_level_scale`` for
    ``f32[16]`` compiled for each level named in the test's ``prebuild`` call."""
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("JAXTILE_PREBUILT_DIR", str(tmp_path / "prebuilt"))
    cache.clear_memory()

    def prebuild(*levels, factor):
        spec = _level_scale._specialise((jax.ShapeDtypeStruct((16,), jnp.float32),),
                                        {"factor": factor})
        keys = {}
        monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path / "prebuilt"))
        for level in levels:
            keys[level] = build.build(spec.compiled_ir, parse_target(f"cpu:{level}")).key
        monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path / "cache"))
        cache.clear_memory()
        return spec, keys

    yield prebuild
    cache.clear_memory()


def test_a_level_the_host_lacks_is_never_loaded(dirs):
    spec, keys = dirs("x86-64-v4", factor=3.25)
    assert spec._level_prebuilt(_host_with(ISA_LEVELS["x86-64-v3"])) is None
    # The same entry is found by a host that has AVX-512.
    found = spec._level_prebuilt(_host_with(ISA_LEVELS["x86-64-v4"]))
    assert found is not None and found.key == keys["x86-64-v4"]


def test_the_highest_level_the_host_has_is_found(dirs):
    spec, keys = dirs("x86-64-v3", "x86-64-v4", factor=3.5)
    v4_host = _host_with(sorted({*ISA_LEVELS["x86-64-v4"], "avx512_bf16"}))
    assert spec._level_prebuilt(v4_host).key == keys["x86-64-v4"]
    cache.clear_memory()
    assert spec._level_prebuilt(_host_with(ISA_LEVELS["x86-64-v3"])).key == keys["x86-64-v3"]


def test_a_level_target_and_the_host_own_entry_skip_the_lookup(dirs):
    spec, _ = dirs("x86-64-v3", factor=3.75)
    assert spec._level_prebuilt(parse_target("cpu:x86-64-v3")) is None    # its own key
    host = _host_with(ISA_LEVELS["x86-64-v3"])
    cache.store(build.kernel_key(spec.compiled_ir, host), b"\0" * 64, "f", 1)
    assert spec._level_prebuilt(host) is None


def test_the_host_runs_a_level_prebuilt_entry_and_compiles_nothing(dirs):
    """End to end on this machine: the highest level it runs, prebuilt, is what the call
    loads; the result is the kernel's."""
    host = parse_target("cpu")
    levels = [lv for lv in ISA_LEVELS if set(ISA_LEVELS[lv]) <= set(host.caps.isa)]
    if not levels or host.caps.level != "host":
        pytest.skip("this CPU runs no x86-64 level, or JAXTILE_CPU_ISA narrows it")
    dirs(*levels, factor=4.25)
    before = cache.stats()
    x = jnp.arange(16, dtype=jnp.float32)
    np.testing.assert_array_equal(_level_scale(x, factor=4.25), np.arange(16) * 4.25)
    after = cache.stats()
    assert after["stored"] == before["stored"]
    assert after["prebuilt_hits"] == before["prebuilt_hits"] + 1


def test_no_prebuilt_directory_costs_no_level_keys(tmp_path, monkeypatch):
    """Without a prebuilt directory, the compile path computes no key for any level."""
    monkeypatch.setenv("JAXTILE_PREBUILT_DIR", str(tmp_path / "absent"))
    monkeypatch.setattr(cache, "PACKAGE_PREBUILT", tmp_path / "absent-too")
    spec = _level_scale._specialise((jax.ShapeDtypeStruct((16,), jnp.float32),),
                                    {"factor": 5.5})
    spec.compiled_ir  # noqa: B018 - traced before key computations are refused

    def refuse(*args, **kwargs):
        raise AssertionError("a key was computed")

    monkeypatch.setattr(build, "kernel_key", refuse)
    assert spec._level_prebuilt(_host_with(ISA_LEVELS["x86-64-v4"])) is None


@pytest.mark.parametrize("built_by", ["this compiler", "another compiler", "another TVM"])
def test_only_entries_of_this_compiler_and_tvm_are_found(built_by, tmp_path, monkeypatch):
    """What a wheel ships in the package's prebuilt folder was compiled by the compiler and
    TVM of its build: an entry keyed for another compiler digest or TVM version (a package
    whose files or TVM differ) is never found; the call compiles, with the kernel's result.
    ``this compiler`` is the control: the same setup does find its entry."""
    host = parse_target("cpu")
    levels = [lv for lv in ISA_LEVELS if set(ISA_LEVELS[lv]) <= set(host.caps.isa)]
    if not levels or host.caps.level != "host":
        pytest.skip("this CPU runs no x86-64 level, or JAXTILE_CPU_ISA narrows it")
    level = max(levels, key=lambda lv: len(ISA_LEVELS[lv]))
    factor = {"this compiler": 6.25, "another compiler": 6.5, "another TVM": 6.75}[built_by]
    package = tmp_path / "package-prebuilt"
    monkeypatch.setattr(cache, "PACKAGE_PREBUILT", package)
    monkeypatch.delenv("JAXTILE_PREBUILT_DIR", raising=False)
    spec = _level_scale._specialise((jax.ShapeDtypeStruct((16,), jnp.float32),),
                                    {"factor": factor})
    target = parse_target(f"cpu:{level}")
    with monkeypatch.context() as m:
        m.setenv("JAXTILE_CACHE_DIR", str(package))
        cache.clear_memory()
        if built_by == "another compiler":
            m.setattr(build, "compiler_version", lambda: "0123456789abcdef")
        elif built_by == "another TVM":
            target = dataclasses.replace(target, toolchain="apache-tvm 0.26.0")
        built = build.build(spec.compiled_ir, target)
    assert Path(built.library).is_relative_to(package)
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path / "cache"))
    cache.clear_memory()
    before = cache.stats()
    x = jnp.arange(16, dtype=jnp.float32)
    np.testing.assert_array_equal(_level_scale(x, factor=factor), np.arange(16) * factor)
    after = cache.stats()
    found = built_by == "this compiler"
    assert after["prebuilt_hits"] - before["prebuilt_hits"] == int(found)
    assert after["stored"] - before["stored"] == int(not found)
    cache.clear_memory()
