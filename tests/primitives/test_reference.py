"""Reference semantics of the tile primitives: edges pad on read and drop on write."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxtile.primitives.tile_ops import copy_reference, gemm_reference


def test_copy_reads_past_the_end_give_pad():
    src = jnp.arange(10, dtype=jnp.float32)
    dst = jnp.zeros((4,), jnp.float32)
    got = copy_reference(src, dst, [8], [0], (4,), (4,), -1.0)
    np.testing.assert_array_equal(got, [8, 9, -1, -1])


def test_copy_negative_start_pads_too():
    src = jnp.arange(5, dtype=jnp.int32)
    got = copy_reference(src, jnp.zeros((3,), jnp.int32), [-1], [0], (3,), (3,), None)
    np.testing.assert_array_equal(got, [0, 0, 1])


def test_copy_writes_past_the_end_are_dropped():
    dst = jnp.zeros((5,), jnp.float32)
    got = copy_reference(jnp.ones((4,)), dst, [0], [3], (4,), (4,), None)
    np.testing.assert_array_equal(got, [0, 0, 0, 1, 1])
    got = copy_reference(jnp.ones((4,)), dst, [0], [-2], (4,), (4,), None)
    np.testing.assert_array_equal(got, [1, 1, 0, 0, 0])


def test_copy_selects_leading_index_and_casts():
    src = jnp.arange(24, dtype=jnp.float32).reshape(2, 3, 4) + 0.5
    dst = jnp.zeros((2, 2), jnp.int32)
    got = copy_reference(src, dst, [1, 2, 3], [0, 0], (None, 2, 2), (2, 2), 0)
    # rows 2..3 of batch 1 (row 3 is past the end), cols 3..4 (col 4 past the end)
    np.testing.assert_array_equal(got, [[23, 0], [0, 0]])


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_reference_accumulates(ta, tb):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    c = np.ones((3, 5), np.float32)
    got = gemm_reference(jnp.asarray(a.T if ta else a), jnp.asarray(b.T if tb else b),
                         jnp.asarray(c), ta, tb)
    np.testing.assert_allclose(got, c + a @ b, rtol=1e-6)
