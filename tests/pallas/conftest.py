"""The ported Pallas kernels run on the CPU by default, and in the CUDA SIMT emulator and its
wave64 (AMD) mode under the ``slow`` marker (a g++ build per kernel)."""

import jax
import pytest

import jaxtile as jt


@pytest.fixture(params=["cpu", pytest.param("cuda-emulator", marks=pytest.mark.slow,
                                             id="emu"),
                        pytest.param("hip-emulator", marks=pytest.mark.slow, id="hip")])
def backend(request):
    """Run the test on one jaxtile backend; jit caches are cleared around a non-CPU run,
    since they do not know the backend."""
    before = jt.backend()
    if request.param != "cpu":
        jax.clear_caches()
    jt.set_backend(request.param)
    yield request.param
    jt.set_backend(before)
    if request.param != "cpu":
        jax.clear_caches()
