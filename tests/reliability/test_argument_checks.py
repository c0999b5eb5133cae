"""Bad arguments to kernels and ops are refused with a clear error naming the argument,
never a silent zero output or a raw error from deep inside JAX or a lowering."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import _config


@pytest.mark.parametrize("splits", [0, -1, 1.5, True])
def test_decode_splits_must_be_a_positive_int(splits):
    """splits=0 launched no block and returned zeros."""
    q = jnp.ones((1, 2, 16))
    pages = jnp.ones((1, 2, 4, 16))
    with pytest.raises(jt.KernelError, match=r"splits must be a positive int, got "):
        jt.ops.attention_decode(q, pages, pages, jnp.zeros((1, 2), jnp.int32),
                                jnp.asarray([5], jnp.int32), splits=splits)


def _copy_body(x):
    out = jt.empty((8,), x.dtype)
    t = jt.fragment((8,), x.dtype)
    jt.copy(x.at[0], t)
    jt.copy(t, out.at[0])
    return out


def test_lower_with_a_non_string_target():
    """target=None raised a raw TypeError from the target parser."""
    with pytest.raises(jt.KernelError, match=r"target must be a string .* got None"):
        jt.kernel(_copy_body).lower(jnp.ones((8,)), target=None)


@pytest.mark.parametrize("threads", [96.0, 0, -32, True, "128"])
def test_threads_must_be_a_positive_int(threads):
    """threads=96.0 ran on the CPU and crashed the CUDA lowering."""
    with pytest.raises(jt.KernelError, match=r"threads must be a positive int") as info:
        jt.kernel(threads=threads)(_copy_body)
    assert __file__ in str(info.value)


@pytest.mark.parametrize("threads", [2048, 100])
def test_threads_a_gpu_block_cannot_have(threads):
    """threads=2048 was accepted until the emulator ran the kernel; 100 is not a whole
    number of warps. A CPU runs any count."""
    k = jt.kernel(threads=threads)(_copy_body)
    x = jnp.arange(8, dtype=jnp.float32)
    np.testing.assert_array_equal(k(x), np.arange(8))
    message = rf"threads={threads} cannot run on cuda:sm_80: .* 32-thread warps, at most 1024"
    with pytest.raises(jt.KernelError, match=message):
        k.lower(x, target="cuda:sm_80")
    before = jt.backend()
    jax.clear_caches()
    jt.set_backend("cuda-emulator")
    try:
        with pytest.raises(jt.KernelError, match=message):    # before anything is compiled
            k(x)
    finally:
        jt.set_backend(before)
        jax.clear_caches()


def test_a_second_export_without_disabled_checks():
    """JAX caches the lowering of the first export, so the lowering rule that explains the
    missing disabled_checks did not run again and JAX's raw ValueError came instead."""
    f = jax.jit(lambda x: jt.kernel(_copy_body)(x) + 1)
    x = jnp.ones((8,), jnp.float32)
    exported = jax.export.export(f, disabled_checks=jt.export_checks())(x)
    np.testing.assert_array_equal(exported.call(x), np.full(8, 2.0))
    for _ in range(2):
        with pytest.raises(jt.KernelError, match=r"disabled_checks=jt.export_checks\(\)"):
            jax.export.export(f)(x)


@pytest.mark.parametrize("text", ["CUDA-Emulator", "CUDA-Emulator:SM_90A", "CPU", "cpu"])
def test_backend_variable_in_any_case(text, monkeypatch):
    monkeypatch.setenv("JAXTILE_BACKEND", text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _config.get("JAXTILE_BACKEND") == text.lower()
