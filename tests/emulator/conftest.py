"""What the emulator tests share."""

import jax
import pytest

import jaxtile as jt


@pytest.fixture
def emulator():
    """Kernels compile for CUDA and run in the SIMT emulator for the test's duration."""
    before = jt.backend()
    # jax.jit's caches do not know jaxtile's backend: clear them around the switch, or a
    # function jitted on one backend would run its executable from the other.
    jax.clear_caches()
    jt.set_backend("cuda-emulator")
    yield
    jt.set_backend(before)
    jax.clear_caches()
