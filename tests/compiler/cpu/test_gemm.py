"""The CPU GEMM's strip-major B panels (``compiler/cpu/gemm.py``: ``strip_panels``, and the
panel copy of ``compiler/cpu/copies.py``): which buffers take the layout, where it puts
each element, and GEMMs through it on AVX2 and AVX-512 code (``JAXTILE_CPU_ISA``) against a
float64 product, at shapes that divide the tiles and ragged ones, with NaN and infinities,
in float32 and bfloat16. A mutation (the gemm reading the panel as if it were row-major)
shows that these products notice a layout the two sides disagree on."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import _config
from jaxtile.compiler import build, target
from jaxtile.compiler.cpu import copies, gemm
from jaxtile.compiler.target import ISA_LEVELS, parse_target


def _requires(level):
    return pytest.mark.skipif(not set(ISA_LEVELS[level]) <= set(target.host_isa()),
                              reason=f"this CPU cannot run {level} code")


LEVELS = [pytest.param(level, marks=_requires(level)) for level in ("x86-64-v3", "x86-64-v4")]


@jt.kernel
def matmul(a, b, *, bm=64, bn=64, bk=32, scale_b=False):
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    j, i = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.loop(jt.cdiv(k, bk))
    def _(kk):
        jt.copy(a.at[i * bm, kk * bk], a_s)
        jt.copy(b.at[kk * bk, j * bn], b_s)
        if scale_b:     # an elementwise read and write of the panel: it stays row-major
            b_s[...] = b_s[...] * 2
        jt.gemm(a_s, b_s, acc)

    jt.copy(acc, c.at[i * bm, j * bn])
    return c


def _strips(target, dtype=jnp.float32, m=128, k=96, n=128, **params):
    x, y = jnp.zeros((m, k), dtype), jnp.zeros((k, n), dtype)
    tgt = parse_target(target)
    kernel = build.lowered_ir(matmul.lower(x, y, **params).kernel, tgt)
    return gemm.strip_panels(kernel, tgt.caps)


def test_which_panels_are_held_in_strips():
    # A register tile's columns: 2 x 8 lanes on AVX2, 2 x 16 on AVX-512.
    assert _strips("cpu:x86-64-v3") == {"smem1_panel": 16}
    assert _strips("cpu:x86-64-v4") == {"smem1_panel": 32}
    # bfloat16 widened into float32 panels for the FMA gemm (AVX2 has no bfloat16 dot).
    assert _strips("cpu:x86-64-v3", jnp.bfloat16) == {"smem1_panel": 16}
    # One strip (no layout to change), a width that is not a multiple of the strips', and
    # a panel that an elementwise op also reads and writes: row-major.
    assert _strips("cpu:x86-64-v3", bn=16) == {}
    assert _strips("cpu:x86-64-v3", bn=24) == {}
    assert _strips("cpu:x86-64-v3", scale_b=True) == {}
    # A panels are never B operands.
    assert all("smem1" in name for name in _strips("cpu:x86-64-v4", m=256, k=4096))


@pytest.mark.parametrize("shape, width", [((96, 64), 16), ((5, 32), 16), ((7, 96), 32)])
def test_strip_index_is_the_strip_major_offset(shape, width):
    """Against the offset written out: strip ``j // w`` after strip, each ``K`` rows of
    ``w``, a bijection onto the buffer."""
    rows, cols = shape
    seen = np.zeros(rows * cols, int)
    for k in range(rows):
        for j in range(cols):
            r, c = copies.strip_index(shape, width, k, j)
            assert 0 <= r < rows and 0 <= c < cols
            assert r * cols + c == (j // width) * rows * width + k * width + j % width
            seen[r * cols + c] += 1
    assert (seen == 1).all()


def _use(monkeypatch, level):
    monkeypatch.setenv("JAXTILE_CPU_ISA", level)
    with warnings.catch_warnings():
        warnings.simplefilter("error", _config.ConfigWarning)
        return parse_target(_config.cpu_target_name())


def _check(a, b, got):
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(invalid="ignore"):
        want = a64 @ b64
        bound = a.shape[1] * 2.0 ** -23 * (np.abs(a64) @ np.abs(b64))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)],
                                  want[~finite & ~np.isnan(want)])
    assert (np.abs(got[finite] - want[finite]) <= bound[finite]).all()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mkn, params", [
    ((128, 96, 128), {}),                          # dividing: 2 x 2 blocks, one panel of K
    ((70, 90, 100), {}),                           # ragged: masked copies into the panels
    ((20, 5000, 40), {"bm": 16, "bn": 32, "bk": 8}),  # panels of 256 and 136 of K
], ids=["tiles", "ragged", "k_panels"])
def test_f32_gemm_through_strips(monkeypatch, rng, level, mkn, params):
    _use(monkeypatch, level)
    m, k, n = mkn
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a[1, 3] = np.nan
    b[2, n - 1] = np.inf
    got = np.asarray(jax.jit(lambda x, y: matmul(x, y, **params))(a, b))
    assert np.isnan(got[1]).all() and np.isinf(got[[0, 2], n - 1]).all()
    _check(a, b, got)


@pytest.mark.parametrize("level", LEVELS)
def test_bf16_gemm_through_strips(monkeypatch, rng, level):
    tgt = _use(monkeypatch, level)
    a = jnp.asarray(rng.standard_normal((70, 90)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((90, 100)), jnp.bfloat16)
    b = b.at[5, 7].set(jnp.inf)
    got = np.asarray(jax.jit(matmul)(a, b))
    assert np.isinf(got[:, 7]).all() or np.isnan(got[:, 7]).any()
    _check(np.asarray(a, np.float32), np.asarray(b, np.float32), got)
    x, y = jnp.zeros((70, 90), jnp.bfloat16), jnp.zeros((90, 100), jnp.bfloat16)
    strips = gemm.strip_panels(build.lowered_ir(matmul.lower(x, y).kernel, tgt), tgt.caps)
    assert strips == ({} if tgt.caps.bf16_dot else {"smem1_panel": tgt.caps.vector_bits // 16})


@_requires("x86-64-v3")
def test_a_gemm_reading_the_panel_row_major_is_caught(monkeypatch, rng):
    """Mutation: the copy writes strips, the gemm reads row-major; the products above
    then fail (a fresh compiler version, so that nothing cached answers)."""
    _use(monkeypatch, "x86-64-v3")
    monkeypatch.setattr(gemm, "strip_index", lambda shape, width, k, j: [k, j])
    monkeypatch.setattr(build, "compiler_version", lambda: "mutated-strip-index")
    # A shape and a function of its own, so that no trace or kernel of the tests above
    # is reused.
    a = rng.standard_normal((73, 90)).astype(np.float32)
    b = rng.standard_normal((90, 100)).astype(np.float32)
    got = np.asarray(jax.jit(lambda x, y: matmul(x, y))(a, b))
    with pytest.raises(AssertionError):
        _check(a, b, got)


# --- register tiles of rows -----------------------------------------------------------------

@pytest.mark.parametrize("level", LEVELS)
def test_every_block_height_computes_every_row(monkeypatch, rng, level):
    """Last blocks of 1 to 16 rows and a few more (m = 64 + h rows): every remainder modulo
    the 8 and 6-row register tiles, so that every split of a block's rows (8 or 6-row tiles,
    then 4, then rows left to the i-k-j nest) is run and checked."""
    _use(monkeypatch, level)
    k, n = 40, 48
    b = rng.standard_normal((k, n)).astype(np.float32)
    f = jax.jit(lambda x, y: matmul(x, y, bm=64, bn=48, bk=32))
    for h in [*range(1, 17), 40, 63, 64]:
        a = rng.standard_normal((64 + h, k)).astype(np.float32)
        a[64 + h - 1, 0] = np.nan                       # the block's last row
        got = np.asarray(f(a, b))
        assert np.isnan(got[-1]).all() and not np.isnan(got[:-1]).any(), h
        _check(a, b, got)
