"""jt.stats(): per-kernel compiles, compile time and cache hits, from memory and disk."""

import logging

import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import cache


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    cache.clear_memory()
    jt.stats(reset=True)
    yield tmp_path
    cache.clear_memory()


def _stats_scale():
    # A fresh Kernel object each time, so each call reaches the build cache.
    @jt.kernel
    def stats_scale(x, *, factor=2.0):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * factor
        return out

    return stats_scale


def test_compiles_then_memory_then_disk_hits(fresh_cache, caplog):
    x = jnp.arange(8, dtype=jnp.float32)
    caplog.set_level(logging.DEBUG, logger="jaxtile")
    np.testing.assert_allclose(_stats_scale()(x), np.arange(8) * 2.0)
    first = jt.stats()["stats_scale"]
    assert (first.compiles, first.memory_hits, first.disk_hits) == (1, 0, 0)
    assert first.compile_seconds > 0

    np.testing.assert_allclose(_stats_scale()(x), np.arange(8) * 2.0)
    cache.clear_memory()
    np.testing.assert_allclose(_stats_scale()(x), np.arange(8) * 2.0)
    now = jt.stats(reset=True)["stats_scale"]
    assert (now.compiles, now.memory_hits, now.disk_hits) == (1, 1, 1)
    assert now.compile_seconds == first.compile_seconds
    assert jt.stats() == {}

    records = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "jaxtile"]
    assert (logging.INFO, "compiling stats_scale for cpu") in records
    assert any(level == logging.INFO and msg.startswith("compiled stats_scale for cpu in ")
               and msg.endswith(" s") for level, msg in records)
    assert (logging.DEBUG, "cache hit (memory) for stats_scale on cpu") in records
    assert (logging.DEBUG, "cache hit (disk) for stats_scale on cpu") in records
