"""Trace-time errors say what is wrong and what to write instead, at the user's line."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt


def _line_of(fn, text):
    source, first = inspect.getsourcelines(fn)
    return f"{__file__}:{first + next(i for i, s in enumerate(source) if text in s)}"


def _python_slice(x, *, rows=8):
    out = jt.empty(x.shape, x.dtype)
    r = jt.grid(2)
    t = jt.fragment((rows,), x.dtype)
    t[...] = x[r * rows:(r + 1) * rows]
    jt.copy(t, out.at[r * rows])
    return out


def _ds_slice(x, *, rows=8):
    out = jt.empty(x.shape, x.dtype)
    r = jt.grid(2)
    t = jt.fragment((rows,), x.dtype)
    t[...] = x[jt.ds(r * rows, rows)]
    jt.copy(t, out.at[r * rows])
    return out


def test_python_slice_with_a_traced_start_points_to_jt_ds():
    """It got the message about Python `if`/`while`."""
    x = jnp.arange(16, dtype=jnp.float32)
    with pytest.raises(jt.KernelError, match=r"traced start or stop.*use jt\.ds\(start, size"
                       ) as info:
        jt.kernel(_python_slice)(x)
    assert "`if`" not in str(info.value)
    assert _line_of(_python_slice, "x[r * rows:") in str(info.value)
    # What the message suggests works, as the reference and jnp compute it.
    k = jt.kernel(_ds_slice)
    np.testing.assert_array_equal(k(x), np.arange(16))
    np.testing.assert_array_equal(k.reference(x), jnp.concatenate([x[:8], x[8:]]))


def _printing(x):
    out = jt.empty(x.shape, x.dtype)
    t = jt.fragment((8,), x.dtype)
    jt.copy(x.at[0], t)
    jax.debug.print("t={t}", t=t[...])
    jt.copy(t, out.at[0])
    return out


def test_debug_print_says_compiled_kernels_lack_it_and_interpret_has_it(capfd):
    x = jnp.arange(8, dtype=jnp.float32)
    with pytest.raises(jt.KernelError, match=r"jax\.debug\.print is not supported in compiled "
                       r"kernels; print with jt\.print\(.*interpret=True") as info:
        jt.kernel(_printing)(x)
    assert _line_of(_printing, "jax.debug.print") in str(info.value)
    np.testing.assert_array_equal(jt.kernel(interpret=True)(_printing)(x), x)
    assert "t=[0. 1. 2." in capfd.readouterr().out


@jt.kernel
def _scaled(x, *, scale=1.0):
    out = jt.empty(x.shape, x.dtype)
    t = jt.fragment((8,), x.dtype)
    jt.copy(x, t)
    t[...] = t[...] * scale
    jt.copy(t, out)
    return out


def test_traced_keyword_argument_says_tracer_and_how_to_make_it_static():
    """It got "compile-time parameters must be hashable"."""
    x = jnp.arange(8, dtype=jnp.float32)

    def f(x, s):
        return _scaled(x, scale=s)

    with pytest.raises(jt.KernelError, match=r"parameter 'scale' is a traced value .*"
                       r"static_argnames='scale'.*positional array argument") as info:
        jax.jit(f)(x, 2.0)
    assert _line_of(f, "return _scaled") in str(info.value)
    got = jax.jit(f, static_argnames="s")(x, s=2.0)
    np.testing.assert_array_equal(got, 2 * x)
    np.testing.assert_array_equal(_scaled.reference(x, scale=2.0), 2 * x)


def test_unhashable_parameter_is_named():
    with pytest.raises(jt.KernelError, match=r"must be hashable .*not hashable: scale"):
        _scaled(jnp.ones((8,)), scale=[2.0])


def _too_many_registers(x):
    out = jt.empty(x.shape, x.dtype)
    t = jt.fragment((128,), x.dtype)
    table = jt.local((16400,), jnp.float32)        # 65600 bytes in every thread
    table[...] = jnp.zeros((16400,), jnp.float32)
    jt.copy(x, t)
    t[...] = t[...] + table[jt.ds(0, 128)]
    jt.copy(t, out)
    return out


def test_cuda_register_limit_names_the_tile_line():
    """The CUDA lowering's "more than 64 KiB of registers" had no source line."""
    k = jt.kernel(_too_many_registers)
    with pytest.raises(jt.KernelError, match=r"more than 64 KiB of registers .*local "
                       r"local0: float32\[16400\]") as info:
        print(k.lower(jax.ShapeDtypeStruct((128,), jnp.float32), target="cuda:sm_80").source)
    assert _line_of(_too_many_registers, "jt.local") in str(info.value)
