"""Fixtures for the CPU runtime tests."""

import ffi_kernels
import jax
import pytest

import jaxtile._ffi as jt_ffi


@pytest.fixture(scope="session")
def kernel_lib(tmp_path_factory):
    """Path of a shared library holding every kernel in ffi_kernels."""
    path = tmp_path_factory.mktemp("kernels") / "kernels.so"
    ffi_kernels.build(path)
    return str(path)


@pytest.fixture(scope="session")
def ffi():
    """The extension module, with the custom-call target registered with XLA."""
    jax.ffi.register_ffi_target("jaxtile_cpu_call", jt_ffi.cpu_handler(), platform="cpu")
    return jt_ffi
