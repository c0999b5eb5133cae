"""Arg-reductions, sorts and max/min of bool tiles (issue 19, point 8): the CPU compiler
stopped at a TVM internal check (LLVM has no ordered compare of ``i1`` values); they now
give what ``jnp`` gives, on every backend."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt

_OPS = {
    "argmax": lambda v: jnp.argmax(v, axis=1).astype(jnp.int32),
    "argmin": lambda v: jnp.argmin(v, axis=0).astype(jnp.int32),
    "sort_rows": lambda v: jnp.sort(v, axis=1),
    "sort_cols": lambda v: jnp.sort(v, axis=0),
    "max": lambda v: jnp.max(v, axis=1),
    "min": lambda v: jnp.min(v, axis=0),
    "maximum": lambda v: jnp.maximum(v, jnp.flip(v, axis=1)),
    "minimum": lambda v: jnp.minimum(v, jnp.flip(v, axis=1)),
}


@jt.kernel
def _bool_ops(x):
    v = x[...]
    shapes = [jax.eval_shape(f, jax.ShapeDtypeStruct(v.shape, v.dtype)) for f in _OPS.values()]
    outs = [jt.empty(s.shape, s.dtype) for s in shapes]
    for out, f in zip(outs, _OPS.values()):
        out[...] = f(v)
    return tuple(outs)


def _operand() -> jnp.ndarray:
    x = np.random.RandomState(0).rand(8, 24) > 0.6
    x[1] = False                 # argmax of an all-false row is its first element
    x[2] = True                  # argmin of an all-true row too
    x[:, 3] = True
    return jnp.asarray(x)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda-emulator",
                                                         marks=pytest.mark.slow)])
def test_bool_arg_reductions_sorts_and_extremes(backend):
    before = jt.backend()
    jax.clear_caches()
    jt.set_backend(backend)
    try:
        x = _operand()
        got = jax.jit(_bool_ops)(x)
    finally:
        jt.set_backend(before)
        jax.clear_caches()
    reference = _bool_ops.reference(x)
    for (name, f), g, r in zip(_OPS.items(), got, reference):
        want = f(x)
        assert g.dtype == want.dtype, name
        np.testing.assert_array_equal(g, want, err_msg=name)
        np.testing.assert_array_equal(r, want, err_msg=name)
