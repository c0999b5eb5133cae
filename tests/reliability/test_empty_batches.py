"""Zero-size dimensions (issue 19, point 7): kernels and library ops give what ``jnp`` gives,
in value and gradient, for empty batches; a grid of no blocks launches nothing on any
backend (the reference used to slice the empty input, a raw JAX TypeError; the CUDA handler
refused a zero grid extent); D=0 in the norms gives jnp's empty result, and in attention a
clear error instead of a ZeroDivisionError in library code."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxtile as jt


@jt.kernel
def _masked_rows(x, lens):
    """Row ``b`` keeps its first ``lens[b]`` entries: a per-row scalar read from an input."""
    b, n = x.shape
    out = jt.empty((b, n), x.dtype)
    i = jt.grid(b)
    t = jt.fragment((1, n), x.dtype)
    jt.copy(x.at[i, 0], t)
    col = lax.broadcasted_iota(jnp.int32, (1, n), 1)
    t[...] = jnp.where(col < lens[i], t[...], 0)
    jt.copy(t, out.at[i, 0])
    return out


def _masked_rows_jnp(x, lens):
    return jnp.where(jnp.arange(x.shape[1])[None, :] < lens[:, None], x, 0)


def _same(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (got, want)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_kernel_reading_a_per_row_scalar():
    x = jnp.zeros((0, 8), jnp.float32)
    lens = jnp.zeros((0,), jnp.int32)
    want = _masked_rows_jnp(x, lens)
    _same(_masked_rows(x, lens), want)
    _same(jax.jit(_masked_rows)(x, lens), want)
    _same(_masked_rows.reference(x, lens), want)
    grad = jax.grad(lambda x: _masked_rows(x, lens).sum())(x)
    _same(grad, jax.grad(lambda x: _masked_rows_jnp(x, lens).sum())(x))


def _attention_jnp(q, k, v):
    # jax.nn.dot_product_attention takes (batch, seq, heads, dim)
    t = lambda a: a.transpose(0, 2, 1, 3)  # noqa: E731
    return t(jax.nn.dot_product_attention(t(q), t(k), t(v)))


def test_attention_of_an_empty_batch():
    q = jnp.zeros((0, 2, 16, 32), jnp.float32)
    _same(jt.ops.attention(q, q, q), _attention_jnp(q, q, q))
    out, lse = jax.jit(lambda q: jt.ops.attention(q, q, q, causal=True, return_lse=True))(q)
    _same(out, q)
    _same(lse, jnp.zeros((0, 2, 16), jnp.float32))


@pytest.mark.slow
def test_attention_gradient_of_an_empty_batch():
    q = jnp.zeros((0, 2, 16, 32), jnp.float32)
    grads = jax.grad(lambda q, k, v: jt.ops.attention(q, k, v).sum(), argnums=(0, 1, 2))(q, q, q)
    want = jax.grad(lambda q, k, v: _attention_jnp(q, k, v).sum(), argnums=(0, 1, 2))(q, q, q)
    for g, w in zip(grads, want):
        _same(g, w)


def test_attention_decode_of_an_empty_batch():
    pages = jnp.ones((2, 4, 16, 32), jnp.float32)
    out = jt.ops.attention_decode(jnp.zeros((0, 2, 32)), pages, pages,
                                  jnp.zeros((0, 4), jnp.int32), jnp.zeros((0,), jnp.int32))
    _same(out, jnp.zeros((0, 2, 32), jnp.float32))


@pytest.mark.parametrize("op", ["attention", "attention_decode"])
def test_attention_without_features_is_a_clear_error(op):
    with pytest.raises((jt.KernelError, ValueError), match="head_dim is 0"):
        if op == "attention":
            q = jnp.zeros((1, 2, 16, 0))
            jt.ops.attention(q, q, q)
        else:
            pages = jnp.zeros((2, 4, 16, 0))
            jt.ops.attention_decode(jnp.zeros((1, 2, 0)), pages, pages,
                                    jnp.zeros((1, 4), jnp.int32), jnp.ones((1,), jnp.int32))


@pytest.mark.parametrize("a_shape,b_shape", [
    ((4, 8), (8, 0)), pytest.param((0, 8), (8, 3), marks=pytest.mark.slow)])
def test_matmul_value_and_gradient_with_a_zero_dimension(a_shape, b_shape):
    a = jnp.ones(a_shape, jnp.float32)
    b = jnp.ones(b_shape, jnp.float32)
    _same(jt.ops.matmul(a, b), a @ b)
    loss = lambda f: lambda a, b: (f(a, b) * 2.0).sum()  # noqa: E731
    got = jax.grad(loss(jt.ops.matmul), argnums=(0, 1))(a, b)
    want = jax.grad(loss(jnp.matmul), argnums=(0, 1))(a, b)
    for g, w in zip(got, want):
        _same(g, w)


def _rms_norm_jnp(x, w, eps=1e-6):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _layer_norm_jnp(x, w, b, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * w + b


@pytest.mark.parametrize("op,grad", [
    ("rms_norm", False), pytest.param("rms_norm", True, marks=pytest.mark.slow),
    pytest.param("layer_norm", True, marks=pytest.mark.slow)])
def test_norms_with_no_features(op, grad):
    x = jnp.ones((4, 0), jnp.float32)
    w, b = jnp.ones((0,), jnp.float32), jnp.zeros((0,), jnp.float32)
    if op == "rms_norm":
        ours, theirs, args = (lambda x, w: jt.ops.rms_norm(x, w)), _rms_norm_jnp, (x, w)
    else:
        ours, theirs, args = (lambda x, w, b: jt.ops.layer_norm(x, w, b)), _layer_norm_jnp, \
            (x, w, b)
    _same(ours(*args), theirs(*args))
    if grad:          # the backward kernels divided by the feature count too
        argnums = tuple(range(len(args)))
        got = jax.grad(lambda *a: ours(*a).sum(), argnums=argnums)(*args)
        want = jax.grad(lambda *a: theirs(*a).sum(), argnums=argnums)(*args)
        for g, wnt in zip(got, want):
            _same(g, wnt)


# --- the CUDA handler: a grid of no blocks is not launched ---------------------------------

_CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("g++")
_FAKE_DRIVER = Path(__file__).parents[1] / "ffi" / "cuda" / "fake_libcuda.c"

_SCRIPT = textwrap.dedent("""
    import json, sys
    from jaxtile import _ffi
    from jaxtile.compiler.gpu.launch import Launch, buffer
    from jaxtile.primitives import payload

    key = "e7" * 32
    text = Launch(("dim0_0", 1, 1), (128, 1, 1), 0, (buffer(0),)).encode()
    data = payload.pack_cuda(key=key, name="rows", symbol="rows", arch="sm_80", launch=text,
                             cubin=b"FAKECUBIN params=8", ptx=b"")
    results = {}
    for rows in (0, 5):
        try:
            _ffi.cuda_launch(key, data, 0x100, [0x1000], [[rows, 8]])
            results[rows] = "ok"
        except RuntimeError as e:
            results[rows] = str(e)
    print(json.dumps(results))
""")


@pytest.mark.slow   # a child process (the fake driver must be found when it is opened)
@pytest.mark.skipif(_CC is None, reason="no C compiler to build the fake CUDA driver")
def test_the_cuda_handler_skips_a_grid_of_no_blocks(tmp_path):
    subprocess.run([_CC, "-shared", "-fPIC", "-O1", f"-I{_FAKE_DRIVER.parents[1]}", "-o",
                    str(tmp_path / "libcuda.so.1"), str(_FAKE_DRIVER)], check=True,
                   capture_output=True)
    log = tmp_path / "calls.log"
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path), "FAKE_CUDA_LOG": str(log),
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"0": "ok", "5": "ok"}
    launches = [line for line in log.read_text().splitlines() if "cuLaunchKernel" in line]
    assert len(launches) == 1 and "grid=5,1,1" in launches[0], launches
