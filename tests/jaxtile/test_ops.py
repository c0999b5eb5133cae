"""The library kernels, compiled for the CPU, against their reference semantics and jnp."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxtile as jt

F32 = np.float32
F16 = np.float16
BF16 = ml_dtypes.bfloat16


def _arr(rng, shape, dtype, scale=1.0):
    return jnp.asarray((rng.standard_normal(shape) * scale).astype(dtype))


# --- vector add ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("n", [1, 7, 1024, 3001])
def test_add_matches_reference_and_jnp(rng, dtype, n):
    x, y = _arr(rng, (n,), dtype), _arr(rng, (n,), dtype)
    got = jax.jit(jt.ops.add)(x, y)
    assert got.dtype == x.dtype and got.shape == (n,)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jt.ops.add.reference(x, y)))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x + y))


@pytest.mark.parametrize("block", [8, 256])
def test_add_block_sizes_and_edge_values(block):
    vals = np.array([np.inf, -np.inf, np.nan, 3e38, -3e38, 0.0, -0.0, 1e-45, 5.0], F32)
    x = jnp.asarray(np.tile(vals, 3))
    y = jnp.asarray(np.roll(np.tile(vals, 3), 1))
    got = jax.jit(lambda a, b: jt.ops.add(a, b, block=block))(x, y)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x + y))


# --- softmax -------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1), (5, 100), (37, 1000), (64, 128), (130, 257)])
def test_softmax_matches_reference_and_jnp(rng, shape):
    x = _arr(rng, shape, F32, scale=4.0)
    got = jax.jit(jt.ops.softmax)(x)
    np.testing.assert_allclose(got, jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got, jt.ops.softmax.reference(x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(got).sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_softmax_half_precision(rng, dtype):
    x = _arr(rng, (19, 300), dtype, scale=3.0)
    got = jax.jit(jt.ops.softmax)(x)
    assert got.dtype == dtype
    want = jax.nn.softmax(x.astype(F32), axis=-1).astype(dtype)
    ulp = 1e-2 if dtype == BF16 else 1e-3
    np.testing.assert_allclose(np.asarray(got, F32), np.asarray(want, F32), rtol=ulp, atol=1e-6)


def test_softmax_edge_values():
    x = np.zeros((4, 130), F32)
    x[0, :] = 1e30                     # huge but equal: uniform
    x[1, 5] = np.inf                   # +inf dominates: nan (as jax.nn.softmax)
    x[2, :] = -np.inf                  # all -inf: nan (as jax.nn.softmax)
    x[2, 7] = 0.0
    x[3, :] = np.linspace(-80, 80, 130)
    got = np.asarray(jax.jit(jt.ops.softmax)(jnp.asarray(x)))
    want = np.asarray(jax.nn.softmax(jnp.asarray(x), axis=-1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)


# --- matmul_relu ---------------------------------------------------------------------------

SMALL_TILES = {"bm": 32, "bn": 64, "bk": 16}


@pytest.mark.parametrize("mkn", [(64, 32, 128), (100, 70, 90), (1, 1, 1), (65, 17, 130)])
def test_matmul_relu_f32(rng, mkn):
    m, k, n = mkn
    a, b = _arr(rng, (m, k), F32), _arr(rng, (k, n), F32)
    got = jax.jit(lambda a, b: jt.ops.matmul_relu(a, b, **SMALL_TILES))(a, b)
    want = jnp.maximum(jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST), 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ref = jt.ops.matmul_relu.reference(a, b, **SMALL_TILES)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_matmul_relu_default_tiles_ragged(rng):
    a, b = _arr(rng, (130, 70), F32), _arr(rng, (70, 200), F32)
    got = jax.jit(jt.ops.matmul_relu)(a, b)
    want = jnp.maximum(jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST), 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mkn", [(64, 32, 128), (100, 70, 90)])
def test_matmul_relu_bf16_accumulates_in_f32(rng, mkn):
    m, k, n = mkn
    a, b = _arr(rng, (m, k), BF16), _arr(rng, (k, n), BF16)
    got = jax.jit(lambda a, b: jt.ops.matmul_relu(a, b, **SMALL_TILES))(a, b)
    assert got.dtype == BF16
    exact = np.maximum(np.asarray(a, np.float64) @ np.asarray(b, np.float64), 0)
    # f32 accumulation then one rounding to bf16: within one bf16 ulp of the exact value.
    np.testing.assert_allclose(np.asarray(got, np.float64), exact, rtol=2 ** -7, atol=1e-6)
    ref = jt.ops.matmul_relu.reference(a, b, **SMALL_TILES)
    np.testing.assert_allclose(np.asarray(got, F32), np.asarray(ref, F32), rtol=2 ** -7,
                               atol=1e-6)


def test_matmul_relu_in_a_larger_jit(rng):
    a, b = _arr(rng, (48, 40), F32), _arr(rng, (40, 56), F32)

    @jax.jit
    def f(a, b):
        return jnp.sum(jt.ops.matmul_relu(a * 2, b, **SMALL_TILES) - 1.0)

    want = jnp.sum(jnp.maximum(jnp.matmul(a * 2, b, precision="highest"), 0) - 1.0)
    np.testing.assert_allclose(f(a, b), want, rtol=1e-5)


def test_eager_call_outside_jit(rng):
    x, y = _arr(rng, (300,), F32), _arr(rng, (300,), F32)
    np.testing.assert_array_equal(np.asarray(jt.ops.add(x, y)), np.asarray(x + y))


def test_library_kernels_from_a_warm_disk_cache(rng, tmp_path):
    """A fresh process loads the kernels compiled above from disk (compiling is made to fail
    there) and gets the same results."""
    import os
    import subprocess
    import sys
    import textwrap

    x, y = _arr(rng, (3001,), F32), _arr(rng, (3001,), F32)
    s = _arr(rng, (37, 1000), F32, scale=4.0)
    a, b = _arr(rng, (100, 70), F32), _arr(rng, (70, 90), F32)
    jax.block_until_ready((jt.ops.add(x, y), jt.ops.softmax(s),
                           jt.ops.matmul_relu(a, b, **SMALL_TILES)))
    np.savez(tmp_path / "inputs.npz", x=x, y=y, s=s, a=a, b=b)
    script = textwrap.dedent(f"""
        import jax, jax.numpy as jnp, numpy as np
        import jaxtile as jt
        from jaxtile.compiler.cpu import lower

        def no_compiling(kernel, target):
            raise AssertionError("compiled instead of loading from the cache")

        lower.compile_to_library = no_compiling
        d = np.load({str(tmp_path / "inputs.npz")!r})
        x, y, s, a, b = (jnp.asarray(d[k]) for k in "xysab")
        np.testing.assert_array_equal(jax.jit(jt.ops.add)(x, y), x + y)
        np.testing.assert_allclose(jax.jit(jt.ops.softmax)(s), jax.nn.softmax(s, axis=-1),
                                   rtol=1e-5, atol=1e-7)
        got = jax.jit(lambda a, b: jt.ops.matmul_relu(a, b, bm=32, bn=64, bk=16))(a, b)
        np.testing.assert_allclose(got, jnp.maximum(jnp.matmul(a, b, precision="highest"),
                                   0), rtol=1e-5, atol=1e-5)
        print("warm ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], env=dict(os.environ),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "warm ok" in out.stdout


def test_scratch_larger_than_a_thread_stack(rng):
    """A 9 MiB fragment (more than a default 8 MiB thread stack) lives on the heap."""
    x = _arr(rng, (40, 70_000), F32)
    got = jax.jit(lambda x: jt.ops.softmax(x, rows=32))(x)
    np.testing.assert_allclose(got, jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-9)
