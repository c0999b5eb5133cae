"""16-bit running sums and products (issue 19, point 4): float16/bfloat16 ``cumsum``,
``cumprod``, sum reductions and gemm accumulators keep their running value in float32 and
round it once, on every backend and in the reference, instead of rounding at every step
(which made 512 bfloat16 ones sum to 256, and a float16 gemm 8 ulp off)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import jaxtile as jt

_BACKENDS = ["cpu", pytest.param("cuda-emulator", marks=pytest.mark.slow)]


@pytest.fixture
def on_backend(request):
    """Run the test's kernels on ``request.param``; jax.jit's caches do not know the
    backend, so they are cleared around the switch."""
    before = jt.backend()
    jax.clear_caches()
    jt.set_backend(request.param)
    yield request.param
    jt.set_backend(before)
    jax.clear_caches()


@jt.kernel
def _running(x):
    """Forward and reverse cumsum, cumprod, and a raw sum reduction along the rows."""
    v = x[...]
    outs = (jt.empty(x.shape, x.dtype), jt.empty(x.shape, x.dtype), jt.empty(x.shape, x.dtype),
            jt.empty((x.shape[0],), x.dtype))
    outs[0][...] = jnp.cumsum(v, axis=1)
    outs[1][...] = lax.cumsum(v, axis=1, reverse=True)
    outs[2][...] = jnp.cumprod(v, axis=1)
    outs[3][...] = lax.reduce(v, np.array(0, x.dtype), lax.add, (1,))   # no jnp upcast
    return outs


def _rounded_once(x: np.ndarray, dtype) -> tuple[np.ndarray, ...]:
    """The rule as a numpy formula: float32 running values, one rounding at the end."""
    w = x.astype(np.float32)
    return (np.cumsum(w, axis=1).astype(dtype), np.cumsum(w[:, ::-1], axis=1)[:, ::-1]
            .astype(dtype), np.cumprod(w, axis=1).astype(dtype), w.sum(axis=1).astype(dtype))


@pytest.mark.parametrize("on_backend", _BACKENDS, indirect=True)
@pytest.mark.parametrize("dtype,n", [(ml_dtypes.bfloat16, 512),
                                     pytest.param(np.float16, 4096, marks=pytest.mark.slow)])
def test_running_sums_of_ones_are_exact(on_backend, dtype, n):
    x = np.ones((2, n), dtype)
    got = jax.jit(_running)(jnp.asarray(x))
    for g in got[:2]:
        np.testing.assert_array_equal(np.asarray(g, np.float32)[:, -1 if g is got[0] else 0],
                                      [n, n])
    np.testing.assert_array_equal(np.asarray(got[0], np.float32),
                                  np.asarray(jnp.cumsum(jnp.asarray(x), axis=1), np.float32))
    np.testing.assert_array_equal(np.asarray(got[3], np.float32), [n, n])
    np.testing.assert_array_equal(np.asarray(jnp.sum(jnp.asarray(x), axis=1), np.float32),
                                  [n, n])


@pytest.mark.slow
@pytest.mark.parametrize("on_backend", _BACKENDS, indirect=True)
def test_bfloat16_running_products_and_sums_round_once(on_backend):
    rng = np.random.RandomState(0)
    # factors a little above 1: a bfloat16 product rounded at every step drifts by ulps
    x = (1 + rng.randint(0, 4, size=(4, 96)) / 128).astype(ml_dtypes.bfloat16)
    x[:, 48:] = rng.uniform(0.5, 1.5, size=(4, 48))
    got = jax.jit(_running)(jnp.asarray(x))
    want = _rounded_once(x, ml_dtypes.bfloat16)
    stepwise = x[:, :1].copy()
    for k in range(1, x.shape[1]):
        stepwise = np.concatenate([stepwise, (stepwise[:, -1:] * x[:, k:k + 1])], axis=1)
    assert not np.array_equal(stepwise, want[2])     # the operand tells the rules apart
    for name, g, w in zip(("cumsum", "reverse cumsum", "cumprod", "sum"), got, want):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                      err_msg=name)
    # The reference follows the rule too, where XLA's own bfloat16 scans (jnp's) round every
    # step: a few ulp off it here.
    reference = _running.reference(jnp.asarray(x))
    for name, r, w in zip(("cumsum", "reverse cumsum", "cumprod", "sum"), reference, want):
        np.testing.assert_array_equal(np.asarray(r, np.float32), np.asarray(w, np.float32),
                                      err_msg=f"reference {name}")


@jt.kernel
def _gemm_f16_acc(a, b, *, bk=64):
    """A float16 accumulator over K steps of ``bk``: each jt.gemm call rounds once."""
    m, k = a.shape
    n = b.shape[1]
    out = jt.empty((m, n), a.dtype)
    a_s = jt.shared((m, bk), a.dtype)
    b_s = jt.shared((bk, n), b.dtype)
    acc = jt.fragment((m, n), a.dtype)
    acc[...] = jnp.zeros((m, n), a.dtype)

    @jt.loop(k // bk)
    def _(kk):
        jt.copy(a.at[0, kk * bk], a_s)
        jt.copy(b.at[kk * bk, 0], b_s)
        jt.gemm(a_s, b_s, acc)
    jt.copy(acc, out)
    return out


def _ulp_error(got, exact: np.ndarray, dtype) -> float:
    """The largest error in units of ``dtype``'s spacing at the tile's largest magnitude
    (an element's running value may have been larger than its result)."""
    spacing = float(np.spacing(np.abs(exact).max().astype(dtype)))
    return float(np.max(np.abs(np.asarray(got, np.float64) - exact)) / spacing)


@pytest.mark.parametrize("on_backend", _BACKENDS, indirect=True)
@pytest.mark.parametrize("bk", [256, pytest.param(64, marks=pytest.mark.slow)])
def test_float16_gemm_accumulator_rounds_once_per_gemm(on_backend, bk):
    rng = np.random.RandomState(1)
    a = jnp.asarray(rng.randn(32, 256), jnp.float16)
    b = jnp.asarray(rng.randn(256, 32), jnp.float16)
    got = jax.jit(lambda a, b: _gemm_f16_acc(a, b, bk=bk))(a, b)
    reference = _gemm_f16_acc.reference(a, b, bk=bk)
    # independent formula: float32 products and sums, one float16 rounding per K step
    acc = np.zeros((32, 32), np.float16)
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    for k0 in range(0, 256, bk):
        acc = (acc.astype(np.float32) + a32[:, k0:k0 + bk] @ b32[k0:k0 + bk]).astype(np.float16)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    for result in (got, reference):
        # float32 sums in another order may land one float16 ulp away after the rounding
        assert _ulp_error(result, np.asarray(acc, np.float64), np.float16) <= 1
    if bk == 256:
        assert _ulp_error(got, exact, np.float16) <= 1         # was 8 ulp, rounding every k
        assert _ulp_error(jnp.dot(a, b), exact, np.float16) <= 1


def test_the_widening_is_in_the_neutral_ir():
    x = jax.ShapeDtypeStruct((2, 64), jnp.bfloat16)
    text = _running.lower(x, target="cpu").tile_ir
    assert "bfloat16" in text and "scan" in text
    for line in text.splitlines():
        if "= scan" in line or "= reduce" in line:
            assert "float32" in line and "bfloat16" not in line, line


def test_the_reference_accumulates_16_bit_sums_in_float32():
    # XLA:CPU's own bfloat16 scans and reductions round every step; the reference semantics
    # (kernel.reference, interpret mode) follow the rule the compiled kernels do.
    rng = np.random.RandomState(1)
    x = (1 + rng.randint(0, 4, size=(4, 96)) / 128).astype(ml_dtypes.bfloat16)
    x[:, 48:] = rng.uniform(0.5, 1.5, size=(4, 48))
    want = _rounded_once(x, ml_dtypes.bfloat16)
    for name, r, w in zip(("cumsum", "reverse cumsum", "cumprod", "sum"),
                          _running.reference(jnp.asarray(x)), want):
        np.testing.assert_array_equal(np.asarray(r, np.float32), np.asarray(w, np.float32),
                                      err_msg=name)
