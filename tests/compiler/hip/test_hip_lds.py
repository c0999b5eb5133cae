"""The wave64 LDS bank model (compiler/hip/lds.py) and the conflict-free LDS layouts of MFMA
operand tiles."""

import pytest

from jaxtile.compiler import target
from jaxtile.compiler.hip import lds, mfma


@pytest.mark.parametrize("width", [4, 8, 16])
def test_consecutive_lanes_on_consecutive_addresses_are_conflict_free(width):
    addresses = [lane * width for lane in range(64)]
    assert lds.cycles(addresses, width) == lds.ideal_cycles(width) == 64 * width // 128


def test_conflicts_counted_per_phase():
    # b32, stride 128 bytes: the 32 lanes of each half all hit bank 0 at distinct dwords.
    assert lds.cycles([lane * 128 for lane in range(64)], 4) == 2 * 32
    # Every lane on one dword: a broadcast, one cycle per phase.
    assert lds.cycles([256] * 64, 4) == 2
    # b64, stride 64 bytes: 16 lanes of a phase on banks {0, 1} and {16, 17}: 8 cycles each.
    assert lds.cycles([lane * 64 for lane in range(64)], 8) == 4 * 8
    # b128: lanes 0..7 then 8..15 are separate phases, so lane 8 reusing lane 0's banks is
    # free, while two lanes of one phase 128 bytes apart conflict.
    assert lds.cycles([(lane % 8) * 16 for lane in range(64)], 16) == 8
    assert lds.cycles([(lane % 2) * 128 for lane in range(64)], 16) == 8 * 2
    assert lds.cycles([None] * 63 + [0], 4) == 1


def test_bad_accesses_are_errors():
    with pytest.raises(ValueError, match="4, 8 or 16"):
        lds.cycles([0] * 64, 2)
    with pytest.raises(ValueError, match="aligned"):
        lds.cycles([4] * 64, 8)
    with pytest.raises(ValueError, match="64 lanes"):
        lds.cycles([0] * 32, 4)


def _layouts():
    for gfx in ("gfx90a", "gfx942"):
        for shape in target.parse_target(f"hip:{gfx}").caps.mfma:
            yield pytest.param(mfma.layout(shape), id=f"{gfx}-{shape.instruction}")


@pytest.mark.parametrize("layout", list(_layouts()))
@pytest.mark.parametrize("depth_bytes", [64, 128, 256])
def test_mfma_operand_reads_are_conflict_free(layout, depth_bytes):
    # Every operand read of a tile whose rows hold depth_bytes of k-elements: each k-step of
    # the instruction, at each row offset a wave's tile may start at.
    width = layout.elements_per_lane * layout.element_bits // 8
    depth = depth_bytes * 8 // layout.element_bits
    tile = lds.operand_tile(layout, depth)
    for k0 in range(0, depth, layout.shape.k):
        for row0 in (0, layout.shape.m, 3 * layout.shape.m):
            addresses = lds.operand_read_addresses(layout, tile, k0, row0)
            assert lds.cycles(addresses, width) == lds.ideal_cycles(width), (k0, row0)
    # Without the padding the same reads conflict: the model sees what the layout avoids.
    plain = lds.OperandTile(depth, tile.element_bytes, depth_bytes)
    assert lds.cycles(lds.operand_read_addresses(layout, plain, 0), width) > \
        lds.ideal_cycles(width)
