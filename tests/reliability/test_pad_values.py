"""A ``pad`` is checked once, at trace time, against the dtype of the source it extends, for
every op that takes one (jt.copy, jt.gather): a pad that dtype cannot hold is a KernelError at
the user's line. Before, 300 into uint8, 2**40 into int32 and 1e39 into float32 stopped the
CPU compiler ("please report it"), overflowed or wrapped in the emulator, and pad=1.5 into an
int table read 1."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt


def _copy_kernel(pad):
    @jt.kernel
    def k(x):
        out = jt.empty((8,), x.dtype)
        t = jt.fragment((8,), x.dtype)
        jt.copy(x.at[0], t, pad=pad)          # the last 4 elements are past the end
        jt.copy(t, out.at[0])
        return out
    return k


def _gather_kernel(pad):
    @jt.kernel
    def k(table, ids):
        out = jt.empty((4, 8), table.dtype)
        t = jt.fragment((4, 8), table.dtype)
        i = jt.fragment((4,), jnp.int32)
        jt.copy(ids, i)
        jt.gather(table, i[...], t, pad=pad)
        jt.copy(t, out.at[0, 0])
        return out
    return k


BAD = [
    (jnp.uint8, 300, r"pad 300 is not a value of uint8.*0 to 255"),
    (jnp.uint8, -1, r"pad -1 is not a value of uint8"),
    (jnp.int32, 2**40, r"pad 1099511627776 is not a value of int32"),
    (jnp.int8, 1.5, r"pad 1.5 is not a value of int8"),
    (jnp.int32, float("inf"), r"pad inf is not a value of int32"),
    (jnp.bool_, 2, r"pad 2 is not a value of bool.*0 to 1"),
    (jnp.float32, 1e39, r"pad 1e\+39 overflows float32"),
    (jnp.float16, 70000.0, r"pad 70000.0 overflows float16"),
    (jnp.bfloat16, 10**400, r"pad 10{400} overflows bfloat16"),
]
IDS = ["u8-300", "u8-neg", "i32-2^40", "i8-frac", "i32-inf", "bool-2", "f32-1e39",
       "f16-70000", "bf16-huge"]


@pytest.mark.parametrize("dtype, pad, message", BAD, ids=IDS)
def test_copy_pad_outside_the_source_dtype(dtype, pad, message):
    with pytest.raises(jt.KernelError, match=f"jt.copy: {message}") as info:
        _copy_kernel(pad)(jnp.ones((4,), dtype))
    assert __file__ in str(info.value)        # the user's jt.copy line


@pytest.mark.parametrize("dtype, pad, message", BAD, ids=IDS)
def test_gather_pad_outside_the_table_dtype(dtype, pad, message):
    with pytest.raises(jt.KernelError, match=f"jt.gather: {message}") as info:
        _gather_kernel(pad)(jnp.ones((3, 8), dtype), jnp.asarray([0, 5, 1, -1], jnp.int32))
    assert __file__ in str(info.value)


@pytest.mark.parametrize("dtype, pad", [
    (jnp.uint8, 255), (jnp.int32, -2**31), (jnp.int8, 3.0), (jnp.float32, -float("inf")),
    (jnp.float16, 65504.0), (jnp.bool_, True)])
def test_pads_the_dtype_holds_are_accepted(dtype, pad):
    """At trace time (the reference semantics): the check refuses no value of the dtype."""
    x = jnp.ones((4,), dtype)
    got = _copy_kernel(pad).reference(x)
    want = jnp.pad(x, (0, 4), constant_values=jnp.asarray(pad, dtype))
    np.testing.assert_array_equal(got, want)


def test_in_range_pads_compile_and_match():
    table = jnp.arange(24, dtype=jnp.uint8).reshape(3, 8)
    ids = jnp.asarray([0, 5, 2, -1], jnp.int32)
    k = _gather_kernel(255)
    valid = (ids >= 0) & (ids < 3)
    want = jnp.where(valid[:, None], table[jnp.clip(ids, 0, 2)], jnp.uint8(255))
    np.testing.assert_array_equal(k(table, ids), want)
    np.testing.assert_array_equal(k.reference(table, ids), want)
    x = jnp.asarray([1, 2, 3, 4], jnp.int32)
    np.testing.assert_array_equal(_copy_kernel(-2**31)(x),
                                  jnp.pad(x, (0, 4), constant_values=-2**31))
