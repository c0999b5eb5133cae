"""Fixtures for the emulator tests: kernel sources and building them for the emulator."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def emulator_cache(tmp_path_factory):
    """Keep the emulator's build products in one cache per test session, unless the
    environment chose a cache directory."""
    import os

    if "JAXTILE_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["JAXTILE_CACHE_DIR"] = str(tmp_path_factory.mktemp("jaxtile-cache"))
    yield
    del os.environ["JAXTILE_CACHE_DIR"]
