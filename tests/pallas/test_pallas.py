"""The ``jaxtile.pallas`` layer: pallas_call's grid and BlockSpecs with Pallas' edge rules,
refs and their views, masked loads and stores, program ids, loops, transformations, and
the errors for what it does not map."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_ops import primitives

import jaxtile as jt
from jaxtile import pallas as pl
from jaxtile.pallas import triton as plgpu


def _affine_kernel(x_ref, o_ref):
    o_ref[...] = 2 * x_ref[...] + 1


def _blocked_affine(x, bm=4, bn=8, **kw):
    """2x + 1 over blocks of (bm, bn) on a grid that overhangs both edges of x."""
    m, n = x.shape
    return pl.pallas_call(
        _affine_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)), **kw)(x)


def test_edge_blocks_read_padding_and_drop_writes(rng, backend):
    """A 10x13 array in 4x8 blocks: the last row and column blocks hang over the edge;
    their reads past it are padding and their writes there are dropped (elements next to
    the array are not touched, in-range ones are all written once)."""
    x = jnp.asarray(rng.standard_normal((10, 13)), jnp.float32)
    np.testing.assert_allclose(jax.jit(_blocked_affine)(x), 2 * np.asarray(x) + 1, rtol=1e-6)
    np.testing.assert_allclose(_blocked_affine(x, interpret=True), 2 * np.asarray(x) + 1,
                               rtol=1e-6)


def test_index_map_and_squeezed_dimensions(rng, backend):
    """BlockSpecs with None (squeezed) dimensions and an index map that permutes the grid:
    the kernel sees (rows, cols) blocks of a [batch, heads, rows, cols] array."""
    x = jnp.asarray(rng.standard_normal((2, 3, 6, 5)), jnp.float32)

    def kernel(x_ref, o_ref):
        assert x_ref.shape == (6, 8) and o_ref.shape == (8, 6)
        h = pl.program_id(0)
        o_ref[...] = x_ref[...].T * (h + 1).astype(jnp.float32)

    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((2, 3, 5, 6), jnp.float32), grid=(3, 2),
        in_specs=[pl.BlockSpec((None, None, 6, 8), lambda h, b: (b, h, 0, 0))],
        out_specs=pl.BlockSpec((None, None, 8, 6), lambda h, b: (b, h, 0, 0)))(x)
    want = np.swapaxes(np.asarray(x), 2, 3) * np.arange(1, 4)[None, :, None, None]
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_grid_of_four_axes_and_num_programs():
    """A grid of more than three axes folds into jaxtile's three; program ids and
    num_programs read as Pallas' own."""
    def kernel(o_ref):
        ids = [pl.program_id(a) for a in range(4)]
        flat = ((ids[0] * pl.num_programs(1) + ids[1]) * pl.num_programs(2) + ids[2]) \
            * pl.num_programs(3) + ids[3]
        o_ref[...] = jnp.full((1, 1, 1, 1), flat, jnp.int32)

    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((2, 3, 4, 5), jnp.int32), grid=(2, 3, 4, 5),
        out_specs=pl.BlockSpec((1, 1, 1, 1), lambda a, b, c, d: (a, b, c, d)))()
    np.testing.assert_array_equal(out, np.arange(120).reshape(2, 3, 4, 5))


def test_masked_loads_and_stores(rng, backend):
    """plgpu.load's mask/other and plgpu.store's mask, along one axis (masked-off lanes
    are dropped) and along two (read, merge, write back), on pl.ds windows and integer-
    array views past the end."""
    x = jnp.asarray(rng.standard_normal((5, 7)), jnp.float32)

    def kernel(x_ref, o_ref, p_ref):
        rows, cols = jnp.arange(8), jnp.arange(8)
        m = (rows[:, None] < 5) & (cols[None, :] < 7)
        t = plgpu.load(x_ref.at[pl.ds(0, 8), pl.ds(0, 8)], mask=m, other=-1.0)
        p_ref[...] = jnp.sum(jnp.where(t == -1.0, 1, 0)).astype(jnp.int32)
        o_ref[...] = jnp.zeros((5, 7), jnp.float32)
        keep = (rows[:, None] + cols[None, :]) % 2 == 0
        plgpu.store(o_ref.at[pl.ds(0, 8), pl.ds(0, 8)], t * 3, mask=keep)
        odd = cols % 2 == 1
        plgpu.store(o_ref.at[rows[:, None], cols[None, :]], t * 5, mask=odd & (cols < 7))

    zeros = jnp.zeros((5, 7), jnp.float32)
    out, pads = pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct((5, 7), jnp.float32),
                           jax.ShapeDtypeStruct((), jnp.int32)))(x)
    r, c = np.indices((5, 7))
    want = np.where((r + c) % 2 == 0, 3 * np.asarray(x), zeros)
    want = np.where(c % 2 == 1, 5 * np.asarray(x), want)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert int(pads) == 64 - 35


def test_loop_when_and_carry(rng):
    """pl.loop with and without a carry, pl.when on a traced and a Python condition."""
    x = jnp.asarray(rng.standard_normal((40,)), jnp.float32)

    def kernel(x_ref, o_ref):
        total = pl.loop(0, 5, init_carry=jnp.zeros((8,), jnp.float32))(
            lambda i, acc: acc + x_ref[pl.ds(i * 8, 8)])

        @pl.loop(0, 5)
        def _(i):
            o_ref[pl.ds(i * 8, 8)] = x_ref[pl.ds(i * 8, 8)] - total

        @pl.when(total.sum() > 1e9)
        def _():
            o_ref[pl.ds(0, 8)] = jnp.zeros((8,), jnp.float32)

        @pl.when(False)
        def _():
            raise AssertionError("a false Python condition runs nothing")

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((40,), jnp.float32),
                         compiler_params=plgpu.CompilerParams(num_warps=2, num_stages=2))(x)
    xs = np.asarray(x).reshape(5, 8)
    np.testing.assert_allclose(out, (xs - xs.sum(0)).reshape(-1), rtol=1e-5, atol=1e-6)


def test_transformations(rng):
    """vmap (a batch grid axis), jit and jax.export; the jaxpr holds jaxtile's kernel call
    and no pallas_call."""
    x = jnp.asarray(rng.standard_normal((3, 10, 13)), jnp.float32)
    f = jax.jit(jax.vmap(_blocked_affine))
    np.testing.assert_allclose(f(x), 2 * np.asarray(x) + 1, rtol=1e-6)
    names = primitives(jax.make_jaxpr(jax.vmap(_blocked_affine))(x).jaxpr)
    assert "jaxtile_kernel_call" in names and "pallas_call" not in names
    exported = jax.export.export(f, disabled_checks=jt.export_checks())(x)
    np.testing.assert_allclose(exported.call(x), 2 * np.asarray(x) + 1, rtol=1e-6)


def test_atomic_add(rng):
    """plgpu.atomic_add from every program into one row, masked."""
    x = jnp.asarray(rng.standard_normal((6, 16)), jnp.float32)

    def kernel(x_ref, o_ref):
        i = pl.program_id(0)
        plgpu.atomic_add(o_ref, pl.ds(0, 16), x_ref[i], mask=jnp.arange(16) < 12)

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16,), jnp.float32),
                         grid=(6,))(x)
    want = np.where(np.arange(16) < 12, np.asarray(x).sum(0), 0)
    # The output starts undefined in Pallas; jaxtile zero-fills accumulated outputs.
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use", [
    lambda: functools.partial(pl.pallas_call(
        _affine_kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32), grid=(2,),
        input_output_aliases={0: 0}), jnp.ones((8,))),
    lambda: pl.BlockSpec((4,), lambda i: (i,), memory_space="smem"),
    lambda: pl.semaphore_signal(None),
    lambda: plgpu.atomic_cas,
], ids=["aliases", "memory_space", "semaphore", "atomic_cas"])
def test_unsupported_features_name_themselves_and_the_line(use):
    """TPU and Mosaic GPU names exist (a module importing them loads) and fail when used;
    so do Pallas features jaxtile does not map."""
    with pytest.raises(jt.KernelError, match=r"not supported by jaxtile.pallas.*test_pallas"):
        got = use()
        got()


def test_unsupported_inside_a_kernel_names_the_kernel_line():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[::2]

    with pytest.raises(jt.KernelError, match=r"strided slices.*test_pallas.py:\d+"):
        pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((4,), jnp.float32))(
            jnp.ones((8,)))


def test_helpers():
    assert pl.cdiv(10, 4) == 3 and pl.next_power_of_2(100) == 128
    assert pl.next_power_of_2(1) == 1 and pl.next_power_of_2(0) == 1
    s = pl.ds(3, 5)
    assert (s.start, s.size) == (3, 5) and pl.dslice is pl.ds
    assert functools.partial(pl.multiple_of, values=8)(7) == 7


def test_port_changes_the_pallas_imports(tmp_path):
    """pl.port runs a module file with its Pallas imports (any alias) made jaxtile's, and
    refuses a file that does not import Pallas."""
    src = tmp_path / "k.py"
    src.write_text("from jax.experimental import pallas as P\n"
                   "from jax.experimental.pallas import triton as T\n"
                   "names = (P.__name__, T.__name__)\n")
    assert pl.port(src).names == ("jaxtile.pallas", "jaxtile.pallas.triton")
    other = tmp_path / "other.py"
    other.write_text("import jax\n")
    with pytest.raises(ValueError, match="other.py has no"):
        pl.port(other)


@pytest.mark.parametrize("indexing", ["window", "array"])
def test_store_mask_along_one_axis(rng, backend, indexing):
    """A 1-D store mask that is the in-bounds test takes the unmasked copy; any other mask
    writes exactly the lanes it keeps (the others keep what the first store wrote)."""
    x = jnp.asarray(rng.standard_normal((3, 13)), jnp.float32)

    def view(ref):
        return ref.at[:, pl.ds(0, 16)] if indexing == "window" else \
            ref.at[:, jnp.arange(16) + 0 * pl.program_id(0)]

    def kernel(x_ref, o_ref):
        cols = jnp.arange(16)
        t = plgpu.load(view(x_ref), mask=(cols < 13)[None, :])
        plgpu.store(view(o_ref), -t, mask=(cols < 13)[None, :])
        plgpu.store(view(o_ref), 2 * t, mask=(cols % 3 == 0)[None, :])

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((3, 13), jnp.float32),
                         grid=(1,))(x)
    cols = np.arange(13)
    np.testing.assert_allclose(out, np.where(cols % 3 == 0, 2, -1) * np.asarray(x), rtol=1e-6)


def test_input_output_aliases(rng, backend):
    """An aliased output starts as its input: the kernel updates every other row block and
    the rows it does not write keep the input's values."""
    x = jnp.asarray(rng.standard_normal((10, 6)), jnp.float32)

    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(0) % 2 == 0)
        def _():
            o_ref[...] = x_ref[...] * 10

    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(5,),
        in_specs=[pl.BlockSpec((2, 6), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((2, 6), lambda i: (i, 0)), input_output_aliases={0: 0})(x)
    scale = np.where((np.arange(10) // 2) % 2 == 0, 10, 1)[:, None]
    np.testing.assert_allclose(out, np.asarray(x) * scale, rtol=1e-6)
