"""Contiguous reductions (``compiler/cpu/reductions.py``): the loop over a row's whole
chunks is unrolled in the TIR when the chunks hold at most ``UNROLLED_VECTORS`` vectors
(LLVM's O2 pipeline, which the backend compiles with, leaves it rolled) and stays a loop
beyond that; either way the sums are those of numpy, on rows holding NaN and inf."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import build
from jaxtile.compiler.cpu import reductions
from jaxtile.compiler.target import parse_target


@jt.kernel
def row_sums_of_squares(x, *, rows=4):
    n = x.shape[1]
    out = jt.empty((x.shape[0],), x.dtype)
    i = jt.grid(jt.cdiv(x.shape[0], rows))
    t = jt.fragment((rows, n), jnp.float32)
    s = jt.fragment((rows,), jnp.float32)
    jt.copy(x.at[i * rows, 0], t)
    v = t[...]
    s[...] = jnp.sum(v * v, axis=1)
    jt.copy(s, out.at[i * rows])
    return out


def _chunk_loops(source: str) -> list[str]:
    """How the TIR iterates over the reduction's chunks: ``T.unroll`` or ``range``."""
    return re.findall(r"for c\d+ in (T\.unroll|range)\(", source)


@pytest.mark.parametrize("level, width", [("x86-64-v3", 8), ("x86-64-v4", 16)])
def test_chunks_are_unrolled_up_to_the_vector_budget(level, width):
    tgt = parse_target(f"cpu:{level}")
    budget = reductions.UNROLLED_VECTORS * width
    for columns, unrolled in ((budget, True), (2 * budget, False)):
        x = jnp.zeros((8, columns), jnp.float32)
        loops = _chunk_loops(build.source(row_sums_of_squares.lower(x).kernel, tgt))
        assert loops == ["T.unroll" if unrolled else "range"], (columns, loops)


@pytest.mark.parametrize("columns", [1024, 2048, 1000])
def test_sums_match_numpy(columns):
    """1024 columns are unrolled on AVX2 and AVX-512 hosts, 2048 only on AVX-512 ones;
    1000 leaves a tail past the whole chunks."""
    rng = np.random.default_rng(columns)
    x = rng.standard_normal((13, columns)).astype(np.float32)
    x[3, 7] = np.nan
    x[5, -1] = np.inf
    got = np.asarray(row_sums_of_squares(jnp.asarray(x)))
    want = np.sum(x.astype(np.float64) ** 2, axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert np.isnan(got[3]) and got[5] == np.inf
