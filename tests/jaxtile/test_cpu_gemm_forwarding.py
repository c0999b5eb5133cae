"""The first operand of a CPU gemm read from global memory instead of its copy
(``forwarding.gemm_operands``): which panels qualify (a float32 copy whose region stays
inside the source in every block, read only as the gemm's ``a``), that their copies are
left out of the code, and the products with it, plain and transposed, with edge values,
for AVX2 code and the host's, against the reference semantics and numpy."""

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
from jaxtile.compiler import build
from jaxtile.compiler.cpu import forwarding, lower
from jaxtile.compiler.target import ISA_LEVELS, host_isa, parse_target

TILES = {"bm": 64, "bn": 64, "bk": 64}


def _lowered(kernel, *args, **params):
    return build.lowered_ir(kernel.lower(*args, **params).kernel, parse_target("cpu"))


def _forwarded(kernel, *args, **params):
    """The source buffer of each forwarded operand."""
    return sorted(r.buffer for r in forwarding.gemm_operands(
        _lowered(kernel, *args, **params)).values())


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


def test_panels_that_pad_or_convert_are_copied():
    # The last row block of 70 rows overhangs A: its copy pads with zeros.
    assert _forwarded(matmul, jnp.zeros((70, 192), F32), jnp.zeros((192, 64), F32),
                      **TILES) == []
    # K of 90 in panels of 64: the last one overhangs.
    assert _forwarded(matmul, jnp.zeros((64, 90), F32), jnp.zeros((90, 64), F32),
                      **TILES) == []
    # bfloat16 A is widened (or kept for the bf16 dot) by its copy.
    assert _forwarded(matmul, jnp.zeros((128, 192), BF16), jnp.zeros((192, 64), BF16),
                      **TILES) == []


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
    got = np.asarray(jax.jit(jt.ops.matmul_relu)(a, b))
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
