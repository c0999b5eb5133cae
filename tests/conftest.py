"""Test setup: a fresh on-disk kernel cache per test run (shared by its xdist workers), the IR
verified after every compiler pass, and shared helpers."""

import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

# The xdist workers inherit the controller's environment: they share its cache, so that what
# one worker built (the emulator runtimes take half a minute each) the other finds. The cache
# is safe for concurrent processes (tests/compiler/test_cache.py).
_OWNER = not ("PYTEST_XDIST_WORKER" in os.environ and "JAXTILE_TEST_CACHE" in os.environ)
_CACHE = (tempfile.mkdtemp(prefix="jaxtile-test-cache-") if _OWNER
          else os.environ["JAXTILE_TEST_CACHE"])
os.environ["JAXTILE_TEST_CACHE"] = _CACHE
os.environ["JAXTILE_CACHE_DIR"] = _CACHE
os.environ["JAXTILE_VERIFY_IR"] = "1"


def pytest_sessionfinish(session, exitstatus):
    """Remove the run's cache, in the process that made it (the xdist controller finishes
    after its workers); /tmp would keep one per run otherwise."""
    build = sys.modules.get("jaxtile.compiler.build")
    if build is not None:
        build.wait_idle()
    if _OWNER:
        shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _builds_end_with_their_test():
    """A kernel traced into a program starts compiling on the compile threads
    (compiler/build.py), even if the test never runs it (make_jaxpr): that build must not
    run on into the next test, whose patches or counts it would meet."""
    yield
    build = sys.modules.get("jaxtile.compiler.build")
    if build is not None:
        build.wait_idle()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def to_f32(x):
    return np.asarray(x, dtype=np.float32)
