"""The wave64 LDS bank model (compiler/hip/lds.py) and the conflict-free LDS layouts of MFMA
operand tiles."""

import jax.numpy as jnp
import pytest

from jaxtile.compiler import target
from jaxtile.compiler.gpu import gemm_plan
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
    with pytest.raises(ValueError, match="2, 4, 8 or 16"):
        lds.cycles([0] * 64, 1)
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


def test_sub_dword_reads_are_served_like_dwords():
    # Lanes 2 bytes apart share dwords: a half-wave's 32 lanes read 16 dwords in 16 banks.
    assert lds.cycles([2 * lane for lane in range(64)], 2) == lds.ideal_cycles(2) == 2
    # Two lanes of one half-wave on one bank at distinct dwords: a 2-way conflict.
    assert lds.cycles([0 if lane == 0 else 128 if lane == 1 else 4 * lane
                       for lane in range(64)], 2) == 3


def _transposed_reads(p, stored, k0, rotate=True):
    """Byte addresses of each LDS read gemm_mfma (tile_gemm.h) issues for op(B) when B is
    stored [K, N] (read_k's TRANS branch: one read per value), one list of 64 per read, for
    the K step at k0: lane l of wave w reads column col0 + ni S + l % S; its read j is row
    k0 + v g + (j + rot) % v of the v = 16 / itemsize values of its 16 bytes of k, g = l // S
    its lane group, rot = 4 for odd groups of 16-bit 16 x 16 instructions, else 0."""
    size, per = p.instr.mfma_size, 16 // stored.dtype.itemsize

    def rot(lane):
        return 4 * (lane // size % 2) if rotate and per == 8 and size == 16 else 0

    wn = p.warps[1]
    reads = []
    for w in range(p.warps[0] * p.warps[1]):
        col0 = (w % wn) * (p.n // wn)
        for ni in range(p.n // wn // size):
            for j in range(per):
                reads.append([stored.offset(k0 + per * (lane // size) + (j + rot(lane)) % per,
                                            col0 + ni * size + lane % size)
                              * stored.dtype.itemsize for lane in range(64)])
    return reads


def _b_kn_plans():
    for gfx, dtypes in (("gfx90a", (jnp.float16, jnp.bfloat16)),
                        ("gfx942", (jnp.float16, jnp.bfloat16, jnp.float32))):
        for dtype in dtypes:
            for m, n, k, threads, policy, slow in ((64, 64, 32, 128, "auto", False),
                                                   (64, 64, 32, 256, "rows", False),
                                                   (128, 128, 32, 256, "auto", True),
                                                   (64, 128, 64, 256, "auto", True),
                                                   (64, 128, 64, 256, "rows", True)):
                p = gemm_plan.plan_gemm(m, n, k, dtype, dtype, jnp.float32, threads,
                                        policy=policy,
                                        target=target.parse_target(f"hip:{gfx}"))
                yield pytest.param(p, id=f"{gfx}-{jnp.dtype(dtype).name}-{m}x{n}x{k}-"
                                   f"{p.instr.label}",
                                   marks=pytest.mark.slow if slow else ())


@pytest.mark.parametrize("p", list(_b_kn_plans()))
def test_b_stored_k_by_n_reads_are_conflict_free(p):
    """B stored [K, N] (jt.ops.matmul's default, attention's V): every read of the
    transposed operand (16-bit values, or xf32's 32-bit ones) from the planned (swizzled)
    tile is conflict-free. With 16 x 16 instructions a half-wave reads two k rows, which a
    plain row-major tile puts on the same banks; with 32 x 32 ones it reads one row, which
    no layout can make conflict (the plain tile is then conflict-free too)."""
    assert p.instr.mfma_size and not p.trans_b
    stored = p.b_tile
    width = stored.dtype.itemsize
    plain = gemm_plan.SharedTile(stored.dtype, stored.rows, stored.cols, False, 1)
    worst = 0
    for k0 in range(0, p.k, p.instr.k_step):
        for addresses in _transposed_reads(p, stored, k0):
            assert lds.cycles(addresses, width) == lds.ideal_cycles(width), k0
        worst = max(worst, *(lds.cycles(a, width) for a in _transposed_reads(p, plain, k0)))
    if p.instr.mfma_size == 16:
        assert worst > lds.ideal_cycles(width)
    else:
        assert worst == lds.ideal_cycles(width)
    if p.instr.mfma_size == 16 and width == 2:
        # Without gemm_mfma's rotated read order the swizzled tile conflicts too.
        assert max(lds.cycles(a, width) for a in _transposed_reads(p, stored, 0, False)) > \
            lds.ideal_cycles(width)
