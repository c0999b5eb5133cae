"""Loop-carried values and branch results in kernel bodies: ``lax.fori_loop`` / ``lax.scan``
/ ``lax.while_loop`` whose carry holds scalars and tiles, and ``lax.cond`` / ``lax.switch``
with operands and results, with static and traced bounds and predicates. Each kernel is
compared with its reference semantics and with an independent numpy formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxtile as jt

ROWS, COLS = 8, 16


def _check(got, ref, want, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(np.asarray(ref), want, rtol=rtol, atol=atol)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=rtol, atol=atol)


@jt.kernel
def _row_sums(x):
    """out[r] = sum of row r, one element per iteration into a scalar carry."""
    n, m = x.shape
    out = jt.empty((n,), jnp.float32)
    r = jt.grid(n)
    total = lax.fori_loop(0, m, lambda j, acc: acc + x[r, j], jnp.float32(0))
    out[jt.ds(r, 1)] = jnp.reshape(total, (1,))
    return out


def test_fori_loop_scalar_carry(rng):
    x = jnp.asarray(rng.standard_normal((5, 11)), jnp.float32)
    got = jax.jit(_row_sums)(x)
    _check(got, _row_sums.reference(x), np.asarray(x, np.float64).sum(axis=1))
    # The carry lives in a one-element local tile, loaded and stored around the body.
    text = _row_sums.lower(x).tile_ir
    assert "scratch carry0: local float32[1]" in text


@jt.kernel
def _online_softmax(x):
    """Softmax of each row block: a first loop over column tiles carries the running row
    max and the rescaled running sum (the online softmax), a second one writes."""
    n, m = x.shape
    out = jt.empty((n, m), jnp.float32)
    b = jt.grid(n // ROWS)
    rows = jt.ds(b * ROWS, ROWS)

    def stats(k, carry):
        m_i, l_i = carry
        tile = x[rows, jt.ds(k * COLS, COLS)]
        m_new = jnp.maximum(m_i, tile.max(axis=1))
        l_new = l_i * jnp.exp(m_i - m_new) + jnp.exp(tile - m_new[:, None]).sum(axis=1)
        return m_new, l_new

    init = (jnp.full((ROWS,), -jnp.inf, jnp.float32), jnp.zeros((ROWS,), jnp.float32))
    m_i, l_i = lax.fori_loop(0, m // COLS, stats, init)

    @jt.loop(m // COLS)
    def _(k):
        cols = jt.ds(k * COLS, COLS)
        out[rows, cols] = jnp.exp(x[rows, cols] - m_i[:, None]) / l_i[:, None]
    return out


def test_fori_loop_tile_carry_online_softmax(rng):
    x = jnp.asarray(rng.standard_normal((16, 48)) * 4, jnp.float32)
    got = jax.jit(_online_softmax)(x)
    xs = np.asarray(x, np.float64)
    e = np.exp(xs - xs.max(axis=1, keepdims=True))
    _check(got, _online_softmax.reference(x), e / e.sum(axis=1, keepdims=True), rtol=2e-5,
           atol=1e-7)
    text = _online_softmax.lower(x).tile_ir
    assert "scratch carry0: fragment float32[8]" in text


def test_carried_values_under_vmap(rng):
    x = jnp.asarray(rng.standard_normal((3, 16, 32)) * 4, jnp.float32)
    got = jax.jit(jax.vmap(_online_softmax))(x)
    _check(got, jax.vmap(_online_softmax.reference)(x), jax.nn.softmax(x, axis=-1),
           rtol=2e-5, atol=1e-7)


@jt.kernel
def _prefix_tiles(x, counts):
    """Block b sums the first counts[b] row tiles of x (a trip count read from an input,
    possibly zero), in a tile carry started from the block's own tile."""
    n, m = x.shape
    out = jt.empty((ROWS * counts.shape[0], m), jnp.float32)
    b = jt.grid(counts.shape[0])
    own = x[jt.ds((b % (n // ROWS)) * ROWS, ROWS), :]
    acc = lax.fori_loop(0, counts[b], lambda k, a: a + x[jt.ds(k * ROWS, ROWS), :], own)
    out[jt.ds(b * ROWS, ROWS), :] = acc
    return out


def test_fori_loop_traced_bound(rng):
    x = jnp.asarray(rng.standard_normal((32, 24)), jnp.float32)
    counts = jnp.asarray([3, 0, 4, 1, 2], jnp.int32)
    got = jax.jit(_prefix_tiles)(x, counts)
    tiles = np.asarray(x, np.float64).reshape(4, ROWS, 24)
    want = np.concatenate([tiles[b % 4] + tiles[:c].sum(axis=0)
                           for b, c in enumerate(np.asarray(counts))])
    _check(got, _prefix_tiles.reference(x, counts), want)


@jt.kernel
def _nested(x, *, outer, inner):
    """acc = sum over i of 0.5**(outer - i) * (sum over j of tile (i, j)): the outer loop's
    carry halves, the inner loop's carry starts from it."""
    _, m = x.shape
    out = jt.empty((ROWS, m), jnp.float32)
    jt.grid(1)

    def outer_body(i, acc):
        def inner_body(j, a):
            return a + x[jt.ds((i * inner + j) * ROWS, ROWS), :]
        return lax.fori_loop(0, inner, inner_body, acc * 0.5)

    out[...] = lax.fori_loop(0, outer, outer_body, jnp.zeros((ROWS, m), jnp.float32))
    return out


def test_nested_fori_loops(rng):
    outer, inner = 3, 4
    x = jnp.asarray(rng.standard_normal((outer * inner * ROWS, 12)), jnp.float32)
    got = jax.jit(lambda v: _nested(v, outer=outer, inner=inner))(x)
    tiles = np.asarray(x, np.float64).reshape(outer, inner, ROWS, 12)
    want = np.zeros((ROWS, 12))
    for i in range(outer):
        want = want * 0.5 + tiles[i].sum(axis=0)
    _check(got, _nested.reference(x, outer=outer, inner=inner), want)


@jt.kernel
def _fibonacci(x, y, *, steps):
    """(a, b) -> (b, a + b) on tiles: each carried value is stored from the other's load."""
    out = jt.empty(x.shape, jnp.float32)
    jt.grid(1)
    a, _ = lax.fori_loop(0, steps, lambda _, c: (c[1], c[0] + c[1]), (x[...], y[...]))
    out[...] = a
    return out


def test_carried_values_that_swap(rng):
    x = jnp.asarray(rng.standard_normal((4, 8)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((4, 8)), jnp.float32)
    got = jax.jit(lambda u, v: _fibonacci(u, v, steps=7))(x, y)
    a, b = np.asarray(x, np.float64), np.asarray(y, np.float64)
    for _ in range(7):
        a, b = b, a + b
    _check(got, _fibonacci.reference(x, y, steps=7), a)


@jt.kernel
def _scan_doubling(x, *, length):
    """``lax.scan`` with xs=None and a carry that is not a counter."""
    out = jt.empty(x.shape, jnp.float32)
    jt.grid(1)
    out[...] = lax.scan(lambda c, _: (c * 2 + 1, None), x[...], length=length)[0]
    return out


def test_scan_without_xs(rng):
    x = jnp.asarray(rng.standard_normal((4, 8)), jnp.float32)
    got = jax.jit(lambda v: _scan_doubling(v, length=5))(x)
    _check(got, _scan_doubling.reference(x, length=5), np.asarray(x) * 32 + 31)


@jt.kernel
def _counters(x, *, length):
    """Carries that step by one but are not a loop index: a float scalar (which also
    offsets the tile) and an integer tile."""
    out = jt.empty(x.shape, jnp.float32)
    jt.grid(1)

    def step(c, _):
        f, t = c
        return (f + 1, t + 1), None
    (f, t), _ = lax.scan(step, (jnp.float32(0.5), x[...].astype(jnp.int32)), length=length)
    out[...] = t.astype(jnp.float32) + f
    return out


def test_scan_whose_first_carry_steps_by_one_but_is_no_index():
    x = jnp.asarray(np.arange(-8, 8).reshape(2, 8), jnp.float32)
    got = jax.jit(lambda v: _counters(v, length=3))(x)
    _check(got, _counters.reference(x, length=3), np.asarray(x) + 3 + 3.5)


@jt.kernel
def _cond_rows(x):
    """Each row block is doubled where its sum is positive, else negated and shifted by its
    max: a traced (data-dependent) predicate with tile operands and results."""
    n, m = x.shape
    out = jt.empty((n, m), jnp.float32)
    b = jt.grid(n // ROWS)
    rows = jt.ds(b * ROWS, ROWS)
    tile = x[rows, :]
    out[rows, :] = lax.cond(tile.sum() > 0, lambda t, s: t * s,
                            lambda t, s: t.max() - t, tile, jnp.float32(2))
    return out


def test_cond_with_tile_operands_and_results(rng):
    signs = np.array([1, -1, -1, 1, 1, -1]).repeat(ROWS)[:, None]
    x = jnp.asarray((rng.standard_normal((48, 8)) + 1) * signs, jnp.float32)
    got = jax.jit(_cond_rows)(x)
    tiles = np.asarray(x, np.float64).reshape(6, ROWS, 8)
    want = np.concatenate([t * 2 if t.sum() > 0 else t.max() - t for t in tiles])
    assert 0 < sum(t.sum() > 0 for t in tiles) < 6  # both branches run
    _check(got, _cond_rows.reference(x), want)
    # Each branch stores the whole result, so no zero fill of its buffer is needed.
    assert _cond_rows.lower(x).tile_ir.count("{dst=carry0[0:+8, 0:+8]}") == 2


@jt.kernel
def _switch_rows(x):
    """Row block b takes branch b % 3 of a three-way lax.switch (its result a tile and a
    scalar)."""
    n, m = x.shape
    out = jt.empty((n, m), jnp.float32)
    b = jt.grid(n // ROWS)
    rows = jt.ds(b * ROWS, ROWS)
    tile, scale = lax.switch(b % 3, [lambda t: (t, jnp.float32(1)),
                                     lambda t: (t * t, jnp.float32(2)),
                                     lambda t: (-t, t.min())], x[rows, :])
    out[rows, :] = tile * scale
    return out


def test_switch_three_branches(rng):
    x = jnp.asarray(rng.standard_normal((40, 8)), jnp.float32)
    got = jax.jit(_switch_rows)(x)
    tiles = np.asarray(x, np.float64).reshape(5, ROWS, 8)
    want = np.concatenate([[t, 2 * t * t, -t * t.min()][b % 3] for b, t in enumerate(tiles)])
    _check(got, _switch_rows.reference(x), want)


def _collatz(v):
    """(steps to reach 1, largest value on the way) of the Collatz sequence from v."""
    def body(c):
        n, k, top = c
        n = lax.cond(n % 2 == 0, lambda u: u // 2, lambda u: 3 * u + 1, n)
        return n, k + 1, jnp.maximum(top, n)
    _, steps, top = lax.while_loop(lambda c: c[0] != 1, body, (v, jnp.int32(0), v))
    return steps, top


@jt.kernel
def _collatz_kernel(x):
    """A while_loop with scalar carries (one changed in a lax.cond) and a data-dependent
    trip count."""
    (n,) = x.shape
    steps = jt.empty((n,), jnp.int32)
    tops = jt.empty((n,), jnp.int32)
    r = jt.grid(n)
    k, top = _collatz(x[r])
    steps[jt.ds(r, 1)] = jnp.reshape(k, (1,))
    tops[jt.ds(r, 1)] = jnp.reshape(top, (1,))
    return steps, tops


def _collatz_numpy(v):
    steps, top = 0, v
    while v != 1:
        v = v // 2 if v % 2 == 0 else 3 * v + 1
        steps, top = steps + 1, max(top, v)
    return steps, top


def test_while_loop_with_scalar_carries():
    x = jnp.asarray([1, 2, 3, 6, 7, 27, 97], jnp.int32)
    got = jax.jit(_collatz_kernel)(x)
    want = np.asarray([_collatz_numpy(int(v)) for v in x]).T
    ref = _collatz_kernel.reference(x)
    for g, r, w in zip(got, ref, want):
        np.testing.assert_array_equal(np.asarray(r), w)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))


@jt.kernel
def _grow(x, *, limit):
    """Double each row block until its largest magnitude reaches ``limit``: a while_loop
    carrying a tile and a counter."""
    n, m = x.shape
    out = jt.empty((n, m), jnp.float32)
    doublings = jt.empty((n // ROWS,), jnp.int32)
    b = jt.grid(n // ROWS)
    rows = jt.ds(b * ROWS, ROWS)
    k, tile = lax.while_loop(lambda c: jnp.abs(c[1]).max() < limit,
                             lambda c: (c[0] + 1, c[1] * 2), (jnp.int32(0), x[rows, :]))
    out[rows, :] = tile
    doublings[jt.ds(b, 1)] = jnp.reshape(k, (1,))
    return out, doublings


def test_while_loop_with_tile_carry(rng):
    x = jnp.asarray(rng.uniform(-1, 1, (32, 8)) * np.array([1e-3, 1, 0.1, 30])
                    .repeat(ROWS)[:, None], jnp.float32)
    got = jax.jit(lambda v: _grow(v, limit=10.0))(x)
    tiles = np.asarray(x, np.float64).reshape(4, ROWS, 8)
    ks = [int(max(0, np.ceil(np.log2(10.0 / np.abs(t).max())))) for t in tiles]
    want = (np.concatenate([t * 2.0 ** k for t, k in zip(tiles, ks)]), np.asarray(ks))
    ref = _grow.reference(x, limit=10.0)
    _check(got[0], ref[0], want[0])
    np.testing.assert_array_equal(np.asarray(ref[1]), want[1])
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(ref[1]))


@jt.kernel
def _double_until(x):
    """A whole tile doubled while its first element is below 10 (a condition on an element
    of the carried tile)."""
    out = jt.empty(x.shape, x.dtype)
    jt.grid(1)
    out[...] = lax.while_loop(lambda v: v[0] < 10, lambda v: v * 2, x[...])
    return out


def test_while_loop_condition_on_an_element_of_the_carry():
    x = jnp.asarray([0.3, -1.0, 2.0, 5.0], jnp.float32)
    got = jax.jit(_double_until)(x)
    _check(got, _double_until.reference(x), np.asarray(x) * 64)  # 0.3 * 2**6 = 19.2


@jt.kernel
def _scan_with_xs(x):
    out = jt.empty(x.shape[1:], jnp.float32)
    jt.grid(1)
    out[...] = lax.scan(lambda c, row: (c + row, None), jnp.zeros(x.shape[1:]), x[...])[0]
    return out


def test_scan_over_xs_is_a_clear_error():
    x = jnp.ones((4, 8), jnp.float32)
    with pytest.raises(jt.KernelError, match=r"lax.scan over arrays \(xs\).*"
                       r"test_language_carry.py:\d+"):
        _scan_with_xs(x)


BQ, BK, D = 8, 8, 16


@jt.kernel
def _attention(q, k, v):
    """Attention as Pallas' flash-attention kernel writes it: a fori_loop over key blocks
    carrying the output tile and the running row max and sum (o, m_i, l_i); products of
    tiles are broadcast multiplies summed over the shared axis."""
    n, _ = q.shape
    out = jt.empty(q.shape, jnp.float32)
    b = jt.grid(n // BQ)
    qt = q[jt.ds(b * BQ, BQ), :]

    def body(j, carry):
        o, m_i, l_i = carry
        kt, vt = k[jt.ds(j * BK, BK), :], v[jt.ds(j * BK, BK), :]
        s = (qt[:, None, :] * kt[None, :, :]).sum(axis=2)
        m_new = jnp.maximum(m_i, s.max(axis=1))
        alpha = jnp.exp(m_i - m_new)
        p = jnp.exp(s - m_new[:, None])
        o = o * alpha[:, None] + (p[:, :, None] * vt[None, :, :]).sum(axis=1)
        return o, m_new, l_i * alpha + p.sum(axis=1)

    init = (jnp.zeros((BQ, D), jnp.float32), jnp.full((BQ,), -jnp.inf, jnp.float32),
            jnp.zeros((BQ,), jnp.float32))
    o, _, l_i = lax.fori_loop(0, k.shape[0] // BK, body, init)
    out[jt.ds(b * BQ, BQ), :] = o / l_i[:, None]
    return out


def test_attention_carrying_output_max_and_sum(rng):
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32)
               for s in ((16, D), (24, D), (24, D)))
    got = jax.jit(_attention)(q, k, v)
    s = np.asarray(q, np.float64) @ np.asarray(k, np.float64).T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = (p / p.sum(axis=1, keepdims=True)) @ np.asarray(v, np.float64)
    _check(got, _attention.reference(q, k, v), want, rtol=2e-5, atol=2e-6)
