"""Dynamic sizes: ``@jt.kernel(dynamic=...)`` compiles one kernel for every size of the marked
dimensions; the grid, output shapes, loop bounds and masks follow the size at run time."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import cache, parser, printer
from jaxtile.compiler.errors import KernelError


@jt.kernel(dynamic={"x": 0})
def scale_rows(x, w, *, rows=8):
    n, d = x.shape
    out = jt.empty((n, d), x.dtype)
    r = jt.grid(jt.cdiv(n, rows))
    t = jt.fragment((rows, d), jnp.float32)
    jt.copy(x.at[r * rows, 0], t)
    t[...] = t[...] * w[...].astype(jnp.float32)[None, :] + n   # n: the size, on the device
    jt.copy(t, out.at[r * rows, 0])
    return out


@jt.kernel(dynamic={"x": 0})
def column_sums(x, *, rows=8, cols=16):
    n, d = x.shape
    out = jt.empty((d,), jnp.float32)
    c = jt.grid(jt.cdiv(d, cols))
    t = jt.fragment((rows, cols), jnp.float32)
    acc = jt.fragment((cols,), jnp.float32)
    acc[...] = jnp.zeros((cols,), jnp.float32)

    @jt.loop(jt.cdiv(n, rows))          # a bound computed from the dynamic size
    def _(i):
        jt.copy(x.at[i * rows, c * cols], t, pad=0)
        acc[...] += jnp.sum(t[...], axis=0)

    jt.copy(acc, out.at[c * cols])
    return out


def test_one_compile_serves_five_sizes(rng):
    w = jnp.asarray(rng.standard_normal(16), jnp.float32)
    keys = set()
    before = cache.stats()["stored"]
    for n in (37, 5, 64, 100, 1):       # ragged, below one tile, even, ragged, a single row
        x = jnp.asarray(rng.standard_normal((n, 16)), jnp.float32)
        y = jax.jit(scale_rows)(x, w)
        np.testing.assert_allclose(y, np.asarray(x) * np.asarray(w) + n, rtol=1e-6)
        np.testing.assert_allclose(y, scale_rows.reference(x, w), rtol=1e-6)
        keys.add(scale_rows.lower(x, w).key)
    assert cache.stats()["stored"] - before == 1
    assert len(keys) == 1
    text = scale_rows.lower(jnp.ones((9, 16)), w).tile_ir
    assert "grid=[floordiv(x_0+7,8)]" in text and "float32[x_0, 16]" in text
    assert "size() {expr='x_0'}" in text


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_loop_bound_from_a_dynamic_size(rng, dtype):
    before = cache.stats()["stored"]
    for n in (3, 50, 129):
        x = jnp.asarray(rng.standard_normal((n, 40)), dtype)
        y = jax.jit(column_sums)(x)
        want = np.asarray(x, np.float64).sum(axis=0)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        # CUDA sums a tile's rows in a shuffle tree, not in the reference's order
        np.testing.assert_allclose(y, column_sums.reference(x), rtol=1e-5, atol=1e-5)
    assert cache.stats()["stored"] - before == 1


def test_two_dynamic_axes_and_a_derived_output_shape(rng):
    @jt.kernel(dynamic={"x": (0, 1)})
    def pool_rows(x, *, rows=4, cols=8):
        n, m = x.shape
        out = jt.empty((jt.cdiv(n, rows), m), jnp.float32)   # an expression of the sizes
        c, r = jt.grid(jt.cdiv(m, cols), jt.cdiv(n, rows))
        t = jt.fragment((rows, cols), jnp.float32)
        jt.copy(x.at[r * rows, c * cols], t, pad=-jnp.inf)
        o = jt.fragment((1, cols), jnp.float32)
        o[...] = jnp.max(t[...], axis=0, keepdims=True)
        jt.copy(o, out.at[r, c * cols])
        return out

    before = cache.stats()["stored"]
    for n, m in ((13, 37), (4, 8), (30, 3)):
        x = jnp.asarray(rng.standard_normal((n, m)), jnp.float32)
        y = jax.jit(pool_rows)(x)
        pad = -n % 4
        want = np.pad(np.asarray(x), ((0, pad), (0, 0)), constant_values=-np.inf)
        want = want.reshape(-1, 4, m).max(axis=1)
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(y, pool_rows.reference(x))
    assert cache.stats()["stored"] - before == 1


def test_vmap_of_a_dynamic_kernel(rng):
    # Under vmap the kernel compiles for each size (batch views of dynamic dimensions are
    # not supported yet); the results are those of the unbatched kernel.
    w = jnp.asarray(rng.standard_normal(16), jnp.float32)
    for n in (11, 20):
        x = jnp.asarray(rng.standard_normal((3, n, 16)), jnp.float32)
        y = jax.jit(jax.vmap(scale_rows, in_axes=(0, None)))(x, w)
        np.testing.assert_allclose(y, np.asarray(x) * np.asarray(w) + n, rtol=1e-6)


def test_dynamic_ir_round_trips_through_the_parser():
    k = scale_rows.lower(jnp.ones((21, 16)), jnp.ones((16,))).kernel
    text = printer.format_kernel(k)
    assert printer.format_kernel(parser.parse_kernel(text)) == text


def test_a_tile_shaped_by_a_dynamic_size_is_an_error_at_its_line():
    @jt.kernel(dynamic={"x": 0})
    def bad(x):
        out = jt.empty(x.shape, x.dtype)
        jt.grid(1)
        t = jt.fragment((x.shape[0], 4), x.dtype)   # the offending line
        jt.copy(x.at[0, 0], t)
        jt.copy(t, out.at[0, 0])
        return out

    with pytest.raises(KernelError, match=r"depends on a dynamic size.*test_language_dynamic"):
        bad.lower(jnp.ones((8, 4)))


def test_reading_all_of_a_dynamic_dimension_is_an_error():
    @jt.kernel(dynamic={"x": 0})
    def whole(x):
        out = jt.empty((4,), x.dtype)
        jt.grid(1)
        out[...] = jnp.sum(x[...], axis=0)
        return out

    with pytest.raises(KernelError, match="dynamic size x_0"):
        whole.lower(jnp.ones((8, 4)))


def test_bad_dynamic_declarations():
    with pytest.raises(KernelError, match="not one of its array arguments"):
        jt.kernel(dynamic={"y": 0})(lambda x: x)
    with pytest.raises(KernelError, match="distinct non-negative axes"):
        jt.kernel(dynamic={"x": (-1,)})(lambda x: x)
    with pytest.raises(KernelError, match="rank 2"):
        scale_rows.__class__(scale_rows.fn, threads=128, interpret=None, name="s3",
                             dynamic={"x": 3}).lower(jnp.ones((8, 16)), jnp.ones((16,)))
