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
    # Read again after its first copy out, the fragment stays a real buffer up to its last
    # use: only that (its loads, the store, the copy to `twice`) is forwarded, the store
    # going to the output and the fragment read as it is (the tail form).
    kernel = _cpu_ir(reread.lower(x))
    segment = forwarding.plan(kernel, kernel.body)
    (tail,) = segment.forwards
    assert tail.src is None and tail.dst.buffer == "out1" and len(segment.skip) == 1
    copies = [pos for pos, s in enumerate(kernel.body)
              if isinstance(s, ir.Op) and s.kind == "copy"]
    assert segment.skip == {copies[-1]} and segment.first > copies[1]


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
def relu_every_step(a, b, *, bm=16, bn=16, bk=8):
    """The accumulator's epilogue (relu, copy out) inside the K loop: every step starts
    from the relu of the last one, so the fragment must hold it (no tail form there)."""
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    j, i = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.loop(jt.cdiv(k, bk))
    def _(kk):
        jt.copy(a.at[i * bm, kk * bk], a_s)
        jt.copy(b.at[kk * bk, j * bn], b_s)
        jt.gemm(a_s, b_s, acc)
        acc[...] = jnp.maximum(acc[...], 0.0)
        jt.copy(acc, c.at[i * bm, j * bn])

    return c


def _tail_forwards(kernel):
    """The tail-form forwards (no copy in) of every statement list of ``kernel``."""
    lists = [kernel.body, *(blk for s in ir.walk(kernel.body) for blk in ir.blocks(s))]
    return [(stmts is kernel.body, f) for stmts in lists
            for f in getattr(forwarding.plan(kernel, stmts), "forwards", ())
            if f.src is None]


def test_an_accumulators_epilogue_is_forwarded_in_the_tail_form():
    """``relu(acc)`` stored into the accumulator and copied out becomes one store into the
    output: the accumulator the gemm filled is read as it is, the copy is left out."""
    a, b = jnp.zeros((100, 70), F32), jnp.zeros((70, 90), F32)
    kernel = _cpu_ir(jt.ops.matmul_relu.lower(a, b, bm=32, bn=32, bk=32))
    segment = forwarding.plan(kernel, kernel.body)
    (acc,) = [f for f in segment.forwards if f.src is None]
    assert acc.dst.buffer == "out0"
    copies = [pos for pos, s in enumerate(kernel.body) if isinstance(s, ir.Op)
              and s.kind == "copy" and s.attrs["src"].buffer == acc.fragment]
    assert segment.skip == set(copies)
    # In a loop, the statements before the segment run again after it (and the fragment is
    # filled outside the loop's body): no tail form.
    kernel = _cpu_ir(relu_every_step.lower(a, b))
    assert _tail_forwards(kernel) == []


@jt.kernel
def scaled_bias_relu(a, b, bias, *, bm=16, bn=16):
    """A store into the accumulator between the bias's copy in (where a segment starts) and
    the accumulator's last store: it must land in the accumulator, not the output."""
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    j, i = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a_s = jt.shared((bm, k), a.dtype)
    b_s = jt.shared((k, bn), b.dtype)
    bias_t = jt.fragment((bn,), jnp.float32)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)
    jt.copy(a.at[i * bm, 0], a_s)
    jt.copy(b.at[0, j * bn], b_s)
    jt.gemm(a_s, b_s, acc)
    jt.copy(bias.at[j * bn], bias_t)
    acc[...] = acc[...] * 2.0
    acc[...] = jnp.maximum(acc[...] + bias_t[...][None, :], 0.0)
    jt.copy(acc, c.at[i * bm, j * bn])
    return c


def test_a_store_inside_the_segment_keeps_the_accumulator(rng):
    a = data(rng, (37, 20), F32, edges=False)
    b = data(rng, (20, 45), F32, edges=False)
    bias = data(rng, (45,), F32, edges=False)
    kernel = _cpu_ir(scaled_bias_relu.lower(a, b, bias))
    assert not any(f.src is None for f in getattr(forwarding.plan(kernel, kernel.body),
                                                  "forwards", ()))
    want = np.maximum(2 * (np.asarray(a, np.float64) @ np.asarray(b, np.float64))
                      + np.asarray(bias, np.float64), 0.0)
    check(scaled_bias_relu, [a, b, bias], want.astype(np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mkn", [(32, 24, 32), (37, 29, 45)], ids=["even", "ragged"])
def test_a_per_step_epilogue_is_computed_every_step(rng, mkn):
    m, k, n = mkn
    a = data(rng, (m, k), F32, edges=False)
    b = data(rng, (k, n), F32, edges=False)
    want = np.zeros((m, n))
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    for k0 in range(0, k, 8):
        want = np.maximum(want + a64[:, k0:k0 + 8] @ b64[k0:k0 + 8], 0.0)
    check(relu_every_step, [a, b], want.astype(np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mkn", [(64, 32, 64), (70, 45, 50), (5, 3, 100)],
                         ids=["even", "ragged", "thin"])
def test_the_tail_forwarded_epilogue_matches_jnp(rng, mkn):
    """Blocks inside the output take the forwarded store, edge blocks (rows or columns
    past the end) the masked store or the statements as written; NaN and infinities
    pass through relu as jnp's maximum passes them."""
    m, k, n = mkn
    a = np.array(data(rng, (m, k), F32, edges=False))
    b = np.asarray(data(rng, (k, n), F32, edges=False))
    a[m - 1, 0], a[0, k - 1] = np.nan, np.inf
    with np.errstate(invalid="ignore"):       # inf * 0 in numpy's product: NaN, as wanted
        want = np.maximum(np.asarray(a, np.float64) @ b, 0.0)
    got = check(jt.ops.matmul_relu, [jnp.asarray(a), jnp.asarray(b)],
                want.astype(np.float32), dict(bm=32, bn=32, bk=32), rtol=1e-5, atol=1e-4)
    assert np.isnan(np.asarray(got)[m - 1]).all()


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
