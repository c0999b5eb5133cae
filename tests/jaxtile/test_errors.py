"""Bad kernels and bad calls raise KernelError naming the kernel, the culprit and the line."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt

HERE = __file__


def _line_of(marker):
    with open(HERE) as f:
        for no, line in enumerate(f, 1):
            if marker in line and "_line_of" not in line:
                return no
    raise AssertionError(marker)


def _raises(fn, *words, marker=None):
    with pytest.raises(jt.KernelError) as info:
        fn()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    if marker is not None:
        assert f"{HERE}:{_line_of(marker)}" in msg, msg
    return msg


X = jnp.ones((64,), jnp.float32)


def test_python_if_on_traced_value():
    @jt.kernel
    def branchy(x):
        out = jt.empty(x.shape, x.dtype)
        v = x[...]
        if v[0] > 0:  # MARK-if
            out[...] = v
        return out

    _raises(lambda: branchy(X), "branchy", "jt.when", marker="MARK-if")


def test_unsupported_primitive():
    @jt.kernel
    def sorter(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = jax.lax.population_count(x[...].astype(jnp.int32)).astype(x.dtype)  # MARK-pc
        return out

    _raises(lambda: jax.jit(sorter)(X), "sorter", "`population_count`", "not supported",
            marker="MARK-pc")


def test_copy_shape_mismatch():
    @jt.kernel
    def bad_copy(x):
        out = jt.empty(x.shape, x.dtype)
        t = jt.fragment((16,), x.dtype)
        jt.copy(x.at[jt.ds(0, 32)], t)  # MARK-copy
        jt.copy(t, out.at[0])
        return out

    _raises(lambda: bad_copy(X), "bad_copy", "jt.copy", "(32,)", "(16,)", marker="MARK-copy")


def test_copy_region_does_not_fit_on_chip_buffer():
    @jt.kernel
    def overflow(x):
        out = jt.empty(x.shape, x.dtype)
        t = jt.fragment((16,), x.dtype)
        jt.copy(x.at[jt.ds(0, 8)], t.at[12])  # MARK-fit
        return out

    _raises(lambda: overflow(X), "overflow", "does not fit", marker="MARK-fit")


def test_gemm_shape_and_dtype_mismatch():
    @jt.kernel
    def bad_gemm(a):
        out = jt.empty((8, 8), jnp.float32)
        a_s = jt.shared((8, 4), a.dtype)
        b_s = jt.shared((8, 8), a.dtype)
        acc = jt.fragment((8, 8), jnp.float32)
        jt.gemm(a_s, b_s, acc)  # MARK-gemm
        return out

    _raises(lambda: bad_gemm(jnp.ones((8, 8))), "bad_gemm", "jt.gemm", "shape mismatch",
            marker="MARK-gemm")

    @jt.kernel
    def int_gemm(a):
        out = jt.empty((8, 8), jnp.float32)
        a_s = jt.shared((8, 8), a.dtype)
        acc = jt.fragment((8, 8), jnp.float32)
        jt.gemm(a_s, a_s, acc)  # MARK-intgemm
        return out

    _raises(lambda: int_gemm(jnp.ones((8, 8), jnp.int32)), "int_gemm", "int32",
            marker="MARK-intgemm")


def test_wrong_argument_rank_names_the_arguments():
    msg = _raises(lambda: jt.ops.matmul_relu(jnp.ones((4,)), jnp.ones((4, 4))),
                  "matmul_relu", "a: float32[4]", "b: float32[4, 4]")
    assert re.search(r"jaxtile/ops/matmul\.py:\d+", msg), msg


def test_wrong_argument_dtype_and_kind():
    _raises(lambda: jt.ops.matmul_relu(jnp.ones((8, 8), jnp.int32), jnp.ones((8, 8), jnp.int32)),
            "matmul_relu", "jt.gemm", "int32")
    _raises(lambda: jt.ops.add(X, [1.0] * 64), "add", "argument 'y' must be an array")
    _raises(lambda: jt.ops.add(X, jnp.ones(64, jnp.complex64)), "add", "argument 'y'",
            "complex64")
    _raises(lambda: jt.ops.add(X), "add", "2 array argument")
    _raises(lambda: jt.ops.add(X, X, blok=8), "add", "blok")


def test_grid_that_does_not_cover_the_output():
    @jt.kernel
    def short_grid(x, *, block=16):
        (n,) = x.shape
        out = jt.empty((n,), x.dtype)
        i = jt.grid(n // block)  # floor instead of cdiv: misses the tail
        t = jt.fragment((block,), x.dtype)
        jt.copy(x.at[i * block], t)
        jt.copy(t, out.at[i * block])  # MARK-cover
        return out

    _raises(lambda: short_grid(jnp.ones((40,))), "short_grid", "unwritten", "40",
            marker="MARK-cover")
    np.testing.assert_array_equal(short_grid(jnp.ones((48,))), np.ones(48))


def test_writing_an_input_is_rejected():
    @jt.kernel
    def writes_input(x):
        out = jt.empty(x.shape, x.dtype)
        x[...] = x[...] * 2  # MARK-write
        out[...] = x[...]
        return out

    _raises(lambda: jax.jit(writes_input)(X), "writes_input", "read-only", marker="MARK-write")


def test_tile_language_outside_a_kernel():
    with pytest.raises(jt.KernelError, match="only be used inside"):
        jt.fragment((4,), jnp.float32)


def test_unknown_key_is_a_python_error():
    from jaxtile.primitives.lowering import CPU_TARGET_NAME

    call = jax.ffi.ffi_call(CPU_TARGET_NAME, jax.ShapeDtypeStruct((4,), jnp.float32))
    with pytest.raises(Exception, match="no kernel is loaded"):
        jax.block_until_ready(call(X[:4], key="0" * 64))


def test_one_list_of_internal_frames_found_by_import_path():
    """jaxtile's errors and JAX's source lines skip the same frames: those of the modules
    jaxtile was imported from, found by path (a clone of the repository in a folder named
    `jaxtile` must not turn the user's files into internal ones; `.ci/run` runs the suite
    from such a clone). The kernel library and the user's files are not internal."""
    import importlib
    import os

    from jax._src import source_info_util

    from jaxtile.compiler import errors

    def file_of(module):
        return importlib.import_module(module).__file__

    own = [file_of(m) for m in ("jaxtile", "jaxtile.kernel", "jaxtile.export",
                                "jaxtile.compiler.errors", "jaxtile.compiler.cpu.lower",
                                "jaxtile.primitives.sharding")]
    # In a source checkout the repository root is the folder above the jaxtile package.
    root = os.path.dirname(os.path.dirname(file_of("jaxtile")))
    users = [HERE, file_of("jaxtile.ops.softmax"), os.path.join(root, "my_script.py")]
    for path in own:
        assert errors._is_internal(path), path
        assert not source_info_util.is_user_filename(path), path
    for path in users:
        assert not errors._is_internal(path), path
        assert source_info_util.is_user_filename(path), path
