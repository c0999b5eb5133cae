"""The tile language on the CPU: dtype conversions and half-precision rounding.

Shared helpers and the testing approach: ``language_helpers``.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from language_helpers import (
    BF16,
    BOOL,
    CAST_VALUES,
    F16,
    F32,
    FLOAT_IDS,
    FLOATS,
    I32,
    RAGGED,
    _numpy_cast,
    assert_same,
    check_fns,
    data,
    map1,
    map2,
    run,
)

# --- casts ---------------------------------------------------------------------------------

def _cast_input(src):
    if src == BOOL:
        return jnp.asarray(np.array([True, False] * 8).reshape(2, 8))
    if src == I32:
        vals = np.array([0, 1, -1, 257, 259, 2049, 70000, -70000, 16777217, 2 ** 31 - 1,
                         -2 ** 31, 65519, -65519, 123456789, 33554435, 7], np.int64)
    else:
        vals = np.array(CAST_VALUES, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        arr = vals.astype(src)
    return jnp.asarray(arr.reshape(-1, 8))


def _cast_fn(dst):
    return functools.partial(lax.convert_element_type, new_dtype=dst)


def _check_casts(src, dsts):
    x = _cast_input(src)
    fns = {dst.name: _cast_fn(dst) for dst in dsts}
    got = check_fns(map1, [x], fns, {"signed_zeros": True})
    for dst, g in zip(dsts, got):
        assert_same(g, _numpy_cast(np.asarray(x), src, dst), signed_zeros=True,
                    what=f"{src.name}->{dst.name} vs numpy")


CASTS = {F32: [I32, BF16, F16], BF16: [F32, F16], F16: [F32, BF16, I32],
         I32: [F32, BF16, F16, BOOL], BOOL: [F32, I32, BF16]}


@pytest.mark.parametrize("src", list(CASTS), ids=[s.name for s in CASTS])
def test_casts(src):
    """Saturating float->int with NaN -> 0, round-to-nearest-even narrowing, overflow to
    inf, bool <-> numbers; against XLA and against numpy."""
    _check_casts(src, CASTS[src])


@pytest.mark.parametrize("src", [F32, BF16], ids=["f32", "bf16"])
def test_cast_float_to_bool(src):
    if src is BF16:
        _check_casts(src, [BOOL])
        return
    # XLA:CPU compares float32 with 0 under flush-to-zero, so subnormals become False where
    # numpy says True: jaxtile follows XLA (its reference semantics).
    x = _cast_input(src)
    (got,) = check_fns(map1, [x], {"bool": _cast_fn(BOOL)}, {"signed_zeros": True})
    normal = np.abs(np.asarray(x)) >= np.finfo(np.float32).tiny
    want = _numpy_cast(np.asarray(x), src, BOOL)
    np.testing.assert_array_equal(np.asarray(got)[normal], want[normal])


def test_cast_bf16_to_int32():
    _check_casts(BF16, [I32])


def _round_trip_back(v):
    return v.astype(jnp.float32).astype(v.dtype)


def _round_trip_via_bf16(v):
    return v.astype(jnp.bfloat16).astype(v.dtype)


def _round_trip_via_f16(v):
    return v.astype(jnp.float16).astype(v.dtype)


def _round_trip_input(rng, src):
    x = (rng.standard_normal(RAGGED) * 100).astype(src)
    with np.errstate(over="ignore"):
        x[0, :8] = np.asarray(CAST_VALUES[:8], src)
        x[1, :8] = np.asarray(CAST_VALUES[18:26], src)
    return jnp.asarray(x)


ROUND_TRIPS = {F32: {"via_bf16": _round_trip_via_bf16, "via_f16": _round_trip_via_f16},
               BF16: {"via_f32": _round_trip_back, "via_f16": _round_trip_via_f16},
               F16: {"via_f32": _round_trip_back}}


@pytest.mark.parametrize("src", FLOATS, ids=FLOAT_IDS)
def test_cast_round_trips_round(rng, src):
    """A narrowing cast inside an expression still rounds (cast pairs are not folded)."""
    x = _round_trip_input(rng, src)
    got = check_fns(map1, [x], ROUND_TRIPS[src], {"signed_zeros": True})
    if src == F32:
        with np.errstate(over="ignore"):
            assert_same(got[0], np.asarray(x).astype(BF16).astype(F32), what="numpy bf16")
            assert_same(got[1], np.asarray(x).astype(F16).astype(F32), what="numpy f16")


def test_cast_round_trip_f16_via_bf16(rng):
    x = _round_trip_input(rng, F16)
    got = check_fns(map1, [x], {"via_bf16": _round_trip_via_bf16}, {"signed_zeros": True})
    assert_same(got[0], np.asarray(x).astype(BF16).astype(F16), what="numpy")


def _half_chain(a, b):
    return (a * b + a) * b - a


def _half_chain_rounded(xs, ys, dtype):
    """``_half_chain`` in numpy, rounding to ``dtype`` after every op: jaxtile's semantics."""
    step = (xs * ys).astype(dtype).astype(F32)
    step = (step + xs).astype(dtype).astype(F32)
    step = (step * ys).astype(dtype).astype(F32)
    return (step - xs).astype(dtype)


def _half_chain_error_bound(xs, ys, dtype):
    """How far two evaluations of ``_half_chain`` may differ when each rounds every op to
    ``dtype`` at most once (a machine's native half arithmetic may keep some intermediates
    wider): twice the propagated sum of one rounding per intermediate."""
    u = float(np.finfo(dtype).eps) / 2
    a, b = xs.astype(np.float64), ys.astype(np.float64)
    t1 = a * b
    t2 = t1 + a
    t3 = t2 * b
    e2 = u * (np.abs(t1) + np.abs(t2))
    e3 = u * np.abs(t3) + np.abs(b) * e2
    return 2 * (u * np.abs(t3 - a) + e3) + float(np.finfo(dtype).smallest_subnormal)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_half_precision_rounds_after_every_op(rng, dtype):
    """Each half-precision op rounds its result, also inside fused chains: the compiled kernel
    equals a numpy formula that rounds after every op, on every machine.

    The reference semantics run on XLA:CPU, whose code for float16 depends on the machine
    (with avx512_fp16 it does not round after each op), so it is held to the formula within
    the error of the rounding steps it may skip; bfloat16 is rounded by XLA everywhere.
    """
    x, y = data(rng, RAGGED, dtype, edges=False), data(rng, RAGGED, dtype, edges=False)
    xs, ys = np.asarray(x, F32), np.asarray(y, F32)
    want = _half_chain_rounded(xs, ys, dtype)
    (got,), (ref,) = run(map2, x, y, fns=(_half_chain,))
    assert_same(got, want, what="compiled vs numpy, rounded after every op")
    if dtype == BF16:
        assert_same(ref, want, what="reference vs numpy, rounded after every op")
    else:
        err = np.abs(np.asarray(ref, np.float64) - want.astype(np.float64))
        bound = _half_chain_error_bound(xs, ys, dtype)
        assert np.all(err <= bound), f"reference vs numpy: worst excess {np.max(err - bound)}"
