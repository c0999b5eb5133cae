"""The wgmma accumulator layout (compiler/gpu/layout.py) against CuTe's GMMA CLayout_64xN,
the independent table re-tabulated in tests/emulator/test_hopper_primitives.py (the one the
emulator's wgmma is checked against), and the gemm planner's shared swizzle against the wgmma
K-major swizzled operand layout."""

import numpy as np
import pytest
from test_hopper_primitives import _SWIZZLE_BITS, _cute_swizzle, _tv_index

from jaxtile.compiler.gpu import gemm_plan
from jaxtile.compiler.gpu import layout as L


@pytest.mark.parametrize("n", [8, 64, 256])
def test_one_instruction_is_cutes_clayout(n):
    lay = L.wgmma_accumulator((64, n), (1, 1))
    assert lay.threads == 128 and lay.num_local == n // 2
    for t in range(128):
        for v in range(n // 2):
            idx = _tv_index(t, v)   # m + 64 n
            assert lay.coords(t, v) == (idx % 64, idx // 64)


def test_instructions_stack_along_m_and_warpgroups_split_the_tile():
    # 2 x 2 warpgroups over a 256 x 128 tile: each owns 128 x 64, two m64n64 instructions.
    lay = L.wgmma_accumulator((256, 128), (2, 2), threads=1024)
    assert lay.num_local == 2 * 32 and lay.replication == 2
    for t in range(512):
        wg, tt = divmod(t, 128)
        i, j = divmod(wg, 2)
        for mi in range(2):
            for v in range(32):
                idx = _tv_index(tt, v)
                want = (128 * i + 64 * mi + idx % 64, 64 * j + idx // 64)
                assert lay.coords(t, mi * 32 + v) == want
                assert lay.coords(t + 512, mi * 32 + v) == want   # the replica
    el = lay.elements().reshape(-1, 2)
    assert len({tuple(c) for c in el}) == 256 * 128   # every element held


def test_printed_form_round_trips():
    lay = L.wgmma_accumulator((128, 128), (2, 1), threads=256)
    assert lay.text() == "#wgmma(m64n128k16, warpgroups 2x1)"
    assert L.parse(lay.text(), (128, 128), 256) == lay


def test_tiles_that_do_not_split_are_refused():
    with pytest.raises(ValueError, match="m64n8"):
        L.wgmma_accumulator((96, 64), (1, 1))
    with pytest.raises(ValueError, match="warpgroups"):
        L.wgmma_accumulator((64, 64), (1, 1), threads=192)


@pytest.mark.parametrize("swizzle", [32, 64, 128])
@pytest.mark.parametrize("rows", [64, 128])
def test_planner_swizzle_is_the_wgmma_k_major_swizzle(swizzle, rows):
    """A K-major f16 tile whose rows are `swizzle` bytes, as the planner lays it out (and the
    copies write it), is the canonical wgmma operand: 8-row atoms of `swizzle`-byte rows, SBO
    = 8 * swizzle apart, under CuTe's Swizzle<B, 4, 3> (so wgmma can read what the copies
    write with no other staging)."""
    cols = swizzle // 2
    tile = gemm_plan.shared_tile(np.float16, rows, cols)
    assert tile.swizzled
    for r in range(rows):
        for k in range(cols):
            dense = (r // 8) * 8 * swizzle + (r % 8) * swizzle + 2 * k
            assert 2 * tile.offset(r, k) == _cute_swizzle(dense, _SWIZZLE_BITS[swizzle])
