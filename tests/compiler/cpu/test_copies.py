"""``jt.copy``'s bounds tests in the CPU lowering (``compiler/cpu/copies.py``): a test the
static shapes (and the static grid, through the block index's range) decide is not emitted,
so neither TVM nor LLVM compile a path that never runs; the copy still reads the pad past
the end and drops writes there."""

import re

import jax.numpy as jnp
import numpy as np
from gemm_kernels import matmul

import jaxtile as jt
from jaxtile.compiler import build
from jaxtile.compiler.target import parse_target

N, TILE = 1000, 1024
TILES = {"bm": 64, "bn": 64, "bk": 64}


@jt.kernel
def whole_tile(x):
    """One block: the tile runs 24 elements past x's end (read as pad) and the output is
    a full tile; then the tile goes back into a copy of x's length (24 writes dropped)."""
    out = jt.empty((TILE,), x.dtype)
    back = jt.empty((N,), x.dtype)
    t = jt.fragment((TILE,), x.dtype)
    jt.copy(x.at[0], t, pad=-2.0)
    jt.copy(t, out.at[0])
    jt.copy(t, back.at[0])
    return out, back


def test_statically_decided_bounds_emit_no_test():
    x = jnp.arange(N, dtype=jnp.float32)
    out, back = whole_tile(x)
    want = np.concatenate([np.arange(N, dtype=np.float32), np.full(TILE - N, -2.0, np.float32)])
    np.testing.assert_array_equal(np.asarray(out), want)
    np.testing.assert_array_equal(np.asarray(back), np.arange(N, dtype=np.float32))
    source = build.source(whole_tile.lower(x).kernel, parse_target("cpu"))
    # Every start is the constant 0: which copies fit is known, so no test of constants
    # (the copies that cross x's end take only the masked path, out's only the plain one).
    assert not re.search(r"T\.And\(T\.bool|if T\.bool", source), source
    assert "if " in source   # the masked paths still test each element


def test_tiles_the_grid_keeps_inside_emit_no_masked_path():
    # 256 / 64: every block's tiles lie inside A, B and C, which the block index's range
    # (the static grid) proves, so the copies' masked paths (their pad selects, their
    # per-element tests) are not emitted; at 250 they are, and the edges come out right.
    rng = np.random.default_rng(0)
    for size, masked in ((256, False), (250, True)):
        a = jnp.asarray(rng.standard_normal((size, size)), jnp.float32)
        b = jnp.asarray(rng.standard_normal((size, size)), jnp.float32)
        got = np.asarray(matmul(a, b, **TILES))
        want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3)
        source = build.source(matmul.lower(a, b, **TILES).kernel, parse_target("cpu"))
        assert ("T.Select" in source) == masked, source
        assert ("else:" in source) == masked, source
