"""Direct ref indexing at a ragged edge: JAX clamps the start, so a block reads or writes
rows another block owns. The compiler warns at trace time, at the user's line, pointing at
jt.copy (``compiler/passes/clamp_check.py``)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler.errors import ClampedIndexWarning

HERE = __file__


def _line_of(marker):
    with open(HERE) as f:
        return next(n for n, text in enumerate(f, 1) if marker in text and "_line_of" not in text)


@jt.kernel
def ds_read_copy_write(x, *, bm=8):
    """Reads row blocks by direct indexing (clamped), writes them with jt.copy (masked)."""
    m, n = x.shape
    out = jt.empty((m, n), x.dtype)
    i = jt.grid(jt.cdiv(m, bm))
    t = jt.fragment((bm, n), x.dtype)
    t[...] = x[jt.ds(i * bm, bm), :] * 2  # MARK-read
    jt.copy(t, out.at[i * bm, 0])
    return out


@jt.kernel
def copy_read_copy_write(x, *, bm=8):
    """The same with jt.copy both ways: the edge is masked."""
    m, n = x.shape
    out = jt.empty((m, n), x.dtype)
    i = jt.grid(jt.cdiv(m, bm))
    t = jt.fragment((bm, n), x.dtype)
    jt.copy(x.at[i * bm, 0], t)
    t[...] = t[...] * 2
    jt.copy(t, out.at[i * bm, 0])
    return out


def _trace_warnings(kernel, *args, **params):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel.lower(*args, **params)
    return [w for w in caught if issubclass(w.category, ClampedIndexWarning)]


def test_ragged_direct_read_warns_at_the_users_line():
    x = jnp.arange(13 * 4, dtype=jnp.float32).reshape(13, 4)
    (w,) = _trace_warnings(ds_read_copy_write, x)
    msg = str(w.message)
    for words in ("ds_read_copy_write", "'x'", "dimension 0", "8 + 8 > 13", "clamps it to 5",
                  "jt.copy"):
        assert words in msg, msg
    assert (w.filename, w.lineno) == (HERE, _line_of("# MARK-read"))
    # What the warning is about: the last block read rows 5..12 and wrote them to rows 8..12,
    # in the compiled kernel and in the reference semantics alike.
    want = np.asarray(x) * 2
    clamped = want.copy()
    clamped[8:13] = want[5:10]
    np.testing.assert_array_equal(jax.jit(ds_read_copy_write)(x), clamped)
    np.testing.assert_array_equal(ds_read_copy_write.reference(x), clamped)
    assert not np.array_equal(clamped, want)
    # jt.copy masks the edge: no warning, the right rows.
    assert _trace_warnings(copy_read_copy_write, x) == []
    np.testing.assert_array_equal(jax.jit(copy_read_copy_write)(x), want)


def test_no_warning_where_the_blocks_divide_the_shape():
    assert _trace_warnings(ds_read_copy_write, jax.ShapeDtypeStruct((16, 4), jnp.float32)) == []


def test_stores_loops_and_negative_starts():
    @jt.kernel
    def looped(x, *, bm=4):
        m, n = x.shape
        out = jt.empty((bm, n), x.dtype)
        acc = jt.fragment((bm, n), x.dtype)
        acc[...] = jnp.zeros((bm, n), x.dtype)

        @jt.loop(jt.cdiv(m, bm))
        def _(k):
            acc[...] = acc[...] + x[jt.ds(k * bm, bm), :]  # MARK-loop

        out[...] = acc[...]
        return out

    @jt.kernel
    def shifted(x):
        out = jt.empty((8, 4), x.dtype)
        i = jt.grid(2)
        out[jt.ds(i * 4, 4), :] = x[jt.ds(i * 4 - 2, 4), :]  # MARK-shift
        return out

    @jt.kernel
    def ragged_store(x, *, bm=8):
        m, n = x.shape
        out = jt.empty((m, n), x.dtype)
        i = jt.grid(jt.cdiv(m, bm))
        t = jt.fragment((bm, n), x.dtype)
        jt.copy(x.at[i * bm, 0], t)
        out[jt.ds(i * bm, bm), :] = t[...]  # MARK-store
        return out

    spec = jax.ShapeDtypeStruct((10, 4), jnp.float32)
    (w,) = _trace_warnings(looped, spec)
    assert "'x'" in str(w.message) and w.lineno == _line_of("# MARK-loop")
    assert _trace_warnings(looped, jax.ShapeDtypeStruct((12, 4), jnp.float32)) == []
    (w,) = _trace_warnings(shifted, jax.ShapeDtypeStruct((8, 4), jnp.float32))
    assert "-2" in str(w.message) and "negative" in str(w.message), w.message
    assert w.lineno == _line_of("# MARK-shift")
    (w,) = _trace_warnings(ragged_store, spec)
    assert "'out0'" in str(w.message) and "writes" in str(w.message), w.message
    assert w.lineno == _line_of("# MARK-store")


def test_warning_is_a_user_warning():
    assert issubclass(ClampedIndexWarning, UserWarning)
    with pytest.warns(ClampedIndexWarning):
        ds_read_copy_write.lower(jax.ShapeDtypeStruct((13, 4), jnp.float32), bm=4)
