"""Device loops whose bounds are computed on the device: from block indices, from values
read from inputs, zero-trip and shorter than their pipeline."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt

ROWS = 8


@jt.kernel
def _prefix_blocks(x, *, pipelined=False, stages=3):
    """Row block b of the output is the sum of row blocks 0..b of x (a causal bound)."""
    n, m = x.shape
    out = jt.empty((n, m), jnp.float32)
    b = jt.grid(jt.cdiv(n, ROWS))
    acc = jt.fragment((ROWS, m), jnp.float32)
    tile = jt.fragment((ROWS, m), jnp.float32)
    acc[...] = jnp.zeros((ROWS, m), jnp.float32)
    stop = jnp.minimum(jt.cdiv(n, ROWS), b + 1)

    def body(k):
        jt.copy(x.at[k * ROWS, 0], tile)
        acc[...] += tile[...]

    if pipelined:
        jt.pipelined(stop, stages=stages)(body)
    else:
        jt.loop(0, stop)(body)
    jt.copy(acc, out.at[b * ROWS, 0])
    return out


def _prefix_reference(x):
    x = np.asarray(x, np.float64)
    n = x.shape[0]
    blocks = [x[i:i + ROWS] for i in range(0, n, ROWS)]
    out = np.zeros_like(x)
    for b in range(len(blocks)):
        total = sum(np.pad(blk, ((0, ROWS - len(blk)), (0, 0))) for blk in blocks[:b + 1])
        out[b * ROWS:(b + 1) * ROWS] = total[:len(blocks[b])]
    return out


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("n", [8, 29, 64])
def test_loop_bound_from_the_block_index(rng, n, pipelined):
    x = jnp.asarray(rng.standard_normal((n, 24)), jnp.float32)
    got = jax.jit(lambda v: _prefix_blocks(v, pipelined=pipelined))(x)
    np.testing.assert_allclose(got, _prefix_reference(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_prefix_blocks.reference(x, pipelined=pipelined), got,
                               rtol=1e-6, atol=1e-6)
    text = _prefix_blocks.lower(x, pipelined=pipelined).tile_ir
    # The bound is computed on the device, except with one block (n <= ROWS): then it is
    # the constant 1, which canonicalisation makes static.
    extent = "+%" if n > ROWS else "+1"
    assert f"pipelined(0, {extent}" in text if pipelined else f"serial(0, {extent}" in text


@jt.kernel
def _sum_first(x, lens):
    """out[r] = sum of x[r, :lens[r]] for each row r: the trip count is read from an input,
    and may be zero or beyond the row (the copy's edge rule reads zeros there)."""
    n, m = x.shape
    out = jt.empty((n,), jnp.float32)
    r = jt.grid(n)
    acc = jt.local((1,), jnp.float32)
    col = jt.fragment((1, 1), jnp.float32)
    acc[...] = jnp.zeros((1,), jnp.float32)

    @jt.loop(lens[r])
    def _(j):
        jt.copy(x.at[r, j], col)
        acc[...] += col[0]

    out[jt.ds(r, 1)] = acc[...]
    return out


def test_trip_count_read_from_an_input(rng):
    x = jnp.asarray(rng.standard_normal((6, 10)), jnp.float32)
    lens = jnp.array([0, 1, 10, 3, -2, 14], jnp.int32)
    expected = [float(np.sum(np.asarray(x)[i, :max(0, min(int(k), 10))]))
                for i, k in enumerate(lens)]
    np.testing.assert_allclose(jax.jit(_sum_first)(x, lens), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_sum_first.reference(x, lens), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [3, 5])
def test_pipelined_trip_count_below_its_stages(rng, n):
    # a single row block: the trip count min(1, b + 1) = 1 is below the 4 stages
    x = jnp.asarray(rng.standard_normal((n, 16)), jnp.float32)
    got = jax.jit(lambda v: _prefix_blocks(v, pipelined=True, stages=4))(x)
    np.testing.assert_allclose(got, np.asarray(x), rtol=1e-6)


def test_unrolled_loops_need_static_bounds():
    @jt.kernel
    def k(x):
        out = jt.empty(x.shape, x.dtype)
        b = jt.grid(1)

        @jt.loop(b + 2, unroll=True)
        def _(i):
            out[...] = x[...]
        return out

    with pytest.raises(jt.KernelError, match=r"unroll=True\) needs static"):
        k.lower(jnp.ones((4,)))


def test_loop_bounds_must_be_integer_scalars():
    @jt.kernel
    def k(x):
        out = jt.empty(x.shape, x.dtype)
        jt.grid(1)

        @jt.loop(x[0])
        def _(i):
            out[...] = x[...]
        return out

    with pytest.raises(jt.KernelError, match="loop bounds must be ints or integer scalars"):
        k.lower(jnp.ones((4,)))


@jt.kernel
def _first_negative(x, *, rows=8):
    """Per row, the index of its first negative element (the row length if none): a loop
    on a condition that reads the data."""
    n, m = x.shape
    out = jt.empty((n,), jnp.int32)
    r = jt.grid(jt.cdiv(n, rows))
    t = jt.fragment((rows, m), x.dtype)
    jt.copy(x.at[r * rows, 0], t, pad=-1)
    res = jt.fragment((rows,), jnp.int32)
    i = jt.local((1,), jnp.int32)

    @jt.loop(rows)
    def _(k):
        i[0] = 0

        @jt.while_(lambda: (i[0] < m) & (t[k, jnp.minimum(i[0], m - 1)] >= 0))
        def _():
            i[0] += 1

        res[k] = i[0]

    jt.copy(res, out.at[r * rows])
    return out


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape", [(13, 10), (16, 7)])
def test_while_on_a_condition_computed_on_the_device(rng, dtype, shape):
    x = np.asarray(rng.standard_normal(shape) + 1.2, dtype)
    x[0, 0] = -1.0                    # a loop with no iteration
    x[1, :] = 1.0                     # one that runs to the row's end
    want = np.array([np.argmax(row < 0) if (row < 0).any() else len(row)
                     for row in x.astype(np.float32)])
    got = jax.jit(_first_negative)(jnp.asarray(x))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_first_negative.reference(jnp.asarray(x)), want)


@jt.kernel
def _collatz_steps(x):
    """Steps of the Collatz map from each x[b] down to 1: a while with a branch inside,
    whose trip count differs from block to block."""
    out = jt.empty(x.shape, jnp.int32)
    b = jt.grid(x.shape[0])
    v = jt.local((1,), jnp.int32)
    steps = jt.local((1,), jnp.int32)
    v[0] = x[b]
    steps[0] = 0

    @jt.while_(lambda: v[0] > 1)
    def _():
        odd = v[0] % 2                  # read once: both branches test the same parity

        @jt.when(odd == 0)
        def _():
            v[0] = v[0] // 2

        @jt.when(odd == 1)
        def _():
            v[0] = 3 * v[0] + 1

        steps[0] += 1

    out[b] = steps[0]
    return out


def _collatz(n):
    steps = 0
    while n > 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def test_while_with_a_data_dependent_trip_count_per_block():
    x = np.array([1, 2, 3, 6, 7, 27, 97, 0, -5], np.int32)
    want = [_collatz(int(n)) for n in x]
    assert want[5] == 111                # 27 takes 111 steps
    got = jax.jit(_collatz_steps)(jnp.asarray(x))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_collatz_steps.reference(jnp.asarray(x)), want)


def test_while_ir_round_trips_and_bad_conditions_are_errors():
    from jaxtile.compiler import parser, printer
    k = _first_negative.lower(jnp.ones((8, 4))).kernel
    text = printer.format_kernel(k)
    assert "while:" in text and "do %" in text
    assert printer.format_kernel(parser.parse_kernel(text)) == text

    @jt.kernel
    def not_callable(x):
        out = jt.empty(x.shape, x.dtype)
        jt.grid(1)

        @jt.while_(x[0] > 0)
        def _():
            out[...] = x[...]
        return out

    with pytest.raises(jt.KernelError, match="function that computes the condition"):
        not_callable.lower(jnp.ones((4,)))
