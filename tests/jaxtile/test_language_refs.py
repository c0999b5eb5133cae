"""The tile language on the CPU: reads and writes through refs, and jt.copy.

Shared helpers and the testing approach: ``language_helpers``.
"""

import jax
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
    I32,
    RAGGED,
    _is_float,
    _neg,
    _numpy_cast,
    assert_same,
    check,
    check_fns,
    data,
    put,
    whole,
)

import jaxtile as jt

# --- refs ----------------------------------------------------------------------------------

def _affine(v):
    return v * 2 - 1


@pytest.mark.parametrize("shape,dtype", [((1,), I32), ((2, 3, 5), F32)],
                         ids=["1d-i32", "3d-f32"])
def test_whole_ref_read_write(rng, shape, dtype):
    x = data(rng, shape, dtype)
    check_fns(whole, [x], {"affine": _affine, "neg": _neg}, {"signed_zeros": True})


@jt.kernel
def ds_rows(x, *, b=4):
    """Row blocks through ref[jt.ds(i * b, b), :]: the last block is clamped into range."""
    m, n = x.shape
    out = jt.empty((m, n), x.dtype)
    i = jt.grid(jt.cdiv(m, b))
    out[jt.ds(i * b, b), :] = x[jt.ds(i * b, b), :] * 2 + 1
    return out


@pytest.mark.parametrize("m", [8, 10])
def test_dynamic_slices_cover_with_clamping(rng, m):
    x = data(rng, (m, 6), F32, edges=False)
    b = min(4, m)
    check(ds_rows, [x], x * 2 + 1, {"b": b})


@jt.kernel
def window(x, *, b, step, shift, nb):
    """out[i, :] = x[i * step + shift : ... + b], clamped like lax.dynamic_slice."""
    out = jt.empty((nb, b), x.dtype)
    i = jt.grid(nb)
    out[i, :] = x[jt.ds(i * step + shift, b)]
    return out


@pytest.mark.parametrize("shift", [7, -3])
def test_dynamic_slice_clamps_like_lax(shift):
    x = jnp.arange(10, dtype=F32) * 1.5
    nb = 4
    want = jnp.stack([lax.dynamic_slice(x, (i * 3 + shift,), (4,)) for i in range(nb)])
    check(window, [x], want, {"b": 4, "step": 3, "shift": shift, "nb": nb})


@jt.kernel
def row_reads(x, idx):
    """Single-row reads ref[i, :] at data-dependent rows, and ref[i, j] scalars."""
    m, n = x.shape
    (k,) = idx.shape
    out = jt.empty((k, n), x.dtype)
    corner = jt.empty((k,), x.dtype)
    i = jt.grid(k)
    r = idx[i]
    out[i, :] = x[r, :] + x[0, :]
    corner[i] = x[r, n - 1] * 2
    return out, corner


def test_single_row_reads(rng):
    x = data(rng, (7, 12), F32, edges=False)
    idx = jnp.asarray([3, 0, 6, 6, 1], I32)
    want = (x[idx] + x[0], x[idx, 11] * 2)
    check(row_reads, [x, idx], want)


@jt.kernel
def accumulate_rows(x):
    """ref[...] += v on an output and on a fragment, over a device loop."""
    m, n = x.shape
    total = jt.empty((n,), x.dtype)
    total[...] = jnp.zeros((n,), x.dtype)
    acc = jt.fragment((n,), x.dtype)
    acc[...] = jnp.zeros((n,), x.dtype)

    @jt.loop(m)
    def _(k):
        total[...] += x[k, :]
        acc[...] += x[k, :] * x[k, :]

    sq = jt.empty((n,), x.dtype)
    sq[...] = acc[...]
    return total, sq


@pytest.mark.parametrize("dtype", [F32, I32], ids=["f32", "i32"])
def test_add_update(rng, dtype):
    x = data(rng, (5, 12), dtype, edges=False)
    tol = {"rtol": 1e-6} if dtype == F32 else {}
    check(accumulate_rows, [x], (x.sum(0), (x * x).sum(0)), **tol)


# --- jt.copy -------------------------------------------------------------------------------

@jt.kernel
def heads(q, *, bs=8, scale=2.0):
    """A 3-D tensor read one (bs, D) tile at a time: leading index selects the batch."""
    B, S, D = q.shape
    out = jt.empty((B, S, D), q.dtype)
    s, b = jt.grid(jt.cdiv(S, bs), B)
    t = jt.fragment((bs, D), q.dtype)
    jt.copy(q.at[b, s * bs, 0], t)
    t[...] = t[...] * scale
    jt.copy(t, out.at[b, s * bs, 0])
    return out


@pytest.mark.parametrize("S,dtype", [(13, F32), (16, F16)], ids=["13-f32", "16-f16"])
def test_copy_leading_selected_index(rng, S, dtype):
    q = data(rng, (3, S, 16), dtype)
    check(heads, [q], q * 2, signed_zeros=True)


@jt.kernel
def padded_row_reduce(x, *, fn, pad, cols=64, rows=4):
    """Whole rows in a (rows, cols) tile; columns past the end read ``pad``."""
    m, n = x.shape
    r = jt.grid(jt.cdiv(m, rows))
    t = jt.fragment((rows, cols), x.dtype)
    jt.copy(x.at[r * rows, 0], t, pad=pad)
    red = fn(t[...], axis=1, keepdims=True)
    out = jt.empty((m, 1), red.dtype)
    o = jt.fragment((rows, 1), red.dtype)
    o[...] = red
    jt.copy(o, out.at[r * rows, 0])
    return out


@pytest.mark.parametrize("fn,pad,dtype,low", [
    (jnp.max, -np.inf, F32, None), (jnp.min, np.inf, F32, 0.5), (jnp.prod, 1, F32, 0.9),
    (jnp.max, -2 ** 31, I32, -100),
], ids=["max-inf", "min+inf", "prod1", "imax"])
def test_copy_pad_values(rng, fn, pad, dtype, low):
    if _is_float(dtype):
        x = rng.standard_normal((10, 37))
        if low is not None:
            x = low + np.abs(x) * 0.1 if fn is jnp.prod else low + np.abs(x)
        elif fn is jnp.max:
            x = -np.abs(x) - 1                  # every value below the default pad of 0
        x = jnp.asarray(x.astype(dtype))
    elif fn is jnp.max:
        x = -jnp.abs(data(rng, (10, 37), dtype)) - 1     # below the default pad of 0
    else:
        x = data(rng, (10, 37), dtype, low=low)
    want = fn(x, axis=1, keepdims=True)
    tol = {"rtol": 2e-6} if dtype == F32 and fn in (jnp.prod, jnp.sum) else {}
    if dtype == F16 and fn is jnp.prod:
        tol = {"rtol": 2e-2}
    check(padded_row_reduce, [x], want, {"fn": fn, "pad": pad}, **tol)


@jt.kernel
def stencil(x, *, b=16):
    """out[j] = x[j-1] + 2 x[j] + x[j+1] from a halo tile whose origin starts at -1."""
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, b))
    h = jt.fragment((b + 2,), x.dtype)
    jt.copy(x.at[i * b - 1], h)
    o = jt.fragment((b,), x.dtype)
    o[...] = h[jt.ds(0, b)] + 2 * h[jt.ds(1, b)] + h[jt.ds(2, b)]
    jt.copy(o, out.at[i * b])
    return out


@pytest.mark.parametrize("n", [37, 5])
def test_copy_negative_origin_reads_pad(rng, n):
    x = data(rng, (n,), F32, edges=False)
    xp = jnp.pad(x, 1)
    check(stencil, [x], xp[:-2] + 2 * xp[1:-1] + xp[2:], rtol=1e-6)


@jt.kernel
def shift_left(x, *, b=16, pad=7.0):
    """Writes before the start of the output are dropped: out[j] = x[j + 1], out[-1] = pad."""
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n + 1, b))
    t = jt.fragment((b,), x.dtype)
    jt.copy(x.at[i * b], t, pad=pad)
    jt.copy(t, out.at[i * b - 1])
    return out


@pytest.mark.parametrize("n", [32, 37])
def test_copy_drops_writes_outside(rng, n):
    x = data(rng, (n,), F32)
    want = jnp.concatenate([x[1:], jnp.asarray([7.0], F32)])
    check(shift_left, [x], want, signed_zeros=True)


@jt.kernel
def shift_right(x, *, b=16):
    """out[0] = -1 and out[j] = x[j - 1]: written by two different kinds of write."""
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, b))
    t = jt.fragment((b,), x.dtype)
    jt.copy(x.at[i * b], t)
    out[0] = jnp.asarray(-1, x.dtype)
    jt.copy(t, out.at[i * b + 1])
    return out


def test_copy_shifted_output_covered_by_two_writes(rng):
    x = data(rng, (37,), F32)
    check(shift_right, [x], jnp.concatenate([jnp.asarray([-1.0], F32), x[:-1]]))


@jt.kernel
def on_chip_copies(x):
    """Copies between shared, fragment and local tiles, with sub-regions and origins."""
    out = jt.empty((8, 16), x.dtype)
    s = jt.shared((8, 16), x.dtype)
    f = jt.fragment((8, 16), x.dtype)
    loc = jt.local((4, 8), x.dtype)
    jt.copy(x, s)
    jt.copy(s.at[jt.ds(4, 4), :], f.at[jt.ds(0, 4), :])      # bottom half -> top
    jt.copy(s.at[jt.ds(0, 4), :], f.at[jt.ds(4, 4), :])      # top half -> bottom
    jt.copy(f.at[2, 4], loc)                                 # origin on a fragment
    loc[...] = loc[...] + 1
    jt.copy(loc, s.at[0, 8])                                 # origin on a shared tile
    jt.copy(s.at[jt.ds(0, 4), jt.ds(8, 8)], f.at[4, 0])
    jt.copy(f, out)
    return out


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_copies_between_on_chip_buffers(rng, dtype):
    x = data(rng, (8, 16), dtype, edges=False)
    xs = np.asarray(x)
    f = np.concatenate([xs[4:], xs[:4]])
    loc = (f[2:6, 4:12].astype(np.float64) + 1).astype(dtype)
    s = xs.copy()
    s[0:4, 8:16] = loc
    f[4:8, 0:8] = s[0:4, 8:16]
    check(on_chip_copies, [x], f)


@jt.kernel
def cast_copy(x, *, mid, rows=8, cols=16):
    """Global -> fragment of dtype ``mid`` -> shared of x's dtype -> global: casting copies."""
    m, n = x.shape
    bx, by = jt.grid(jt.cdiv(n, cols), jt.cdiv(m, rows))
    t = jt.fragment((rows, cols), mid)
    jt.copy(x.at[by * rows, bx * cols], t)
    out = jt.empty((m, n), mid)
    jt.copy(t, out.at[by * rows, bx * cols])
    back = jt.empty((m, n), x.dtype)
    s = jt.shared((rows, cols), x.dtype)
    jt.copy(t, s)
    jt.copy(s, back.at[by * rows, bx * cols])
    return out, back


def _copy_cast_check(rng, src, mid):
    x = data(rng, RAGGED, src)
    if src == F32:
        x = put(x, (5, slice(0, 16)), np.asarray(CAST_VALUES[:16], F32))
    conv = x.astype(mid)
    got, _ = check(cast_copy, [x], (conv, conv.astype(src)), {"mid": mid}, signed_zeros=True)
    assert_same(got, _numpy_cast(np.asarray(x), src, mid), signed_zeros=True, what="numpy")


@pytest.mark.parametrize("src,mid", [(F32, BF16), (F32, I32), (BF16, F32)],
                         ids=["f32-bf16", "f32-i32", "bf16-f32"])
def test_copy_casts(rng, src, mid):
    """Copies cast to the destination dtype, on the fast path and at the ragged edges."""
    _copy_cast_check(rng, src, mid)


def test_copy_cast_f32_to_bool(rng):
    _copy_cast_check(rng, F32, BOOL)


@jt.kernel
def uninitialised_scratch(x, *, b=8):
    """Reads a fragment before writing it: the reference gives zeros (scratch is fresh in
    every block)."""
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, b))
    acc = jt.fragment((b,), x.dtype)
    t = jt.fragment((b,), x.dtype)
    jt.copy(x.at[i * b], t)
    acc[...] += t[...]
    jt.copy(acc, out.at[i * b])
    return out


def test_scratch_is_fresh_in_every_block(rng):
    x = data(rng, (32,), F32, edges=False)
    check(uninitialised_scratch, [x], x)


def test_copy_with_two_origins_is_an_error():
    @jt.kernel
    def two_origins(x):
        out = jt.empty(x.shape, x.dtype)
        jt.copy(x.at[0, 0], out.at[0, 0])
        return out

    with pytest.raises(jt.KernelError, match="tile origins"):
        two_origins(jnp.ones((4, 4), F32))


@jt.kernel
def _total(x):
    """One scalar output per call, written from a rank-0 tile."""
    out = jt.empty((), jnp.float32)
    t = jt.fragment((), jnp.float32)
    t[...] = jnp.sum(x[...])
    jt.copy(t, out)
    return out


def test_scalar_output_of_a_vmapped_kernel(rng, kernel_backend):
    """Under vmap the scalar output is an element of a batched output, copied at its edge
    path (a rank-0 copy, which has no last dimension to vectorise)."""
    x = jnp.asarray(rng.standard_normal((3, 4, 7)), jnp.float32)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.vmap(_total)))(x), np.asarray(x).sum(-1),
                               rtol=1e-5, atol=1e-5)
