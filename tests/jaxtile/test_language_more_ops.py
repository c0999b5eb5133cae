"""jnp operations kernel authors reach for beyond the basics: more transcendental functions,
exact gelu (erfc), atan2, isfinite and logsumexp, float remainder, flips, slices and
concatenation of tile values; and clear errors for what is not supported."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from language_helpers import BF16, F32, RAGGED, check_fns, data, map1, map2, whole

# bfloat16: jaxtile computes in float32 and rounds once, where XLA's expansions of some of
# these functions (acosh, atanh...) round after each step: two ulps apart at most.
TOL = {F32: {"rtol": 2e-6, "atol": 1e-30}, BF16: {"rtol": 2 ** -6, "atol": 1e-30}}
UNARY = {
    "tan": jnp.tan, "atan": jnp.arctan, "sinh": jnp.sinh, "cosh": jnp.cosh,
    "asinh": jnp.arcsinh, "erfc": jax.scipy.special.erfc,
    "gelu_exact": lambda v: jax.nn.gelu(v, approximate=False),
    "isfinite": jnp.isfinite,
}
BOUNDED = {"asin": jnp.arcsin, "acos": jnp.arccos, "atanh": jnp.arctanh}


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_more_unary_functions(rng, dtype):
    x = data(rng, RAGGED, dtype, scale=1.5)
    # gelu is a chain of ops: in bfloat16 jaxtile rounds after each (as its semantics
    # say), while XLA's fusions may not, so it is checked in float32 only
    fns = UNARY if dtype == F32 else {k: f for k, f in UNARY.items() if k != "gelu_exact"}
    check_fns(map1, (x,), fns, TOL[dtype])
    inside = data(rng, RAGGED, dtype, scale=0.4, edges=False)
    check_fns(map1, (inside,), BOUNDED, TOL[dtype])
    above_one = data(rng, RAGGED, dtype, low=1.0, edges=False)
    check_fns(map1, (above_one,), {"acosh": jnp.arccosh}, TOL[dtype])


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_atan2_and_float_remainders(rng, dtype):
    x, y = data(rng, RAGGED, dtype, scale=5.0), data(rng, RAGGED, dtype)
    exact = {"rtol": 0, "atol": 0}
    check_fns(map2, (x, y), {"atan2": jnp.arctan2}, TOL[dtype])
    check_fns(map2, (x, y), {"fmod": jnp.fmod, "remainder": jnp.remainder,
                             "percent": lambda a, b: a % b}, exact)


def test_logsumexp_handles_infinities(rng):
    x = np.array(data(rng, (8, 16), F32))
    x[0] = -np.inf
    x[1, 3] = np.inf
    check_fns(map1, (jnp.asarray(x),), {
        "logsumexp": lambda v: jnp.broadcast_to(
            jax.nn.logsumexp(v, axis=1, keepdims=True), v.shape)}, TOL[F32])


def test_flips_slices_and_concatenation(rng):
    x = data(rng, (6, 10), F32)
    check_fns(whole, (x,), {
        "flip1": lambda v: jnp.flip(v, 1), "flip01": lambda v: jnp.flip(v, (0, 1)),
        "drop_first_col": lambda v: v[:, 1:], "every_other_row": lambda v: v[::2],
        "middle": lambda v: v[1:5:3, 2:9:2],
        "concat": lambda v: jnp.concatenate([v, v[:, :3] * 2, v[:, 7:]], axis=1),
        "stack_rows": lambda v: jnp.concatenate([v[4:], v[:1]], axis=0),
        "shift_left": lambda v: jnp.concatenate([v[:, 1:], jnp.zeros((6, 1))], axis=1),
        "stack_middle": lambda v: jnp.stack([v[:3], v[3:] * 2], axis=1),
        "stack_last": lambda v: jnp.stack([v, -v, v + 1], axis=-1),
    }, {"rtol": 0, "atol": 0})
