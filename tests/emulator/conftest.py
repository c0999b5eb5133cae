"""What the emulator tests share."""

import contextlib

import jax
import pytest

import jaxtile as jt
from jaxtile.compiler.cuda import emulated


@contextlib.contextmanager
def _backend(name):
    before = jt.backend()
    # jax.jit's caches do not know jaxtile's backend: clear them around the switch, or a
    # function jitted on one backend would run its executable from the other.
    jax.clear_caches()
    jt.set_backend(name)
    try:
        yield
    finally:
        jt.set_backend(before)
        jax.clear_caches()


@pytest.fixture
def emulator():
    """Kernels compile for CUDA and run in the SIMT emulator for the test's duration."""
    with _backend("cuda-emulator"):
        yield


@pytest.fixture
def hip_emulator():
    """Kernels compile for gfx942 and run in the emulator's wave64 mode for the test."""
    with _backend("hip-emulator"):
        yield


@pytest.fixture
def hopper(monkeypatch):
    """Kernels run as sm_90a code in the emulator; records the source of each library built."""
    built = []
    real = emulated.build_library

    def spy(source, *args, **kwargs):
        built.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(emulated, "build_library", spy)
    with _backend("cuda-emulator:sm_90a"):
        yield built
