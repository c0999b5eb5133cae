"""Choosing the backend that runs kernels on JAX's CPU platform (jt.backend, jt.set_backend,
JAXTILE_BACKEND): read when a kernel is specialised."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import cache


@jt.kernel
def _double(x):
    out = jt.empty(x.shape, x.dtype)
    out[...] = x[...] * 2
    return out


@pytest.fixture
def restore_backend():
    before = jt.backend()
    yield
    jt.set_backend(before)


def test_default_is_the_cpu():
    assert jt.backend() == "cpu"


def test_unknown_backend_is_an_error(restore_backend):
    with pytest.raises(jt.KernelError, match="unknown backend 'gpu'.*cpu, cuda-emulator"):
        jt.set_backend("gpu")
    assert jt.backend() == "cpu"


def test_the_choice_is_read_when_a_kernel_is_specialised(restore_backend):
    x = jnp.arange(6, dtype=jnp.float32)
    f = jax.jit(_double)
    np.testing.assert_array_equal(f(x), 2 * x)   # specialised and compiled for the CPU
    jt.set_backend("cuda-emulator")
    assert jt.backend() == "cuda-emulator"
    # what JAX traced before keeps the CPU specialisation it holds
    np.testing.assert_array_equal(f(x), 2 * x)
    # a call specialised now is compiled for CUDA and runs in the emulator
    before = {k for k, e in cache._memory.items() if e.kind == cache.EMULATOR_LIBRARY}
    np.testing.assert_array_equal(jax.jit(lambda v: _double(v))(x), 2 * x)
    after = {k for k, e in cache._memory.items() if e.kind == cache.EMULATOR_LIBRARY}
    assert len(after - before) == 1
    jt.set_backend("cpu")
    np.testing.assert_array_equal(jax.jit(lambda v: _double(v))(x), 2 * x)


@pytest.mark.parametrize("value,expected", [("cuda-emulator", "cuda-emulator"),
                                            ("cuda-emulator:sm_90a", "cuda-emulator:sm_90a"),
                                            ("cpu", "cpu"), ("tpu", "cpu")])
def test_environment_variable(value, expected):
    env = {**os.environ, "JAXTILE_BACKEND": value}
    out = subprocess.run([sys.executable, "-W", "always", "-c",
                          "import jaxtile as jt; print(jt.backend())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == expected
    if value == "tpu":
        assert "JAXTILE_BACKEND" in out.stderr and "cuda-emulator" in out.stderr
