"""The @jt.kernel decorator: interpret modes, specialisation, inspection."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt


@jt.kernel
def scale(x, *, factor):
    out = jt.empty(x.shape, x.dtype)
    out[...] = x[...] * factor
    return out


def _primitives(fn, *args):
    return {e.primitive.name for e in jax.make_jaxpr(fn)(*args).eqns}


def test_interpret_modes_run_the_reference_semantics():
    x = jnp.arange(6.0)
    assert _primitives(lambda x: scale(x, factor=2.0), x) == {"jaxtile_kernel_call"}
    jt.set_interpret(True)
    try:
        assert jt.interpret_by_default()
        assert "jaxtile_kernel_call" not in _primitives(lambda x: scale(x, factor=2.0), x)
        np.testing.assert_array_equal(scale(x, factor=2.0), x * 2)
    finally:
        jt.set_interpret(False)

    @jt.kernel(interpret=True)
    def twice(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * 2
        return out

    assert "jaxtile_kernel_call" not in _primitives(twice, x)
    np.testing.assert_array_equal(twice(x), x * 2)


def test_one_specialisation_per_shape_dtype_and_parameter():
    x = jnp.arange(6.0)
    keys = {scale.lower(x, factor=2.0).key, scale.lower(x, factor=3.0).key,
            scale.lower(x[:5], factor=2.0).key, scale.lower(x.astype(jnp.float16),
                                                             factor=2.0).key}
    assert len(keys) == 4
    np.testing.assert_array_equal(scale(x, factor=3.0), x * 3)


def test_missing_parameter_is_an_error():
    with pytest.raises(jt.KernelError, match="missing compile-time parameter"):
        scale(jnp.arange(3.0))


def test_lower_shows_tile_ir_and_generated_source():
    lowered = scale.lower(jax.ShapeDtypeStruct((8,), jnp.float32), factor=2.0)
    assert lowered.target == "cpu" and len(lowered.key) == 64
    assert "kernel scale(grid=[1]" in lowered.tile_ir
    assert "T.prim_func" in lowered.source and "jt_scale" in lowered.source


@jt.kernel
def split_halves(x):
    """Two outputs in a dict, to check the structure survives the eager fast path."""
    n = x.shape[0] // 2
    lo, hi = jt.empty((n,), x.dtype), jt.empty((n,), x.dtype)
    lo[...] = x[:n]
    hi[...] = x[n:] * 2
    return {"lo": lo, "hi": hi}


def test_repeated_eager_calls_reuse_the_compiled_call():
    x = jnp.arange(8.0)
    first = split_halves(x)
    assert len(split_halves._eager) == 1
    (run,) = split_halves._eager.values()
    assert run._cache_size() == 1
    again = split_halves(x + 1)                 # same types: the cached call, new values
    assert len(split_halves._eager) == 1 and run._cache_size() == 1
    np.testing.assert_array_equal(first["hi"], x[4:] * 2)
    np.testing.assert_array_equal(again["lo"], x[:4] + 1)
    np.testing.assert_array_equal(again["hi"], (x[4:] + 1) * 2)
    # numpy arguments, traced arguments and the interpret mode take their own paths.
    np.testing.assert_array_equal(split_halves(np.arange(8.0))["lo"], np.arange(4.0))
    assert len(split_halves._eager) == 1 and run._cache_size() == 1
    assert _primitives(lambda x: split_halves(x), x) == {"jaxtile_kernel_call"}
    np.testing.assert_array_equal(jax.jit(split_halves)(x)["hi"], x[4:] * 2)
    jt.set_interpret(True)
    try:
        assert "jaxtile_kernel_call" not in _primitives(lambda x: split_halves(x), x)
        np.testing.assert_array_equal(split_halves(x)["hi"], x[4:] * 2)
    finally:
        jt.set_interpret(False)
    # Another shape: the same jitted function, another trace of it, the right results.
    short = split_halves(x[:6])
    assert len(split_halves._eager) == 1 and run._cache_size() == 2
    np.testing.assert_array_equal(short["lo"], x[:3])
    np.testing.assert_array_equal(short["hi"], x[3:6] * 2)
    # Another dtype: another trace, its own specialisation.
    ints = split_halves(jnp.arange(4, dtype=jnp.int32))
    assert ints["hi"].dtype == jnp.int32 and run._cache_size() == 3
    np.testing.assert_array_equal(ints["hi"], np.arange(2, 4) * 2)


def _cube_kernel():
    @jt.kernel
    def cube(x, n):
        """x ** 3, and an integer argument passed through (its tangent is zero)."""
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * x[...] * x[...]
        count = jt.empty(n.shape, n.dtype)
        count[...] = n[...]
        return out, count
    return cube


def test_defjvp_rule_drives_forward_mode():
    cube = _cube_kernel()
    seen = []

    def jvp(args, outputs, tangents):
        (x, _), (tx, tn) = args, tangents
        seen.append((tn.dtype, outputs[1].dtype))
        return 3 * x * x * tx, None

    cube.defjvp(jvp)
    x, n = jnp.linspace(-1.0, 1.0, 8), jnp.arange(8, dtype=jnp.int32)
    t = jnp.full(8, 0.5)
    (y, m), (ty, _) = jax.jit(lambda x, t: jax.jvp(lambda x: cube(x, n), (x,), (t,)))(x, t)
    np.testing.assert_allclose(y, x ** 3, rtol=1e-6)
    np.testing.assert_array_equal(m, n)
    np.testing.assert_allclose(ty, 3 * x ** 2 * 0.5, rtol=1e-6)
    assert seen and seen[0] == (jnp.int32, jnp.int32)   # integer tangents arrive as zeros
    # Forward mode of a vmapped call runs the rule vmapped; reverse mode (no vjp rule)
    # still goes through the reference semantics.
    xs = jnp.stack([x, 2 * x])
    ts = jax.vmap(lambda x: jax.jvp(lambda x: cube(x, n)[0], (x,), (t,))[1])(xs)
    np.testing.assert_allclose(ts, 3 * xs ** 2 * 0.5, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: cube(x, n)[0].sum())(x), 3 * x ** 2,
                               rtol=1e-6)


def test_defjvp_rule_with_wrong_structure_is_an_error():
    cube = _cube_kernel()
    cube.defjvp(lambda args, outputs, tangents: tangents[0])
    with pytest.raises(jt.KernelError, match="the jvp rule returned tangents shaped"):
        jax.jvp(lambda x: cube(x, jnp.arange(4, dtype=jnp.int32)), (jnp.ones(4),),
                (jnp.ones(4),))


def test_eager_calls_tell_apart_parameters_python_deems_equal():
    # 1 == 1.0 == True and 0.0 == -0.0 in Python, yet each traces another kernel; the eager
    # cache (kernel._eager_key) must not hand one the other's compiled call.
    @jt.kernel
    def typed(x, *, p):
        out = jt.empty(x.shape, x.dtype)
        if isinstance(p, bool):
            out[...] = x[...] + 100.0
        elif isinstance(p, float):
            out[...] = x[...] * float(np.copysign(1.0, p)) + 10.0
        else:
            out[...] = x[...] + float(p)
        return out

    x = jnp.arange(1, 9, dtype=jnp.float32)
    for _ in range(2):  # the second round takes the eager cache for every call
        np.testing.assert_array_equal(typed(x, p=1), x + 1)
        np.testing.assert_array_equal(typed(x, p=True), x + 100)
        np.testing.assert_array_equal(typed(x, p=1.0), x + 10)
        np.testing.assert_array_equal(typed(x, p=-0.0), -x + 10)
        np.testing.assert_array_equal(typed(x, p=0.0), x + 10)


@jt.kernel
def _tile_made_in_a_loop(x):
    out = jt.empty(x.shape, x.dtype)

    @jt.loop(2)
    def _(i):
        t = jt.fragment((8,), x.dtype)          # allocated inside the loop's body
        jt.copy(x.at[i * 8], t)
        t[...] = t[...] * 2.0
        jt.copy(t, out.at[i * 8])

    return out


@jt.kernel
def _tiles_made_at_the_top(x):
    out = jt.empty(x.shape, x.dtype)
    scratch = jt.empty((4,), x.dtype)           # an output returned second, made first
    t = jt.fragment((16,), x.dtype)
    jt.copy(x.at[0], t)
    t[...] = t[...] + 1.0
    jt.copy(t, out.at[0])
    scratch[...] = t[:4] * 1.0
    return out, scratch


def test_allocations_become_inputs_in_one_trace_or_two():
    # The body is traced once and its jaxpr rewritten where every allocation is made at its
    # top level; one made inside a loop's body takes a second trace. Same results either way,
    # in the compiled kernel and in the reference semantics.
    x = jnp.arange(16.0, dtype=jnp.float32)
    for mode in (False, True):
        jt.set_interpret(mode)
        try:
            np.testing.assert_array_equal(np.asarray(_tile_made_in_a_loop(x)), np.asarray(x) * 2)
            out, scratch = _tiles_made_at_the_top(x)
            np.testing.assert_array_equal(np.asarray(out), np.asarray(x) + 1)
            np.testing.assert_array_equal(np.asarray(scratch), np.asarray(x[:4]) + 1)
        finally:
            jt.set_interpret(False)
