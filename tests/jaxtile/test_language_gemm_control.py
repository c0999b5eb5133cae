"""The tile language on the CPU: jt.gemm, control flow, outputs and specialisations.

Shared helpers and the testing approach: ``language_helpers``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from language_helpers import BF16, BOOL, F32, I32, RAGGED, check, data, map1

import jaxtile as jt

# --- jt.gemm -------------------------------------------------------------------------------

@jt.kernel
def gemm_k(a, b, *, ta=False, tb=False, bm=16, bn=16, bk=8, acc_dtype=jnp.float32):
    """c = op(a) @ op(b), tiled, with operands stored transposed when asked."""
    M, K = a.shape[::-1] if ta else a.shape
    N = b.shape[0] if tb else b.shape[1]
    c = jt.empty((M, N), acc_dtype)
    bx, by = jt.grid(jt.cdiv(N, bn), jt.cdiv(M, bm))
    a_s = jt.shared((bk, bm) if ta else (bm, bk), a.dtype)
    b_s = jt.shared((bn, bk) if tb else (bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), acc_dtype)
    acc[...] = jnp.zeros((bm, bn), acc_dtype)

    @jt.pipelined(jt.cdiv(K, bk), stages=2)
    def _(k):
        jt.copy(a.at[k * bk, by * bm] if ta else a.at[by * bm, k * bk], a_s)
        jt.copy(b.at[bx * bn, k * bk] if tb else b.at[k * bk, bx * bn], b_s)
        jt.gemm(a_s, b_s, acc, transpose_a=ta, transpose_b=tb)

    jt.copy(acc, c.at[by * bm, bx * bn])
    return c


def _exact_matmul(a, b, ta, tb):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a.T if ta else a) @ (b.T if tb else b)


@pytest.mark.parametrize("mkn,ta,tb", [
    ((20, 19, 27), True, False), ((20, 19, 27), False, True), ((20, 19, 27), True, True),
], ids=["ragged-aT", "ragged-bT", "ragged-aT-bT"])
def test_gemm_transposes_f32(rng, mkn, ta, tb):
    m, k, n = mkn
    a = data(rng, (k, m) if ta else (m, k), F32, edges=False)
    b = data(rng, (n, k) if tb else (k, n), F32, edges=False)
    want = jnp.matmul(a.T if ta else a, b.T if tb else b, precision=lax.Precision.HIGHEST)
    got = check(gemm_k, [a, b], want, {"ta": ta, "tb": tb}, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got, np.float64), _exact_matmul(a, b, ta, tb),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,ta,tb", [(BF16, True, True)], ids=["bf16-aT-bT"])
def test_gemm_half_operands_accumulate_in_f32(rng, dtype, ta, tb):
    m, k, n = 20, 40, 27
    a = data(rng, (k, m) if ta else (m, k), dtype, edges=False)
    b = data(rng, (n, k) if tb else (k, n), dtype, edges=False)
    exact = _exact_matmul(a, b, ta, tb)
    # Products of half-precision values are exact in float32; only the sums round.
    got = check(gemm_k, [a, b], exact.astype(F32), {"ta": ta, "tb": tb}, rtol=1e-5,
                atol=1e-4)
    assert got.dtype == F32


def test_gemm_int32_is_exact(rng):
    a = data(rng, (20, 19), I32, low=-5)
    b = data(rng, (19, 27), I32, low=-5)
    check(gemm_k, [a, b], a @ b, {"acc_dtype": jnp.int32})


# Fragments larger than the CPU's register tiles (4 rows x 2 vectors: 32 columns with
# AVX-512, 16 with AVX2), with rows and columns left over: 18 = 4 * 4 + 2 rows, 80 and 70
# columns (vectorised and serial leftovers), over shapes that do not divide the tiles.
@pytest.mark.parametrize("tiles", [(18, 80), (20, 70)], ids=["18x80", "20x70"])
@pytest.mark.parametrize("dtype,ta,tb", [(F32, False, False), (F32, True, True),
                                         (BF16, False, True), (I32, False, False)],
                         ids=["f32", "f32-aT-bT", "bf16-bT", "i32"])
def test_gemm_register_tiles_and_leftovers(rng, tiles, dtype, ta, tb):
    m, k, n = 45, 19, 150
    bm, bn = tiles
    if dtype == I32:
        a = data(rng, (m, k), I32, low=-5)
        b = data(rng, (k, n), I32, low=-5)
        check(gemm_k, [a, b], a @ b, {"acc_dtype": jnp.int32, "bm": bm, "bn": bn})
        return
    a = data(rng, (k, m) if ta else (m, k), dtype, edges=False)
    b = data(rng, (n, k) if tb else (k, n), dtype, edges=False)
    exact = _exact_matmul(a, b, ta, tb)
    check(gemm_k, [a, b], exact.astype(F32), {"ta": ta, "tb": tb, "bm": bm, "bn": bn},
          rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("vector_bits", [128, 256, 512])
def test_each_vector_width(rng, monkeypatch, vector_bits):
    # Register tiles, vectorised loops and reduction lanes follow the target's vector
    # registers; code for narrower ones runs here too, so each width is compiled and
    # checked on this machine: a gemm, and a softmax (row reductions, exp, division) over
    # rows of 1000 (not a multiple of any vector) and 40 (a multiple of 8, not of 16).
    from jaxtile.compiler import target

    monkeypatch.setattr(target, "_cpu_vector_bits", lambda: vector_bits)
    assert target.parse_target("cpu").caps.vector_bits == vector_bits
    fresh = jt.kernel(gemm_k.fn, name=f"gemm_{vector_bits}")
    a = data(rng, (45, 19), F32, edges=False)
    b = data(rng, (19, 150), F32, edges=False)
    check(fresh, [a, b], _exact_matmul(a, b, False, False).astype(F32),
          {"bm": 18, "bn": 80}, rtol=1e-5, atol=1e-4)
    softmax = jt.kernel(jt.ops.softmax.fn, name=f"softmax_{vector_bits}")
    for cols, block_cols in ((1000, None), (40, 40)):
        x = data(rng, (13, cols), F32, edges=False)
        check(softmax, [x], jax.nn.softmax(x, axis=-1), {"block_cols": block_cols},
              rtol=2e-6, atol=1e-7)


@jt.kernel
def two_gemms(a1, b1, a2, b2, *, bm=16, bn=16, bk=8):
    """acc = a1 @ b1 + a2 @ b2.T, both accumulated into one fragment inside @jt.loop."""
    M, K = a1.shape
    N = b1.shape[1]
    c = jt.empty((M, N), jnp.float32)
    bx, by = jt.grid(jt.cdiv(N, bn), jt.cdiv(M, bm))
    a_s = jt.shared((bm, bk), a1.dtype)
    b_s = jt.shared((bk, bn), b1.dtype)
    a2_s = jt.fragment((bm, bk), a2.dtype)
    b2_s = jt.local((bn, bk), b2.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.loop(jt.cdiv(K, bk))
    def _(k):
        jt.copy(a1.at[by * bm, k * bk], a_s)
        jt.copy(b1.at[k * bk, bx * bn], b_s)
        jt.gemm(a_s, b_s, acc)
        jt.copy(a2.at[by * bm, k * bk], a2_s)
        jt.copy(b2.at[bx * bn, k * bk], b2_s)
        jt.gemm(a2_s, b2_s, acc, transpose_b=True)

    jt.copy(acc, c.at[by * bm, bx * bn])
    return c


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_multiple_gemms_accumulate_in_a_loop(rng, dtype):
    m, k, n = 20, 21, 18
    a1, a2 = data(rng, (m, k), dtype, edges=False), data(rng, (m, k), dtype, edges=False)
    b1, b2 = data(rng, (k, n), dtype, edges=False), data(rng, (n, k), dtype, edges=False)
    exact = _exact_matmul(a1, b1, False, False) + _exact_matmul(a2, b2, False, True)
    check(two_gemms, [a1, b1, a2, b2], exact.astype(F32), rtol=1e-5, atol=1e-4)


# --- control flow --------------------------------------------------------------------------

@jt.kernel
def row_sums(x, *, bk=8, rows=4, start=0, kind="loop", stages=2, unroll=False):
    """Row sums over column tiles [start, cdiv(n, bk)) accumulated in a fragment."""
    m, n = x.shape
    nk = jt.cdiv(n, bk)
    out = jt.empty((m, 1), x.dtype)
    r = jt.grid(jt.cdiv(m, rows))
    t = jt.shared((rows, bk), x.dtype)
    acc = jt.fragment((rows, 1), x.dtype)
    acc[...] = jnp.zeros((rows, 1), x.dtype)

    def body(k):
        jt.copy(x.at[r * rows, k * bk], t)
        acc[...] += jnp.sum(t[...], axis=1, keepdims=True)

    if kind == "pipelined":
        jt.pipelined(nk - start, stages=stages)(lambda k: body(k + start))
    elif start:
        jt.loop(start, nk, unroll=unroll)(body)
    else:
        jt.loop(nk, unroll=unroll)(body)
    jt.copy(acc, out.at[r * rows, 0])
    return out


LOOP_VARIANTS = {
    "loop_start_stop-i32": (I32, {"start": 2}),
    "unrolled-f32": (F32, {"unroll": True}),
    "pipelined3-f32": (F32, {"kind": "pipelined", "stages": 3}),
    "pipelined_start-i32": (I32, {"kind": "pipelined", "stages": 2, "start": 1}),
}


@pytest.mark.parametrize("variant", list(LOOP_VARIANTS))
def test_loops_accumulate_in_fragments(rng, variant):
    dtype, p = LOOP_VARIANTS[variant]
    x = data(rng, (10, 37), dtype, edges=False)
    start = p.get("start", 0)
    want = jnp.sum(x[:, start * 8:], axis=1, keepdims=True)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == F32 else {}
    check(row_sums, [x], want, p, **tol)


@jt.kernel
def nested(x, *, bj=4):
    """Nested loops: out = sum_i sum_j x[i, j*bj:(j+1)*bj] * (i + 1) * (j + 1)."""
    m, n = x.shape
    out = jt.empty((bj,), x.dtype)
    acc = jt.fragment((bj,), x.dtype)
    acc[...] = jnp.zeros((bj,), x.dtype)

    @jt.loop(m)
    def _(i):
        @jt.loop(n // bj)
        def _(j):
            w = ((i + 1) * (j + 1)).astype(x.dtype)
            acc[...] += x[i, jt.ds(j * bj, bj)] * w

    out[...] = acc[...]
    return out


@pytest.mark.parametrize("dtype", [I32, F32], ids=["i32", "f32"])
def test_nested_loops(rng, dtype):
    x = data(rng, (5, 12), dtype, edges=False)
    w = (jnp.arange(5)[:, None, None] + 1) * (jnp.arange(3)[None, :, None] + 1)
    want = jnp.sum(x.reshape(5, 3, 4) * w.astype(dtype), axis=(0, 1))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == F32 else {}
    check(nested, [x], want, **tol)


@jt.kernel
def guarded(x, s, *, b=8):
    """@jt.when on the block index (first/last block write flags), on the loop index
    (initialise a running max on the first tile) and on data (negate some rows)."""
    m, n = x.shape
    nb = jt.cdiv(m, b)
    i = jt.grid(nb)
    flags = jt.empty((2,), jnp.int32)
    rowmax = jt.empty((m,), x.dtype)
    signed = jt.empty((m, n), x.dtype)

    @jt.when(i == 0)
    def _():
        flags[0] = jnp.int32(11)

    @jt.when(i == nb - 1)
    def _():
        flags[1] = (i + 1) * 100

    run_max = jt.fragment((b,), x.dtype)
    t = jt.fragment((b, 4), x.dtype)

    @jt.loop(n // 4)
    def _(k):
        jt.copy(x.at[i * b, k * 4], t)
        tile_max = jnp.max(t[...], axis=1)

        @jt.when(k == 0)
        def _():
            run_max[...] = tile_max

        @jt.when(k > 0)
        def _():
            run_max[...] = jnp.maximum(run_max[...], tile_max)

    jt.copy(run_max, rowmax.at[i * b])

    @jt.loop(b)
    def _(r):
        row = jnp.minimum(i * b + r, m - 1)

        @jt.when(s[row] > 0)
        def _():
            signed[row, :] = x[row, :]

        @jt.when(s[row] <= 0)
        def _():
            signed[row, :] = -x[row, :]

    @jt.when(True)
    def _():
        pass

    @jt.when(False)
    def _():
        flags[0] = jnp.int32(-5)

    return flags, rowmax, signed


@pytest.mark.parametrize("m", [13])
def test_when(rng, m):
    n = 12
    x = data(rng, (m, n), F32, edges=False)
    s = data(rng, (m,), I32)
    nb = -(-m // 8)
    want = (jnp.asarray([11, nb * 100], I32), jnp.max(x, axis=1),
            jnp.where((s > 0)[:, None], x, -x))
    check(guarded, [x, s], want, signed_zeros=True)


@jt.kernel
def grid3(x, *, bm=4, bn=8):
    """A 3-D grid over (N tiles, M tiles, batch); each block also writes its block ids."""
    B, M, N = x.shape
    bx, by, bz = jt.grid(jt.cdiv(N, bn), jt.cdiv(M, bm), B)
    out = jt.empty((B, M, N), x.dtype)
    ids = jt.empty((B, jt.cdiv(M, bm), jt.cdiv(N, bn)), jnp.int32)
    t = jt.fragment((bm, bn), x.dtype)
    jt.copy(x.at[bz, by * bm, bx * bn], t)
    t[...] = t[...] + (bz * 100 + by * 10 + bx).astype(x.dtype)
    jt.copy(t, out.at[bz, by * bm, bx * bn])
    ids[bz, by, bx] = bz * 100 + by * 10 + bx
    return out, ids


@pytest.mark.parametrize("shape", [(3, 7, 19)])
def test_3d_grid(rng, shape):
    B, M, N = shape
    x = data(rng, shape, F32, edges=False)
    gm, gn = -(-M // 4), -(-N // 8)
    blk = (jnp.arange(B)[:, None, None] * 100 + jnp.arange(gm)[None, :, None] * 10
           + jnp.arange(gn)[None, None, :]).astype(I32)
    per_elem = jnp.repeat(jnp.repeat(blk, 4, axis=1), 8, axis=2)[:, :M, :N]
    check(grid3, [x], (x + per_elem.astype(F32), blk))


# --- outputs and specialisations -----------------------------------------------------------

@jt.kernel
def three_outputs(x, *, b=8):
    """Three outputs of different dtypes, created in one order and returned in another."""
    (n,) = x.shape
    first = jt.empty((n,), jnp.int32)
    second = jt.empty((n,), x.dtype)
    third = jt.empty((n,), jnp.bool_)
    i = jt.grid(jt.cdiv(n, b))
    t = jt.fragment((b,), x.dtype)
    jt.copy(x.at[i * b], t)
    v = t[...]
    o1 = jt.fragment((b,), jnp.int32)
    o1[...] = jnp.floor(v).astype(jnp.int32)
    o3 = jt.fragment((b,), jnp.bool_)
    o3[...] = v > 0
    t[...] = v * v
    jt.copy(o1, first.at[i * b])
    jt.copy(t, second.at[i * b])
    jt.copy(o3, third.at[i * b])
    return third, (first, second)


@pytest.mark.parametrize("n", [21])
def test_multiple_outputs_in_another_order(rng, n):
    x = data(rng, (n,), F32, edges=False)
    third, (first, second) = check(three_outputs, [x],
                                   (x > 0, (jnp.floor(x).astype(I32), x * x)))
    assert (third.dtype, first.dtype, second.dtype) == (BOOL, I32, F32)


def _twice_minus_one(v):
    return v * 2 - 1


def test_specialisations_per_shape_and_params(rng):
    """One kernel, several shapes/dtypes/params: each call gets its own specialisation."""
    fns = (_twice_minus_one,)
    calls = [((13, 37), F32, {}), ((16, 32), F32, {"rows": 4}),
             ((5, 3), BF16, {"rows": 2, "cols": 2}), ((13, 37), F32, {})]
    keys = []
    for shape, dtype, p in calls:
        x = data(rng, shape, dtype)
        check(map1, [x], (x * 2 - 1,), {"fns": fns, **p}, signed_zeros=True)
        keys.append(map1.lower(jax.ShapeDtypeStruct(shape, dtype), fns=fns, **p).key)
    assert len(set(keys)) == 3 and keys[0] == keys[-1]


def test_kernel_inside_a_larger_jit(rng):
    x = data(rng, RAGGED, F32, edges=False)

    @jax.jit
    def f(x):
        (y,) = map1(x * 2, fns=(jnp.tanh,))
        (z,) = map1(y, fns=(_twice_minus_one,))
        return z.sum() + map1(x, fns=(jnp.tanh,), rows=4)[0].sum()

    want = (jnp.tanh(x * 2) * 2 - 1).sum() + jnp.tanh(x).sum()
    np.testing.assert_allclose(f(x), want, rtol=1e-5)
