"""vmap of kernels: an extra grid axis, any in_axes/out_axes, nesting, several outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt

TILES = {"bm": 32, "bn": 32, "bk": 16}


def _mm(a, b):
    return jt.ops.matmul_relu(a, b, **TILES)


def _mm_ref(a, b):
    return jnp.maximum(jnp.matmul(a, b, precision="highest"), 0)


@jt.kernel
def sum_and_max(x, *, rows=8):
    """Two outputs, returned in the opposite order of creation."""
    n, m = x.shape
    s = jt.empty((n,), jnp.float32)
    mx = jt.empty((n,), x.dtype)
    r = jt.grid(jt.cdiv(n, rows))
    t = jt.fragment((rows, m), x.dtype)
    jt.copy(x.at[r * rows, 0], t)
    v = t[...]
    o = jt.fragment((rows,), jnp.float32)
    o[...] = jnp.sum(v.astype(jnp.float32), axis=1)
    jt.copy(o, s.at[r * rows])
    o2 = jt.fragment((rows,), x.dtype)
    o2[...] = jnp.max(v, axis=1)
    jt.copy(o2, mx.at[r * rows])
    return mx, s


def _rand(key, shape):
    return jax.random.normal(jax.random.key(key), shape)


@pytest.mark.parametrize("in_axes,a_shape,b_shape", [
    ((0, None), (3, 40, 30), (30, 50)),
    ((None, 0), (40, 30), (2, 30, 50)),
    ((0, 0), (2, 40, 30), (2, 30, 50)),
    ((1, None), (40, 3, 30), (30, 50)),
    ((-1, 2), (40, 30, 2), (30, 50, 2)),
])
def test_vmap_in_axes(in_axes, a_shape, b_shape):
    a, b = _rand(0, a_shape), _rand(1, b_shape)
    got = jax.jit(jax.vmap(_mm, in_axes=in_axes))(a, b)
    want = jax.vmap(_mm_ref, in_axes=in_axes)(a, b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_vmap_is_one_kernel_call_with_an_extra_grid_axis():
    a, b = _rand(0, (5, 40, 30)), _rand(1, (30, 50))
    jaxpr = jax.make_jaxpr(jax.vmap(_mm, in_axes=(0, None)))(a, b)
    eqns = [e.primitive.name for e in jaxpr.eqns]
    assert eqns == ["jaxtile_kernel_call"], eqns
    handle = jaxpr.eqns[0].params["kernel"]
    assert handle.spec.traced.grid == (2, 2, 5)
    # the unbatched b is passed as it is: no broadcast copy
    assert jaxpr.eqns[0].invars[1].aval.shape == (30, 50)


def test_nested_vmap_and_out_axes():
    a, b = _rand(0, (3, 40, 30)), _rand(1, (30, 4, 50))
    f = jax.vmap(jax.vmap(_mm, in_axes=(None, 1), out_axes=1), in_axes=(0, None), out_axes=2)
    got = jax.jit(f)(a, b)
    want = jax.vmap(jax.vmap(_mm_ref, in_axes=(None, 1), out_axes=1), in_axes=(0, None),
                    out_axes=2)(a, b)
    assert got.shape == want.shape == (40, 4, 3, 50)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_vmap_several_outputs_and_reference():
    x = _rand(2, (4, 19, 33))
    mx, s = jax.jit(jax.vmap(sum_and_max))(x)
    np.testing.assert_allclose(mx, jnp.max(x, axis=-1), rtol=0)
    np.testing.assert_allclose(s, jnp.sum(x, axis=-1), rtol=1e-5, atol=1e-5)
    rmx, rs = jax.vmap(sum_and_max.reference)(x)
    np.testing.assert_allclose(rmx, mx, rtol=0)
    np.testing.assert_allclose(rs, s, rtol=1e-6, atol=1e-6)


def test_vmap_of_softmax_matches_one_big_call():
    x = _rand(3, (6, 21, 200))
    got = jax.jit(jax.vmap(jt.ops.softmax))(x)
    flat = jt.ops.softmax(x.reshape(-1, 200)).reshape(x.shape)
    np.testing.assert_allclose(got, flat, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got, jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-7)


def test_vmap_axis_size_mismatch_is_a_clear_error():
    a, b = _rand(0, (3, 40, 30)), _rand(1, (2, 30, 50))
    with pytest.raises(ValueError, match="inconsistent sizes"):
        jax.vmap(_mm)(a, b)
