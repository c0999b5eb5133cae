"""Kernels compiled to CUDA and run in the SIMT emulator (the ``cuda-emulator`` backend) inside
``jax.jit``, against their reference semantics and an independent jnp formula. The emulator's
race, bounds and barrier checks are on: a missing barrier fails the run."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import ops
from jaxtile.compiler.emulator import build as emu_build

BF16 = np.dtype(ml_dtypes.bfloat16)


def _data(shape, dtype, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _close(got, want, dtype):
    tol = 2e-2 if np.dtype(dtype) == BF16 else 2e-5
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=tol, atol=tol)


def _check(kernel, args, want, dtype):
    got = jax.jit(lambda *a: kernel(*a))(*args)
    ref = kernel.reference(*args)
    _close(got, ref[0] if isinstance(ref, list | tuple) else ref, dtype)
    _close(got, want, dtype)


SLOW = pytest.mark.slow


@pytest.mark.parametrize("shape", [pytest.param((16, 256), marks=SLOW), (10, 300)],
                         ids=["even", "ragged"])
@pytest.mark.parametrize("dtype", [np.float32, pytest.param(BF16, marks=SLOW)],
                         ids=["f32", "bf16"])
def test_row_softmax(emulator, shape, dtype):
    x = _data(shape, dtype)
    want = jax.nn.softmax(x.astype(jnp.float32), axis=-1)
    _check(ops.softmax, [x], want, dtype)


@pytest.mark.parametrize("shape", [pytest.param((8, 128), marks=SLOW), (5, 200)],
                         ids=["even", "ragged"])
def test_layer_norm(emulator, shape):
    x, w, b = _data(shape, np.float32), _data(shape[1:], np.float32, 1), \
        _data(shape[1:], np.float32, 2)
    mean = x.mean(-1, keepdims=True)
    want = (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b
    _check(ops.layer_norm, [x, w, b], want, np.float32)


@pytest.mark.parametrize("dtype", [pytest.param(np.float32, marks=SLOW), BF16],
                         ids=["f32", "bf16"])
def test_rms_norm(emulator, dtype):
    x, w = _data((6, 100), dtype), _data((100,), dtype, 1)
    xf = x.astype(jnp.float32)
    want = xf / jnp.sqrt((xf * xf).mean(-1, keepdims=True) + 1e-6) * w.astype(jnp.float32)
    _check(ops.rms_norm, [x, w], want, dtype)


@pytest.mark.parametrize("n", [pytest.param(4096, marks=SLOW), 1000], ids=["even", "ragged"])
def test_elementwise_add(emulator, n):
    x, y = _data((n,), np.float32), _data((n,), np.float32, 1)
    _check(ops.add, [x, y], x + y, np.float32)


def test_the_emulator_compiles_exactly_the_lowered_source(emulator, monkeypatch):
    seen = []
    real = emu_build.build_library

    def spy(source, *args, **kwargs):
        seen.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(emu_build, "build_library", spy)
    from jaxtile.compiler.cuda import emulated

    monkeypatch.setattr(emulated, "build_library", spy)
    x = _data((7, 130), np.float32, 5)
    jax.block_until_ready(ops.softmax(x))
    lowered = ops.softmax.lower(x, target="cuda:sm_80").source
    assert seen == [lowered]


@pytest.mark.parametrize("mkn", [(100, 40, 70), pytest.param((128, 64, 128), marks=SLOW)],
                         ids=["ragged", "even"])
@pytest.mark.parametrize("dtype", [np.float16, pytest.param(BF16, marks=SLOW)],
                         ids=["f16", "bf16"])
def test_matmul_relu_on_tensor_cores(emulator, mkn, dtype):
    m, k, n = mkn
    a, b = _data((m, k), dtype, 3), _data((k, n), dtype, 4)
    want = jnp.maximum(a.astype(jnp.float32) @ b.astype(jnp.float32), 0)
    got = jax.jit(lambda a, b: ops.matmul_relu(a, b, bm=64, bn=64, bk=32, stages=2))(a, b)
    ref = ops.matmul_relu.reference(a, b, bm=64, bn=64, bk=32, stages=2)
    ref = ref[0] if isinstance(ref, list | tuple) else ref
    tol = 2e-2 if np.dtype(dtype) == BF16 else 2e-3
    for other in (ref, want):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(other, np.float32),
                                   rtol=tol, atol=tol * 4)


@pytest.mark.slow
def test_matmul_f32_uses_tf32():
    """float32 operands go through tf32 tensor cores: close to the float64 product, within
    tf32's precision, not float32's."""
    before = jt.backend()
    jt.set_backend("cuda-emulator")
    try:
        a, b = _data((40, 48), np.float32, 5), _data((48, 24), np.float32, 6)
        got = np.asarray(jax.jit(lambda a, b: ops.matmul(a, b, bm=32, bn=32, bk=16))(a, b))
    finally:
        jt.set_backend(before)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    err = np.abs(got - exact).max() / np.abs(exact).max()
    assert 1e-6 < err < 3e-3


@pytest.mark.parametrize("backend", ["cuda-emulator", "hip-emulator"])
def test_exporting_an_emulator_kernel_is_a_clear_error(backend):
    before = jt.backend()
    jt.set_backend(backend)
    try:
        x = jax.ShapeDtypeStruct((64,), jnp.float32)
        with pytest.raises(jt.KernelError, match=r"emulator backend.*set_backend\('cpu'\)"):
            jax.export.export(jax.jit(ops.add), platforms=["cpu"],
                              disabled_checks=jt.export_checks())(x, x)
    finally:
        jt.set_backend(before)
