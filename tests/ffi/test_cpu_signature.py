"""The CPU handler's check of every call against the signature its kernel was compiled for
(ffi/cpu/signature.cc): jaxtile's kernels have no entry assertions of their own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ffi_kernels import TVM_ALIGNMENT

# `vadd` (ffi_kernels.py): c[i] = a[i] + b[i], all three of one dynamic length.
VADD = "a:float32[?];b:float32[dim0_0];c:float32[dim0_0]"


def _call(key, out_shape, out_dtype, *operands):
    out = jax.ShapeDtypeStruct(out_shape, out_dtype)
    fn = jax.jit(lambda *xs: jax.ffi.ffi_call("jaxtile_cpu_call", out)(*xs, key=key))
    return fn(*operands).block_until_ready()


@pytest.fixture(scope="module")
def checked(ffi, kernel_lib):
    ffi.load_kernel("vadd-signed", kernel_lib, "vadd", 4, alignment=TVM_ALIGNMENT,
                    signature=VADD)
    return "vadd-signed"


def test_a_matching_call_runs(checked):
    x = jnp.arange(21, dtype=jnp.float32)
    np.testing.assert_array_equal(_call(checked, (21,), jnp.float32, x, x), 2 * np.asarray(x))


F32 = jnp.float32
MISMATCHES = [
    # (operands, result shape and type, what the message says)
    ((jnp.ones(8, F32), jnp.ones(5, F32)), ((8,), F32),
     r"argument 'b' \(buffer #1\) is float32\[5\] but the kernel was compiled for "
     r"float32\[8\]: dimension 0 does not agree"),
    ((jnp.ones(8, jnp.int32), jnp.ones(8, F32)), ((8,), F32),
     r"argument 'a' \(buffer #0\) is int32\[8\] but the kernel was compiled for "
     r"float32\[\?\]: the element type differs"),
    ((jnp.ones((2, 4), F32), jnp.ones(8, F32)), ((8,), F32),
     r"argument 'a' \(buffer #0\) is float32\[2,4\] .*: the rank differs"),
    ((jnp.ones(8, F32), jnp.ones(8, F32)), ((9,), F32),
     r"argument 'c' \(buffer #2\) is float32\[9\] .*float32\[8\]"),
]


@pytest.mark.parametrize("operands, result, words", MISMATCHES)
def test_a_mismatched_call_is_an_error_naming_kernel_and_argument(checked, operands, result,
                                                                  words):
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT: jaxtile: kernel 'vadd-signed' "
                       r"\(vadd in .*\): " + words):
        _call(checked, *result, *operands)


def test_the_buffer_count_is_checked(ffi, kernel_lib):
    ffi.load_kernel("vadd-two", kernel_lib, "vadd", 1, alignment=TVM_ALIGNMENT,
                    signature="a:float32[?];c:float32[dim0_0]")
    x = jnp.ones(8, F32)
    with pytest.raises(Exception, match=r"'vadd-two'.*called with 3 buffers \(operands and "
                       r"results\) but compiled for 2"):
        _call("vadd-two", (8,), F32, x, x)


def test_dynamic_sizes_beyond_int32_are_refused(ffi, kernel_lib):
    ffi.load_kernel("vadd-wide", kernel_lib, "vadd", 1, alignment=TVM_ALIGNMENT,
                    signature="a:float32[?,0];b:float32[1];c:float32[1]")
    # No elements, so nothing is allocated; XLA leaves out a call whose buffers are all empty.
    x, y = jnp.zeros((2**31, 0), F32), jnp.ones(1, F32)
    with pytest.raises(Exception, match=r"'vadd-wide'.*float32\[2147483648,0\].*dimension 0 "
                       r"exceeds 2\^31-1"):
        _call("vadd-wide", (1,), F32, x, y)


def test_without_the_signature_the_mismatch_reaches_the_kernel(ffi, kernel_lib):
    # The mutation: the same library and call, loaded without a signature. The handler lets
    # the call through and only the assertion TVM compiled into this test kernel stops it
    # (jaxtile's own kernels have none), so the messages above are the handler's.
    ffi.load_kernel("vadd-unsigned", kernel_lib, "vadd", 1, alignment=TVM_ALIGNMENT)
    with pytest.raises(Exception, match=r"vadd-unsigned.*failed: .*Mismatched") as info:
        _call("vadd-unsigned", (8,), F32, jnp.ones(8, F32), jnp.ones(5, F32))
    assert "compiled for" not in str(info.value)


@pytest.mark.parametrize("signature, words", [
    ("a:float99[1]", "element type 'float99'"),
    ("a[1]", "expected <name>:<dtype>"),
    ("a:float32[1", "expected <name>:<dtype>"),
    ("a:float32[?];b:float32[dim3_0]", "reads dimension 0 of buffer 3"),
    ("a:float32[?];b:float32[dim0_1]", "reads dimension 1 of buffer 0"),
    ("a:float32[1+]", "bad size expression"),
])
def test_a_bad_signature_loads_nothing(ffi, kernel_lib, signature, words):
    key = f"vadd-bad-{signature}"
    with pytest.raises(ValueError, match="bad kernel signature") as info:
        ffi.load_kernel(key, kernel_lib, "vadd", 1, alignment=TVM_ALIGNMENT,
                        signature=signature)
    assert words in str(info.value)
    assert not ffi.is_loaded(key)


def test_an_element_type_no_kernel_takes_is_refused_before_the_signature(checked):
    # float8_e4m3b11fnuz has no DLPack type the handler passes on: it stops at packing, with
    # the buffer's index and XLA's type number, before the signature is read.
    x = jnp.ones(8, jnp.float8_e4m3b11fnuz)
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT: jaxtile: kernel 'vadd-signed' .*"
                       r"buffer #0 has an element type jaxtile does not support \(XLA type \d+\)"):
        _call(checked, (8,), F32, x, jnp.ones(8, F32))


@pytest.mark.parametrize("operands, result, words", [
    ((jnp.ones(8, jnp.int32), jnp.ones(8, F32)), ((8,), F32), r"the element type differs"),
    ((jnp.ones((2, 4), F32), jnp.ones(8, F32)), ((8,), F32), r"the rank differs"),
    ((jnp.ones(8, F32), jnp.ones(7, F32)), ((8,), F32), r"dimension 0 differs"),
    ((jnp.ones(8, F32), jnp.ones(8, F32)), ((9,), F32), r"dimension 0 differs"),
])
def test_a_signature_without_expressions_is_checked_as_the_buffers_are_packed(
        ffi, kernel_lib, operands, result, words):
    # Without size expressions the handler checks each buffer while packing it and calls the
    # full check (which words the message) only on a misfit: the misfits must still stop.
    ffi.load_kernel("vadd-fixed", kernel_lib, "vadd", 1, alignment=TVM_ALIGNMENT,
                    signature="a:float32[8];b:float32[8];c:float32[8]")
    np.testing.assert_array_equal(
        _call("vadd-fixed", (8,), F32, jnp.ones(8, F32), jnp.ones(8, F32)), np.full(8, 2.0))
    with pytest.raises(Exception, match=r"'vadd-fixed'.*compiled for float32\[8\]: " + words):
        _call("vadd-fixed", *result, *operands)
