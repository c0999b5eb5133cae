"""compiler/cpu/lower.py: the entry signature its libraries are called with."""

import types

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import _ffi
from jaxtile.compiler import ir
from jaxtile.compiler.cpu import lower
from jaxtile.compiler.target import parse_target
from jaxtile.primitives import kernel_call


def _buffer(name, shape, dtype, role):
    return ir.Buffer(name, tuple(shape), np.dtype(dtype), "global", role)


def test_signature_binds_each_size_once_and_checks_the_rest():
    kernel = types.SimpleNamespace(params=(
        _buffer("x", ("n", 8), np.float32, "input"),
        _buffer("y.v", ("m",), ml_dtypes.bfloat16, "input"),
        _buffer("z", ("n", "m"), np.int8, "input"),
        _buffer("out", ("n+m", "floordiv(n,2)"), np.float32, "output"),
        _buffer("w", ("2*k",), np.int32, "output"),
    ))
    text = lower.entry_signature(kernel)
    assert text == ("x:float32[?,8];y_v:bfloat16[?];z:int8[dim0_0,dim1_0];"
                    "out:float32[(dim0_0+dim1_0),floordiv(dim0_0,2)];w:int32[?]")
    # The handler's parser reads it: the load fails only at the missing library.
    with pytest.raises(RuntimeError, match="no-such-library"):
        _ffi.load_kernel("signature-probe", "/no-such-library.so", "f", 1, 64, text)


def test_a_built_kernel_carries_its_signature():
    x = jnp.ones((3, 4), jnp.float32)

    @jt.kernel
    def scaled(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * 2
        return out

    entry = scaled._specialise((x,), {}).build(parse_target("cpu"), kernel_call.load)
    assert entry.meta.signature == "x:float32[3,4];out0:float32[3,4]"
