"""Fixtures for the reliability probes (bad input, faults, odd configuration)."""

import pytest


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty on-disk cache directory for this test (and no in-memory entries)."""
    from jaxtile.compiler import cache

    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path / "cache"))
    cache.clear_memory()
    yield tmp_path / "cache"
    cache.clear_memory()
