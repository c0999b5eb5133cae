"""Test setup: a fresh on-disk kernel cache per test session, the IR verified after every
compiler pass, and shared helpers."""

import os
import tempfile

import numpy as np
import pytest

_CACHE = tempfile.mkdtemp(prefix="jaxtile-test-cache-")
os.environ["JAXTILE_CACHE_DIR"] = _CACHE
os.environ["JAXTILE_VERIFY_IR"] = "1"


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def to_f32(x):
    return np.asarray(x, dtype=np.float32)
