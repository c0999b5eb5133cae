"""The GEMM planner: instruction choice from target caps, warp policies, layouts, swizzles
(checked here against the bank rule itself; tests/emulator/test_tile_gemm.py runs them)."""

import dataclasses

import numpy as np
import pytest

from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu.gemm_plan import GemmInstr, plan_gemm, shared_tile
from jaxtile.compiler.gpu.layout import mma_accumulator, parse
from jaxtile.compiler.target import parse_target

SM80 = parse_target("cuda:sm_80")
SM90 = parse_target("cuda:sm_90")


def _plan(m=128, n=128, k=32, a="float16", b=None, acc="float32", threads=128, **kw):
    kw.setdefault("target", SM80)
    return plan_gemm(m, n, k, a, b or a, acc, threads, **kw)


@pytest.mark.parametrize("a,b,acc,k,instr", [
    ("float16", "float16", "float32", 32, GemmInstr.MMA16),
    ("bfloat16", "bfloat16", "float32", 32, GemmInstr.MMA16),
    ("float32", "float32", "float32", 8, GemmInstr.MMA_TF32),
    ("float16", "float16", "float32", 8, GemmInstr.FMA),      # K below one m16n8k16 step
    ("float16", "bfloat16", "float32", 32, GemmInstr.FMA),    # mixed inputs
    ("float64", "float64", "float64", 32, GemmInstr.FMA),
    ("int8", "int8", "int32", 32, GemmInstr.FMA),
])
def test_instruction_choice(a, b, acc, k, instr):
    assert _plan(k=k, a=a, b=b, acc=acc).instr == instr


def test_instructions_come_from_the_target_caps():
    assert _plan(target=SM90).instr == GemmInstr.MMA16  # sm_90 runs the sm_80 path
    no_mma = dataclasses.replace(SM80, caps=dataclasses.replace(SM80.caps, mma_shapes=()))
    assert _plan(target=no_mma).instr == GemmInstr.FMA
    only_tf32 = dataclasses.replace(SM80, caps=dataclasses.replace(
        SM80.caps, mma_shapes=(("m16n8k8", "tf32"),)))
    assert _plan(target=only_tf32).instr == GemmInstr.FMA
    assert _plan(a="float32", target=only_tf32).instr == GemmInstr.MMA_TF32


@pytest.mark.parametrize("m,n,threads,policy,warps", [
    (128, 128, 128, "square", (2, 2)),
    (128, 128, 128, "auto", (2, 2)),
    (128, 128, 128, "rows", (4, 1)),
    (128, 128, 128, "cols", (1, 4)),
    (128, 256, 256, "square", (2, 4)),   # 64x64 per warp beats 32x128
    (64, 256, 128, "square", (1, 4)),
    (256, 64, 128, "square", (4, 1)),
    (32, 128, 128, "rows", (2, 1)),      # only 2 row bands of 16: 2 replicas
    (16, 16, 256, "square", (1, 2)),
])
def test_warp_partition(m, n, threads, policy, warps):
    p = _plan(m, n, threads=threads, policy=policy)
    assert p.warps == warps
    assert p.replicas * warps[0] * warps[1] * 32 == threads
    assert p.acc_layout == mma_accumulator((m, n), warps, threads)


def test_accumulator_layout_prints_and_parses_back():
    for p in (_plan(), _plan(a="float32"), _plan(a="float64", acc="float64", policy="rows")):
        text = p.acc_layout.text()
        assert text == f"#mma({p.instr.label}, warps {p.warps[0]}x{p.warps[1]})"
        assert parse(text, (p.m, p.n), p.threads) == p.acc_layout


def test_gemm_rs_takes_the_accumulator_of_a_previous_gemm():
    # Flash attention: S = Q @ K^T (64 x 64 over d = 128), then O = P @ V with P in registers.
    s = _plan(64, 64, 128, trans_b=True, policy="rows")
    o = _plan(64, 128, 64, a_in_registers=True)
    assert o.policy == "rows" and o.warps == s.warps == (4, 1)
    assert o.a_layout == s.acc_layout
    assert o.a_tile is None
    # With two warp columns A is held by both: replicated across the columns (stride 32).
    o2 = _plan(64, 128, 64, a_in_registers=True, policy="square")
    assert o2.warps == (2, 2) and o2.a_layout.replication == 2
    owners, _ = o2.a_layout.owners()
    assert (owners[..., 1] - owners[..., 0] == 32).all()


@pytest.mark.parametrize("kw,msg", [
    (dict(policy="diagonal"), "unknown warp policy"),
    (dict(threads=100), "whole number of warps"),
    (dict(m=8), "16x8 atoms"),
    (dict(a="float32", a_in_registers=True), "A in registers"),
    (dict(k=8, a_in_registers=True), "K % 16"),
    (dict(target=parse_target("cpu")), "GPU targets, not cpu"),
    (dict(a="complex64"), "no GPU device type"),
    (dict(acc="float16"), "accumulate in float32"),
    (dict(acc="notatype"), "C has an unknown dtype"),
    (dict(a_in_registers=True, trans_a=True), "trans_a must be False"),
])
def test_errors(kw, msg):
    with pytest.raises(KernelError, match=msg):
        _plan(**kw)


def test_call_text():
    p = _plan(trans_b=True)
    assert p.call("As", "Bs", "acc") == (
        "jaxtile::gemm_ss<jaxtile::kGemmMma16, 128, 128, 32, 2, 2, false, true, "
        "jaxtile::SwizzledTile<jaxtile::half, 128, 32, 1>, "
        "jaxtile::SwizzledTile<jaxtile::half, 128, 32, 1>>(As, Bs, acc);")
    rs = _plan(64, 64, 32, a="bfloat16", a_in_registers=True)
    assert rs.call("p", "Vs", "o") == ("jaxtile::gemm_rs<64, 64, 32, 4, 1, false, "
                                       "jaxtile::SwizzledTile<jaxtile::bf16, 32, 64, 1>>"
                                       "(p, Vs, o);")
    assert p.smem_bytes == 2 * 128 * 32 * 2 and rs.smem_bytes == 32 * 64 * 2
    assert p.a_tile.cpp_offset("r", "c") == \
        "jaxtile::SwizzledTile<jaxtile::half, 128, 32, 1>::offset(r, c)"


def _groups(tile, cells):
    """The 16-byte bank groups (of 8 in a 128-byte line) the elements ``cells`` fall in."""
    return [tile.offset(r, c) * tile.dtype.itemsize // 16 % 8 for r, c in cells]


@pytest.mark.parametrize("dtype,cols", [("float16", 16), ("float16", 32), ("float16", 64),
                                        ("float16", 128), ("float16", 24), ("float16", 48),
                                        ("float16", 96), ("float16", 192), ("float16", 40),
                                        ("float32", 8), ("float32", 16), ("float32", 32),
                                        ("float32", 64), ("float32", 24), ("float32", 48)])
def test_swizzle_obeys_the_bank_rule(dtype, cols):
    tile = shared_tile(dtype, 64, cols)
    assert tile.swizzled
    vec = 16 // tile.dtype.itemsize
    chunks = cols // vec
    # ldmatrix: a phase reads 8 consecutive rows at one logical chunk.
    for r0 in range(0, 64, 8):
        for ch in range(chunks):
            assert len(set(_groups(tile, [(r0 + i, ch * vec) for i in range(8)]))) == 8
    # 16-byte cp.async: a phase of 8 lanes writes 8 consecutive chunks in row-major order.
    order = [(i // chunks, i % chunks * vec) for i in range(64 * chunks)]
    for p0 in range(0, len(order), 8):
        assert len(set(_groups(tile, order[p0:p0 + 8]))) == 8
    # Chunks stay whole: a 16-byte vector is contiguous after the swizzle.
    offs = tile.offsets()
    assert (np.diff(offs.reshape(64, chunks, vec), axis=-1) == 1).all()


@pytest.mark.parametrize("cols", [16, 32, 64, 128, 24, 48, 96])
def test_step2_swizzle_spreads_scalar_tf32_loads(cols):
    # tf32 operands that ldmatrix cannot transpose are read 4 rows x 8 columns per warp.
    tile, plain_step = shared_tile("float32", 32, cols, step=2), shared_tile("float32", 32, cols)
    for r0 in range(0, 32, 4):
        for c0 in range(0, cols, 8):
            cells = [(r0 + t, c0 + g) for t in range(4) for g in range(8)]
            assert len({tile.offset(r, c) % 32 for r, c in cells}) == 32
    conflicts = 0
    for c0 in range(0, cols, 8):
        cells = [(t, c0 + g) for t in range(4) for g in range(8)]
        conflicts += len({plain_step.offset(r, c) % 32 for r, c in cells}) < 32
    assert (conflicts > 0) == (cols != 24)  # step 1 would not do (6-chunk rows aside)


def test_planner_picks_step2_only_for_scalar_tf32_operands():
    steps = {}
    for ta in (False, True):
        for tb in (False, True):
            p = _plan(64, 64, 32, a="float32", trans_a=ta, trans_b=tb)
            steps[ta, tb] = (p.a_tile.step, p.b_tile.step)
    assert steps == {(False, False): (1, 2), (False, True): (1, 1), (True, False): (2, 2),
                     (True, True): (2, 1)}
    assert not shared_tile("float16", 8, 20).swizzled  # 40-byte rows: not whole chunks
