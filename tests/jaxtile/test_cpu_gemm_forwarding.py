"""The first operand of a CPU gemm read from global memory instead of its copy
(``forwarding.gemm_operands``): which panels qualify (a float32 copy of a region that starts
inside the source in every block, read only as the gemm's ``a``; rows past the source's end
only where they feed no output), that their copies are left out of the code, and the
products with it, plain and transposed, on ragged sizes, with edge values and with sources
followed by NaN in memory, for AVX2 code and the host's (and bfloat16 panels on the paths
that re-lay them), against the reference semantics and numpy; mutation tests show the row
proof and the K tail's pad are what keep them right."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemm_kernels import matmul
from language_helpers import BF16, F32, data

import jaxtile as jt
from jaxtile import _config
from jaxtile.compiler import build, cache
from jaxtile.compiler.cpu import forwarding, lower
from jaxtile.compiler.target import ISA_LEVELS, host_isa, parse_target

TILES = {"bm": 64, "bn": 64, "bk": 64}


def _lowered(kernel, *args, **params):
    return build.lowered_ir(kernel.lower(*args, **params).kernel, parse_target("cpu"))


def _forwarded(kernel, *args, caps=None, **params):
    """The source buffer of each forwarded operand (for a target of ``caps``)."""
    return sorted(r.src.buffer for r in forwarding.gemm_operands(
        _lowered(kernel, *args, **params), caps).values())


def test_a_panels_inside_the_source_are_forwarded():
    a, b = jnp.zeros((128, 192), F32), jnp.zeros((192, 64), F32)
    assert _forwarded(matmul, a, b, **TILES) == ["a"]
    # The K loop too deep for one panel: the copies stay in the loop, and still qualify
    # (the loop variable's range keeps every panel inside A), as does the remainder panel.
    assert _forwarded(matmul, jnp.zeros((64, 5000), F32), jnp.zeros((5000, 64), F32),
                      bm=64, bn=64, bk=8) == ["a", "a"]
    # transposed A: panels of (bk, bm) columns of A
    assert _forwarded(jt.ops.matmul, jnp.zeros((192, 128), F32), b, transpose_a=True,
                      bm=64, bn=64, bk=64) == ["a"]


def _operands(kernel, *args, **params):
    return list(forwarding.gemm_operands(_lowered(kernel, *args, **params)).values())


def test_ragged_panels_are_forwarded_with_masked_edges():
    # The last row block of 70 rows overhangs A, but only into accumulator rows that reach
    # no output (the gemm's live rows note): reads there are clamped to A's last row.
    (op,) = _operands(matmul, jnp.zeros((70, 192), F32), jnp.zeros((192, 64), F32), **TILES)
    assert (op.src.buffer, op.clamp_rows, op.k_tail) == ("a", True, False)
    # K of 90 in panels of 64: the last one overhangs, its columns past K are the pad.
    (op,) = _operands(matmul, jnp.zeros((64, 90), F32), jnp.zeros((90, 64), F32), **TILES)
    assert (op.clamp_rows, op.k_tail) == (False, True)
    # The quickstart's 1000 x 700 x 900 with its table's tiles: both edges.
    (op,) = _operands(jt.ops.matmul_relu, jnp.zeros((1000, 700), F32),
                      jnp.zeros((700, 900), F32), bm=64, bn=64, bk=64, stages=2)
    assert (op.clamp_rows, op.k_tail) == (True, True)
    # Transposed A: its rows axis is the region's second.
    (op,) = _operands(jt.ops.matmul, jnp.zeros((90, 70), F32), jnp.zeros((90, 64), F32),
                      transpose_a=True, **TILES)
    assert (op.rows_axis, op.clamp_rows, op.k_tail) == (1, True, True)


def test_panels_that_convert_or_feed_live_rows_past_the_end_are_copied():
    # bfloat16 A is widened by its copy for the FMA path, on a target without the bfloat16
    # dot (the gemm would widen each element again for every tile of columns).
    a, b = jnp.zeros((128, 192), BF16), jnp.zeros((192, 64), BF16)
    assert _forwarded(matmul, a, b, **TILES) == []
    assert _forwarded(matmul, a, b, caps=parse_target("cpu:x86-64-v4").caps, **TILES) == []
    # The output has more rows than A: its rows past A's end are live, and a clamped read
    # would give them A's last row where the copy's zeros give 0.
    assert _forwarded(tall_matmul, jnp.zeros((70, 96), F32), jnp.zeros((96, 64), F32)) == []


@jt.kernel(threads=128)
def tall_matmul(a, b, *, bm=64, bn=64, bk=32):
    """``C = A @ B`` into an output of 128 rows whatever A's: rows of C past A's end are
    zero (A's copies pad its rows past the end with zeros)."""
    k, n = b.shape
    c = jt.empty((128, n), jnp.float32)
    j, i = jt.grid(jt.cdiv(n, bn), 128 // bm)
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.loop(jt.cdiv(k, bk))
    def _(kk):
        jt.copy(a.at[i * bm, kk * bk], a_s)
        jt.copy(b.at[kk * bk, j * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    jt.copy(acc, c.at[i * bm, j * bn])
    return c


@jt.kernel(threads=128)
def padded_matmul(a, b, *, bm=32, bn=32, bk=64):
    """``C = A @ B`` through copies that pad A with 1.5 and B with 0.5: every element of C
    inside it gains ``0.75`` per K column past K in the last K step."""
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
        jt.copy(a.at[i * bm, kk * bk], a_s, pad=1.5)
        jt.copy(b.at[kk * bk, j * bn], b_s, pad=0.5)
        jt.gemm(a_s, b_s, acc)

    jt.copy(acc, c.at[i * bm, j * bn])
    return c


def _fresh_build(monkeypatch, tmp_path):
    """A cache of its own (a mutated compiler must not find the unmutated build). The
    mutants also run other shapes: a process keeps what it has loaded by content key, and
    the key does not see a monkeypatched compiler."""
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    cache.clear_memory()


def _tall_case(rng, k):
    a = np.asarray(data(rng, (70, k), F32, edges=False))
    b = np.asarray(data(rng, (k, 64), F32, edges=False))
    want = np.zeros((128, 64))
    want[:70] = np.asarray(a, np.float64) @ b
    return a, b, want


def test_live_rows_past_the_end_get_the_pad(monkeypatch, tmp_path, rng):
    """Rows 70..127 of the output are A's zero pad times B; and the check bites: with the
    row test mutated to pass, A is forwarded and those rows repeat A's last row."""
    a, b, want = _tall_case(rng, 96)
    _fresh_build(monkeypatch, tmp_path / "plain")
    got = np.asarray(jax.jit(tall_matmul)(a, b))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    a, b, want = _tall_case(rng, 80)
    _fresh_build(monkeypatch, tmp_path / "mutant")
    monkeypatch.setattr(forwarding, "_dead_past_end", lambda *args: True)
    assert _forwarded(tall_matmul, jnp.asarray(a), jnp.asarray(b)) == ["a"]
    mutant = np.asarray(jax.jit(tall_matmul)(a, b))
    np.testing.assert_allclose(mutant[:70], want[:70], rtol=1e-5, atol=1e-4)
    assert not np.allclose(mutant[70:], 0.0)


def _padded_case(rng, k):
    a = np.array(data(rng, (70, k), F32, edges=False))
    b = np.asarray(data(rng, (k, 40), F32, edges=False))
    a[5, 0], a[33, 0] = np.nan, np.inf
    return a, b, np.asarray(a, np.float64) @ b + (128 - k) * 0.75


def test_the_k_tail_multiplies_the_pad(monkeypatch, tmp_path, rng):
    """K = 90 in steps of 64: the 38 columns past K give 1.5 * 0.5 each. Rows 5 and 33 of
    A start with NaN and inf, which a read past a row's end would carry into the row
    before; with the K tail mutated into a read, it does."""
    a, b, want = _padded_case(rng, 90)
    (op,) = _operands(padded_matmul, jnp.asarray(a), jnp.asarray(b))
    assert (op.pad, op.clamp_rows, op.k_tail) == (1.5, True, True)
    _fresh_build(monkeypatch, tmp_path / "plain")
    got = np.asarray(jax.jit(padded_matmul)(a, b))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got, np.asarray(padded_matmul.reference(a, b)),
                               rtol=1e-5, atol=1e-4)
    a, b, want = _padded_case(rng, 91)
    _fresh_build(monkeypatch, tmp_path / "mutant")
    monkeypatch.setattr(forwarding, "gemm_k_parts",
                        lambda low, operand, k, live_k=None: [(0, k, True)])
    mutant = np.asarray(jax.jit(padded_matmul)(a, b))
    assert np.isnan(mutant[4]).all() and not np.isnan(want[4]).any()


def test_bfloat16_panels_are_forwarded_where_the_gemm_re_lays_them():
    """The bfloat16-dot and AMX gemms re-lay A into pairs of K first: they read A from
    global memory as they would from its panel, once per element."""
    a, b = jnp.zeros((128, 192), BF16), jnp.zeros((192, 64), BF16)
    for cpu in ("cpu:sapphirerapids", "cpu"):
        caps = parse_target(cpu).caps
        if caps.bf16_dot:
            assert _forwarded(matmul, a, b, caps=caps, **TILES) == ["a"]
    (op,) = forwarding.gemm_operands(_lowered(padded_matmul, jnp.zeros((70, 90), BF16),
                                              jnp.zeros((90, 40), BF16)),
                                     parse_target("cpu:sapphirerapids").caps).values()
    assert (op.pad, op.clamp_rows, op.k_tail) == (1.5, True, True)


def _padded_bf16_case(rng, k):
    """``_padded_case`` in bfloat16, its expected product from the rounded inputs."""
    a, b, _ = _padded_case(rng, k)
    a, b = a.astype(BF16), b.astype(BF16)
    return a, b, np.asarray(a, np.float64) @ np.asarray(b, np.float64) + (128 - k) * 0.75


def test_a_forwarded_bfloat16_panel_takes_the_pad_past_k(relaying, monkeypatch, tmp_path,
                                                         rng):
    """On the paths that re-lay A (AMX's tiles, emulated, and ``vdpbf16ps``): K = 90 in
    steps of 64 and 70 rows in blocks of 32, both edges masked; the 38 columns past K give
    1.5 * 0.5 each; NaN and inf that start rows 5 and 33 stay in their rows; with the
    operands followed by NaN in memory nothing past their ends is read. With the K tail
    mutated into a read, NaN reaches the row before and past the end of A."""
    def bound(a, b):   # float32 sums of 128 products, the pad's included
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return 128 * 2.0 ** -23 * (np.abs(a64) @ np.abs(b64) + 38 * 0.75)

    a, b, want = _padded_bf16_case(rng, 90)
    _fresh_build(monkeypatch, tmp_path / "plain")
    assert _forwarded(padded_matmul, jnp.asarray(a), jnp.asarray(b),
                      caps=parse_target("cpu").caps) == ["a"]
    got = np.asarray(jax.jit(lambda x, y: padded_matmul(x, y))(a, b))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite])
    assert (np.abs(got - want)[finite] <= bound(a, b)[finite]).all()
    a[5, 0] = a[33, 0] = 1.0
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64) + 38 * 0.75
    got = np.asarray(jax.jit(lambda x, y: padded_matmul(x, y))(_before_nans(a),
                                                                _before_nans(b)))
    assert (np.abs(got - want) <= bound(a, b)).all()
    a, b, _ = _padded_bf16_case(rng, 91)
    _fresh_build(monkeypatch, tmp_path / "mutant")
    monkeypatch.setattr(forwarding, "gemm_k_parts",
                        lambda low, operand, k, live_k=None: [(0, k, True)])
    mutant = np.asarray(jax.jit(lambda x, y: padded_matmul(x, y))(a, b))
    assert np.isnan(mutant[4]).all()


def test_the_forwarded_copy_is_left_out():
    a, b = jnp.zeros((128, 192), F32), jnp.zeros((192, 64), F32)
    lowered = _lowered(matmul, a, b, **TILES)
    (panel,) = forwarding.gemm_operands(lowered)
    tir = lower.source(lowered, parse_target("cpu"))
    stores = set(re.findall(r"^\s*(\w+)\[[^\]]*\] = ", tir, re.M))
    # B's panel is still filled (the other copy), A's is not, and A is read where it is.
    panels = {s for s in stores if s.endswith("_panel")}
    assert len(panels) == 1 and panel not in panels
    assert not re.search(rf"\b{panel}\[", tir) and re.search(r"\ba\[", tir)


def _use(monkeypatch, level):
    if level != "host":
        if not set(ISA_LEVELS[level]) <= set(host_isa()):
            pytest.skip(f"this CPU cannot run {level} code")
        monkeypatch.setenv("JAXTILE_CPU_ISA", level)
    else:
        monkeypatch.delenv("JAXTILE_CPU_ISA", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", _config.ConfigWarning)
        return parse_target(_config.cpu_target_name())


def _check(got, a, b, want_ref):
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    want = a64 @ b64
    finite = np.isfinite(want)
    # NaN and inf where the float64 product has them (an edge value in the row of A)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    bound = a.shape[1] * 2.0 ** -23 * (np.abs(a64) @ np.abs(b64))
    assert (np.abs(got[finite] - want[finite]) <= bound[finite]).all()
    np.testing.assert_allclose(got, want_ref, rtol=1e-5, atol=1e-4)


@pytest.mark.slow   # 9 s each; the default run has forwarded products in test_cpu_isa.py
@pytest.mark.parametrize("level", ["x86-64-v3", "host"])  # and test_cpu_copy_reuse.py
def test_products_with_a_forwarded(monkeypatch, rng, level):
    _use(monkeypatch, level)
    m, k, n = 128, 192, 128
    a = np.array(data(rng, (m, k), F32, edges=False))
    b = np.asarray(data(rng, (k, n), F32, edges=False))
    a[5, 7], a[70, 100], a[127, 191] = np.inf, np.nan, -np.inf   # rows 5, 70, 127 of C
    got = np.asarray(jax.jit(lambda x, y: matmul(x, y, **TILES))(a, b))
    _check(got, a, b, np.asarray(matmul.reference(a, b, **TILES)))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(np.asarray(
        jnp.matmul(a, b, precision="highest"))), rtol=1e-5, atol=1e-4)
    # Transposed A through the library kernel (its panels are (bk, bm) columns of A).
    at = np.ascontiguousarray(a.T)
    got = np.asarray(jax.jit(lambda x, y: jt.ops.matmul(x, y, transpose_a=True, **TILES))(
        at, b))
    _check(got, a, b, np.asarray(jt.ops.matmul.reference(at, b, transpose_a=True, **TILES)))


@pytest.mark.slow
@pytest.mark.parametrize("level", ["x86-64-v3", "host"])
def test_matmul_relu_ragged_with_the_tables_tiles(monkeypatch, rng, level):
    """The quickstart's 1000 x 700 x 900 with the tiles its table gives (64 x 64 x 64 on
    AVX2): interior row blocks read A where it is, the last one (40 rows) copies it."""
    _use(monkeypatch, level)
    a = np.array(data(rng, (1000, 700), F32, edges=False))
    b = np.asarray(data(rng, (700, 900), F32, edges=False))
    a[3, 5], a[999, 699], a[500, 0] = np.nan, np.inf, -np.inf
    got = np.asarray(jax.jit(lambda x, y: jt.ops.matmul_relu(x, y))(a, b))  # a new trace
    want = np.maximum(np.asarray(a, np.float64) @ np.asarray(b, np.float64), 0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)],
                                  want[~finite & ~np.isnan(want)])
    bound = 700 * 2.0 ** -23 * (np.abs(np.asarray(a, np.float64)) @ np.abs(b)) + 1e-30
    assert (np.abs(got[finite] - want[finite]) <= bound[finite]).all()
    # The reference sums in its own order: sums of 700 products of size ~4 differ by ~1e-4.
    np.testing.assert_allclose(got, np.asarray(jt.ops.matmul_relu.reference(a, b)),
                               rtol=1e-5, atol=1e-3)


SIZES = (1, 7, 63, 64, 65, 999, 1000)


@pytest.mark.slow   # 7 shapes x 2 dtypes, about a second each to compile
@pytest.mark.parametrize("level", ["x86-64-v3", "host"])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_matmul_relu_on_ragged_sizes(monkeypatch, rng, level, dtype):
    """``jt.ops.matmul_relu`` with its table's tiles on every size of ``SIZES`` in each of
    M, K and N (rotated, so each axis takes each size once), against float64 numpy of the
    same (rounded) inputs: NaN and inf inside A propagate to their rows, and to no other
    (a read past a row's end would carry them into the row before)."""
    _use(monkeypatch, level)
    for r in range(len(SIZES)):
        m, k, n = SIZES[r], SIZES[(r + 3) % 7], SIZES[(r + 5) % 7]
        a = np.array(data(rng, (m, k), dtype, edges=False))
        b = np.asarray(data(rng, (k, n), dtype, edges=False))
        a[m // 2, 0] = np.nan
        a[m - 1, k - 1] = np.inf
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        # a new trace per level: jax's cache of traces does not see JAXTILE_CPU_ISA
        got = np.asarray(jax.jit(lambda x, y: jt.ops.matmul_relu(x, y))(a, b), np.float64)
        with np.errstate(invalid="ignore"):
            want = np.maximum(a64 @ b64, 0)
            want[np.isnan(a64 @ b64)] = np.nan
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{m, k, n}")
        finite = np.isfinite(want)
        np.testing.assert_array_equal(got[~finite], want[~finite], err_msg=f"{m, k, n}")
        # float32 sums of k products, then rounded to the output dtype
        ulp = 2.0 ** -23 if dtype == F32 else 2.0 ** -8
        with np.errstate(invalid="ignore"):
            bound = k * 2.0 ** -23 * (np.abs(a64) @ np.abs(b64)) + ulp * np.abs(want) + 1e-30
            assert (np.abs(got - want)[finite] <= bound[finite]).all(), (m, k, n)


@pytest.mark.slow   # 4 shapes, about a second each to compile
@pytest.mark.parametrize("level", ["x86-64-v3", "host"])
def test_transposed_a_on_ragged_sizes(monkeypatch, rng, level):
    """``jt.ops.matmul(a, b, transpose_a=True)`` where ``a`` is (K, M): the forwarded panel's
    rows axis is its second, clamped past M, and its K tail runs along its first."""
    _use(monkeypatch, level)
    for m, k, n in ((65, 999, 7), (1000, 63, 64), (7, 1000, 999), (999, 65, 1)):
        at = np.array(data(rng, (k, m), F32, edges=False))
        b = np.asarray(data(rng, (k, n), F32, edges=False))
        at[0, m // 2] = np.nan
        a64 = np.asarray(at, np.float64).T
        (op,) = _operands(jt.ops.matmul, jnp.asarray(at), jnp.asarray(b), transpose_a=True,
                          **TILES)
        assert op.rows_axis == 1
        got = np.asarray(jax.jit(lambda x, y: jt.ops.matmul(x, y, transpose_a=True, **TILES))(
            at, b), np.float64)
        with np.errstate(invalid="ignore"):
            want = a64 @ np.asarray(b, np.float64)
            bound = k * 2.0 ** -23 * (np.abs(a64) @ np.abs(b)) + 2.0 ** -23 * np.abs(want)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{m, k, n}")
        finite = np.isfinite(want)
        assert (np.abs(got - want)[finite] <= bound[finite] + 1e-30).all(), (m, k, n)


def _before_nans(x):
    """``x`` as a jax array whose buffer is followed by NaN: a 64-byte aligned numpy view
    of a NaN-filled block, which ``jax.device_put`` takes without a copy on the CPU."""
    raw = np.full(x.size + 4096, np.nan, x.dtype)
    start = (-raw.ctypes.data % 64) // x.itemsize
    view = raw[start:start + x.size].reshape(x.shape)
    view[...] = x
    out = jax.device_put(view)
    assert out.unsafe_buffer_pointer() == view.ctypes.data, "jax copied the view"
    return out


def test_nothing_past_the_sources_end_is_read(monkeypatch, tmp_path, rng):
    """A's and B's buffers followed by NaN: the K tail of A's last row lies past its
    buffer, where the pad is taken, and the result has no NaN; with the K tail mutated into
    a read, the last row is NaN."""
    a, b, want = _padded_case(rng, 90)
    a[5, 0] = a[33, 0] = 1.0
    want = np.asarray(a, np.float64) @ b + 38 * 0.75
    _fresh_build(monkeypatch, tmp_path / "plain")
    got = np.asarray(jax.jit(padded_matmul)(_before_nans(a), _before_nans(b)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    # The quickstart's kernel, both edges ragged (its bucket's tiles)
    a2 = np.asarray(data(rng, (130, 100), F32, edges=False))
    b2 = np.asarray(data(rng, (100, 70), F32, edges=False))
    got = np.asarray(jax.jit(jt.ops.matmul_relu)(_before_nans(a2), _before_nans(b2)))
    np.testing.assert_allclose(got, np.maximum(np.asarray(a2, np.float64) @ b2, 0),
                               rtol=1e-5, atol=1e-4)
    a, b, _ = _padded_case(rng, 91)
    a[5, 0] = a[33, 0] = 1.0
    _fresh_build(monkeypatch, tmp_path / "mutant")
    monkeypatch.setattr(forwarding, "gemm_k_parts",
                        lambda low, operand, k, live_k=None: [(0, k, True)])
    mutant = np.asarray(jax.jit(padded_matmul)(_before_nans(a), _before_nans(b)))
    assert np.isnan(mutant[-1]).all() and not np.isnan(mutant[:-1]).any()
