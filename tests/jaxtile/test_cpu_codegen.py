"""CPU code generation for kernels written the plain way: copies forwarded through staging
fragments (``compiler/cpu/forwarding.py``) and GEMM loops coarsened into panels
(``compiler/passes/gemm_panels.py``). Each path is checked for what it generates and, on
shapes that do and do not divide the tiles, against the reference semantics and a numpy
formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemm_kernels import matmul
from language_helpers import BF16, F32, check, data

import jaxtile as jt
from jaxtile.compiler import build, ir
from jaxtile.compiler.cpu import forwarding
from jaxtile.compiler.target import parse_target


def _cpu_ir(lowered):
    return build.lowered_ir(lowered.kernel, parse_target("cpu"))


@jt.kernel
def bias_gelu(x, b, *, bm=8, bn=16, out_dtype=None):
    out = jt.empty(x.shape, out_dtype or x.dtype)
    j, i = jt.grid(jt.cdiv(x.shape[1], bn), jt.cdiv(x.shape[0], bm))
    x_t = jt.fragment((bm, bn), jnp.float32)
    b_t = jt.fragment((bn,), jnp.float32)
    jt.copy(x.at[i * bm, j * bn], x_t)
    jt.copy(b.at[j * bn], b_t)
    x_t[...] = jax.nn.gelu(x_t[...] + b_t[...][None, :])
    jt.copy(x_t, out.at[i * bm, j * bn])
    return out


@jt.kernel
def reread(x, *, bm=8, bn=16):
    """The fragment is read again after it is copied out: it must stay a real buffer."""
    out = jt.empty(x.shape, x.dtype)
    twice = jt.empty(x.shape, x.dtype)
    j, i = jt.grid(jt.cdiv(x.shape[1], bn), jt.cdiv(x.shape[0], bm))
    t = jt.fragment((bm, bn), x.dtype)
    jt.copy(x.at[i * bm, j * bn], t)
    t[...] = t[...] * 3.0
    jt.copy(t, out.at[i * bm, j * bn])
    t[...] = t[...] + t[...]
    jt.copy(t, twice.at[i * bm, j * bn])
    return out, twice


def test_forwarding_plans_the_staging_fragments_only():
    x = jnp.zeros((13, 37), jnp.float32)
    b = jnp.zeros((37,), jnp.float32)
    kernel = _cpu_ir(bias_gelu.lower(x, b))
    segment = forwarding.plan(kernel, kernel.body)
    assert segment is not None
    by_name = {f.fragment: f for f in segment.forwards}
    assert set(by_name) == {b.name for b in kernel.buffers if b.role == "scratch"}
    x_t = next(f for f in segment.forwards if f.dst is not None)
    assert (x_t.src.buffer, x_t.dst.buffer) == ("x", "out0")
    assert len(segment.skip) == 3            # both copies in, the copy out
    kernel = _cpu_ir(reread.lower(x))
    assert forwarding.plan(kernel, kernel.body) is None


@pytest.mark.parametrize("shape", [(13, 37), (16, 32)], ids=["ragged", "even"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_forwarded_elementwise_kernel_matches_jnp(rng, shape, dtype):
    x = data(rng, shape, dtype, edges=False)
    b = data(rng, shape[1:], dtype, edges=False)
    want = jax.nn.gelu(x.astype(jnp.float32) + b.astype(jnp.float32)).astype(dtype)
    tol = {"rtol": 2 ** -7, "atol": 1e-6} if dtype == BF16 else {"rtol": 1e-5, "atol": 1e-6}
    check(bias_gelu, [x, b], want, **tol)


def test_forwarding_keeps_a_fragment_that_is_read_after_its_copy_out(rng):
    x = data(rng, (13, 37), F32, edges=False)
    check(reread, [x], (x * 3.0, x * 6.0), rtol=1e-6, atol=0)


@jt.kernel
def normalise(x, *, bm=8, bn=16):
    """A scalar reduction between the copies: it needs the tile, so nothing is hoisted."""
    out = jt.empty(x.shape, x.dtype)
    j, i = jt.grid(jt.cdiv(x.shape[1], bn), jt.cdiv(x.shape[0], bm))
    t = jt.fragment((bm, bn), x.dtype)
    jt.copy(x.at[i * bm, j * bn], t)
    total = jnp.sum(t[...])
    t[...] = t[...] / total
    jt.copy(t, out.at[i * bm, j * bn])
    return out


def test_forwarding_leaves_a_scalar_reduction_of_the_tile_in_place(rng):
    x = jnp.asarray(np.abs(np.asarray(data(rng, (16, 32), F32, edges=False))) + 1.0)
    kernel = _cpu_ir(normalise.lower(x))
    assert forwarding.plan(kernel, kernel.body) is None
    tiles = np.asarray(x).reshape(2, 8, 2, 16)
    want = (tiles / tiles.sum(axis=(1, 3), keepdims=True)).reshape(16, 32)
    check(normalise, [x], want, rtol=1e-6, atol=0)


def _gemms(kernel):
    return [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op) and s.kind == "gemm"]


def test_gemm_panels_coarsen_the_k_loop_and_its_remainder():
    a = jnp.zeros((20, 5000), jnp.float32)
    kernel = _cpu_ir(matmul.lower(a, a.T, bn=16, bk=16))   # 313 steps of 16
    k_extents = [kernel.buffer(g.attrs["a"].buffer).shape[1] for g in _gemms(kernel)]
    assert k_extents == [256, 144]                      # 19 panels of 16 steps, one of 9
    assert {b.name for b in kernel.buffers if b.role == "scratch"} == {
        "frag0", "smem0_panel", "smem1_panel", "smem0_panel1", "smem1_panel1"}
    # All of K in one panel when both panels fit the budget (63 steps of 16 here).
    a = jnp.zeros((20, 1000), jnp.float32)
    kernel = _cpu_ir(matmul.lower(a, a.T, bn=16, bk=16))
    assert [kernel.buffer(g.attrs["a"].buffer).shape[1] for g in _gemms(kernel)] == [1008]
    # A loop that already takes K in one step is left alone.
    kernel = _cpu_ir(matmul.lower(a[:, :64], a[:, :64].T, bn=16, bk=64))
    assert [kernel.buffer(g.attrs["a"].buffer).shape[1] for g in _gemms(kernel)] == [64]


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_coarsened_gemm_matches_numpy_on_ragged_shapes(rng, dtype):
    m, k, n = 37, 300, 29                               # 38 steps of 8, one panel of all K
    a = data(rng, (m, k), dtype, edges=False)
    b = data(rng, (k, n), dtype, edges=False)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    got = check(matmul, [a, b], exact.astype(np.float32), {"bn": 16}, rtol=2e-5, atol=2e-4)
    # The panels add the products in the order the original loop did: bitwise the result
    # of one step over all of K.
    whole_k = jax.jit(lambda a, b: matmul(a, b, bn=16, bk=304))(a, b)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(whole_k))
