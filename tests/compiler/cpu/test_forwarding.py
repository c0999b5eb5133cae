"""Forwarding with masked edges (``compiler/cpu/forwarding.py``, :class:`Edges`): a row
tile rounded up past the end of its rows is forwarded to global memory, the vector
straddling the end going through edge arrays and the vectors past it reading the pad and
storing nothing. Checked on the widths around the vector and tile sizes, on the host and on
x86-64-v3 (16 and 8 float32 lanes), against numpy formulas and the kernels' reference
semantics; rows start with +inf and NaN, which would spread into the row before them if a
read crossed a row's end, and blocks run last rows first, so that a write past a row's end
would land on a row written before.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import _config
from jaxtile.compiler import build, target
from jaxtile.compiler.target import ISA_LEVELS, parse_target

RUNNABLE = {level for level in ISA_LEVELS if set(ISA_LEVELS[level]) <= set(target.host_isa())}
BF16 = np.dtype(ml_dtypes.bfloat16)
PAD = 0.5


def _level(monkeypatch, level):
    if level != "host" and level not in RUNNABLE:
        pytest.skip(f"this CPU cannot run {level} code")
    monkeypatch.setenv("JAXTILE_CPU_ISA", level)
    with warnings.catch_warnings():
        warnings.simplefilter("error", _config.ConfigWarning)
        return parse_target(_config.cpu_target_name())


@jt.kernel
def shift_by_row_sum(x, *, rows=4, cols=128):
    """``2 x + (sum of the row's tile)``: the tile's columns past the row's end read
    ``PAD``, which the sum counts. Block ``i`` handles the ``i``-th row tile from the end."""
    n_rows = x.shape[0]
    out = jt.empty(x.shape, x.dtype)
    blocks = jt.cdiv(n_rows, rows)
    i = jt.grid(blocks)
    r = (blocks - 1 - i) * rows
    t = jt.fragment((rows, cols), jnp.float32)
    jt.copy(x.at[r, 0], t, pad=PAD)
    v = t[...]
    t[...] = v * 2.0 + jnp.sum(v, axis=1, keepdims=True)
    jt.copy(t, out.at[r, 0])
    return out


@jt.kernel
def square_and_vector(x, b):
    """A 16 x 16 tile of ``x`` minus its row maxima (the pad, 0, counts), and 16 elements
    of ``b`` doubled: 16 rows, so the vector runs as the tile's rows do, and its loads and
    stores are at columns of no loop part (the checked paths)."""
    out = jt.empty(x.shape, x.dtype)
    out_b = jt.empty(b.shape, b.dtype)
    jt.grid(1)
    t = jt.fragment((16, 16), jnp.float32)
    u = jt.fragment((16,), jnp.float32)
    jt.copy(x.at[0, 0], t)
    jt.copy(b.at[0], u)
    v = t[...]
    t[...] = v - jnp.max(v, axis=1, keepdims=True)
    u[...] = u[...] * 2.0
    jt.copy(t, out.at[0, 0])
    jt.copy(u, out_b.at[0])
    return out, out_b


def _rows_with_specials(rng, n_rows, width, dtype):
    """Rows of normal numbers, rows 2 and 4 starting with +inf and NaN."""
    x = rng.standard_normal((n_rows, width)).astype(np.float32) * 3
    x[2, 0], x[4, 0] = np.inf, np.nan
    return jnp.asarray(x, dtype)


def _tolerance(dtype):
    return {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 2 ** -7,
                                                                     "atol": 1e-3}


def _check_special_rows(got, special_rows):
    """The rows that hold +inf or NaN are not finite throughout, the others finite
    throughout."""
    special = np.isin(np.arange(got.shape[0]), special_rows)
    assert not np.isfinite(got[special]).any()
    assert np.isfinite(got[~special]).all()


def _softmax_case(monkeypatch, rng, level, width, dtype):
    _level(monkeypatch, level)
    x = _rows_with_specials(rng, 11, width, dtype)
    got = np.asarray(jax.jit(jt.ops.softmax)(x), np.float64)
    xf = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(xf - xf.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    _check_special_rows(got, [2, 4])
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], **_tolerance(dtype))
    ref = np.asarray(jt.ops.softmax.reference(x), np.float64)
    np.testing.assert_allclose(got[ok], ref[ok], **_tolerance(dtype))


SOFTMAX_CASES = [("host", 1000, np.float32), ("host", 1, np.float32),
                 ("host", 1025, np.float32), ("host", 999, BF16),
                 ("x86-64-v3", 1001, np.float32), ("x86-64-v3", 7, BF16)]
WIDTHS = [1, 7, 999, 1000, 1001, 1023, 1025]


@pytest.mark.parametrize("level, width, dtype", SOFTMAX_CASES,
                         ids=[f"{lv}-{w}-{np.dtype(d).name}" for lv, w, d in SOFTMAX_CASES])
def test_softmax_on_ragged_rows(monkeypatch, rng, level, width, dtype):
    """``jt.ops.softmax`` pads its row tile to a multiple of 128 with -inf."""
    _softmax_case(monkeypatch, rng, level, width, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("level", ["host", "x86-64-v3"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16], ids=["f32", "bf16", "f16"])
def test_softmax_on_every_ragged_width(monkeypatch, rng, level, width, dtype):
    _softmax_case(monkeypatch, rng, level, width, dtype)


def _shift_case(monkeypatch, rng, level, width, dtype):
    _level(monkeypatch, level)
    cols = -(-width // 128) * 128
    x = _rows_with_specials(rng, 12, width, dtype)
    got = np.asarray(jax.jit(lambda v: shift_by_row_sum(v, cols=cols))(x), np.float64)
    xf = np.asarray(x, np.float32).astype(np.float64)
    want = 2 * xf + xf.sum(axis=1, keepdims=True) + PAD * (cols - width)
    _check_special_rows(got, [2, 4])
    ok = np.isfinite(want)
    # The float32 sum's rounding errors, relative to the sum of magnitudes it adds, on top
    # of the result's own rounding.
    magnitude = np.abs(xf).sum(axis=1, keepdims=True) + PAD * cols + 2 * np.abs(xf)
    bound = 2.0 ** -20 * magnitude + _tolerance(dtype)["rtol"] * np.abs(want)
    ref = np.asarray(shift_by_row_sum.reference(x, cols=cols), np.float64)
    for result in (got, ref):
        assert (np.abs(result - want) <= bound)[ok].all()


SHIFT_CASES = [("host", 1000, np.float32), ("host", 7, np.float32), ("host", 1023, BF16),
               ("x86-64-v3", 999, np.float32), ("x86-64-v3", 1025, np.float32)]


@pytest.mark.parametrize("level, width, dtype", SHIFT_CASES,
                         ids=[f"{lv}-{w}-{np.dtype(d).name}" for lv, w, d in SHIFT_CASES])
def test_the_pad_is_read_and_nothing_is_written_past_the_end(monkeypatch, rng, level, width,
                                                              dtype):
    """The sum counts the pad in every column past the end; the blocks run last rows
    first, so a store past a row's end would overwrite the start of a row already
    written, and a load past it would read the next row's +inf or NaN."""
    _shift_case(monkeypatch, rng, level, width, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("level", ["host", "x86-64-v3"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["f32", "bf16"])
def test_every_ragged_width_reads_the_pad(monkeypatch, rng, level, width, dtype):
    _shift_case(monkeypatch, rng, level, width, dtype)


@pytest.mark.parametrize("level", ["host", "x86-64-v3"])
def test_columns_of_no_loop_part_are_masked(monkeypatch, rng, level):
    """A 16-element vector forwarded beside a 16 x 16 tile, 10 columns of each inside:
    its loads and stores are at the row index, which no loop part names, so they take the
    selecting load and the tested store."""
    _level(monkeypatch, level)
    x = rng.standard_normal((16, 10)).astype(np.float32)
    b = rng.standard_normal((10,)).astype(np.float32)
    x[3, 9] = np.nan
    got, got_b = jax.jit(square_and_vector)(x, b)
    want = x - np.maximum(np.nanmax(x, axis=1, keepdims=True), 0.0)
    want[3] = np.nan
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(np.asarray(got_b), b * 2)
    ref, ref_b = square_and_vector.reference(x, b)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
    np.testing.assert_array_equal(np.asarray(got_b), np.asarray(ref_b))


@pytest.mark.parametrize("level, lanes", [("host", None), ("x86-64-v3", 8)])
def test_the_ragged_softmax_is_forwarded(monkeypatch, level, lanes):
    """The softmax on 1000 columns (row tile 1024) runs forwarded, with an edge array of
    one vector per row for the loads and one for the stores."""
    tgt = _level(monkeypatch, level)
    lanes = lanes or tgt.caps.vector_bits // 32
    x = jnp.zeros((4096, 1000), jnp.float32)
    source = build.source(jt.ops.softmax.lower(x).kernel, tgt)
    edges = re.findall(r"(edge_(?:in|out)\d+) = T\.alloc_buffer\(\((\d+), (\d+)\)", source)
    assert sorted(name[:-len(re.sub(r"\D", "", name))] for name, _, _ in edges) == \
        ["edge_in", "edge_out"]
    ((rows, columns),) = {(int(r), int(c)) for _, r, c in edges}   # rows: the op's tiles
    assert columns == lanes and rows > 1
    # The forwarded rows read x and write out0 directly, in whole vectors.
    assert re.search(rf"out0\[s\d+ \+ row\d+, i\d+ \* {lanes} \+ v\d+\] =", source)
