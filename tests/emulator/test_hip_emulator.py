"""The emulator's wave64 mode: hand-written HIP kernels (tests/emulator/kernels/wave64_emu.hip)
run with 64-lane waves, MFMA checked against AMD's Matrix Instruction Calculator's tables,
the LDS bank model against compiler/hip/lds.py, and each check bites on a mutation."""

import re
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from jaxtile.compiler.emulator import (
    Buffer,
    EmulatedKernel,
    EmulatorError,
    LaunchConfig,
    Scalar,
    ToolchainError,
)
from jaxtile.compiler.hip import lds, toolchain

# The MFMA reference tables are read by the tests of compiler/hip/mfma.py.
sys.path.insert(0, str(Path(__file__).parents[1] / "compiler" / "hip"))
from test_hip_mfma import _table  # noqa: E402

SOURCE = (Path(__file__).parent / "kernels" / "wave64_emu.hip").read_text()


def _build(name, params, grid=1, threads=64, source=SOURCE):
    return EmulatedKernel.build(source, name, params,
                                LaunchConfig((grid, 1, 1), (threads, 1, 1), warp_size=64),
                                file="wave64_emu.hip")


def _mutate(tag, old, new):
    lines = SOURCE.splitlines(keepends=True)
    (i,) = [i for i, line in enumerate(lines) if f"MUTATE:{tag}" in line]
    assert old in lines[i]
    lines[i] = lines[i].replace(old, new)
    return "".join(lines), i + 1


def _errors(report):
    return [f["message"] for f in report["findings"] if f["severity"] == "error"]


def test_shuffles_reduce_over_64_lanes():
    k = _build("wave_sums", [Buffer("x", "float32"), Buffer("out", "float32")], grid=2,
               threads=128)
    x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    out = np.zeros(8, np.float32)
    report = k.run(x, out)
    rows = x.reshape(4, 64)
    np.testing.assert_allclose(out[:4], rows.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[4:], rows[:, 63])
    # Two blocks of two waves, each with 6 butterflies, a shfl_down and a shfl_idx: the
    # collectives are wave-wide (32-lane warps would make twice as many).
    assert report["counters"]["warp_collectives"] == 2 * 2 * 8
    assert report["findings"] == []


def test_ballot_is_64_bits():
    k = _build("wave_ballot", [Buffer("x", "float32"), Buffer("out", "uint32")])
    x = np.where(np.arange(64) % 3 == 0, 1.0, -1.0).astype(np.float32)
    x[63] = 1.0
    out = np.zeros(4, np.uint32)
    k.run(x, out)
    bits = sum(1 << i for i in range(64) if x[i] > 0)
    assert (int(out[0]) | int(out[1]) << 32) == bits
    assert out[2:].tolist() == [1, 0]


def _registers(arch, instruction, matrix, values):
    """Each lane's registers holding ``values`` (a matrix) where the calculator puts them:
    (lanes, registers) of uint32 for 16-bit operands, float32 for the accumulator."""
    table = _table(arch, instruction, matrix)
    nregs = max(r for r, _, _ in table.values()) + 1
    if values.dtype == np.float32:
        out = np.zeros((64, nregs), np.float32)
        for (i, j), (reg, lane, _) in table.items():
            out[lane, reg] = values[i, j]
        return out
    out = np.zeros((64, nregs), np.uint32)
    bits = values.view(np.uint16)
    for (i, j), (reg, lane, low) in table.items():
        out[lane, reg] |= np.uint32(bits[i, j]) << np.uint32(low)
    return out


def _xf32(x):
    """float32 values with 10-bit mantissas (what xf32 multiplies exactly)."""
    return (x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.mark.parametrize("name,instruction,m,k,dtype", [
    ("mfma_16x16x16_f16", "v_mfma_f32_16x16x16_f16", 16, 16, np.float16),
    ("mfma_32x32x8_bf16", "v_mfma_f32_32x32x8_bf16", 32, 8, ml_dtypes.bfloat16),
    pytest.param("mfma_16x16x8_xf32", "v_mfma_f32_16x16x8_xf32", 16, 8, "xf32",
                 marks=pytest.mark.slow),
    pytest.param("mfma_32x32x4_xf32", "v_mfma_f32_32x32x4_xf32", 32, 4, "xf32",
                 marks=pytest.mark.slow)])
def test_mfma_matches_numpy_with_the_calculators_layouts(name, instruction, m, k, dtype):
    rng = np.random.default_rng(1)
    if dtype == "xf32":
        # Operands the instruction takes exactly, so the layouts alone decide the result;
        # their bits go in as 32-bit registers.
        a, b = _xf32(rng.standard_normal((m, k))), _xf32(rng.standard_normal((k, m)))
        regs = [_registers("cdna3", instruction, x, v).view(np.uint32)
                for x, v in (("A", a), ("B", b))]
    else:
        a = rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((k, m)).astype(dtype)
        regs = [_registers("cdna3", instruction, x, v) for x, v in (("A", a), ("B", b))]
    c = rng.standard_normal((m, m)).astype(np.float32)
    ab = np.concatenate([r.ravel() for r in regs])
    creg = _registers("cdna3", instruction, "C", c)
    d = np.zeros_like(creg)
    kernel = _build(name, [Buffer("ab", "uint32"), Buffer("c", "float32"),
                           Buffer("d", "float32")])
    kernel.run(ab, creg.ravel(), d.reshape(-1))
    got = np.zeros((m, m), np.float32)
    for (i, j), (reg, lane, _) in _table("cdna3", instruction, "D").items():
        got[i, j] = d[lane, reg]
    want = a.astype(np.float32) @ b.astype(np.float32) + c
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_missing_barrier_is_a_race():
    source, line = _mutate("barrier", "sync_threads();", "")
    k = _build("lds_reverse", [Buffer("x", "float32"), Buffer("out", "float32")],
               threads=128, source=source)
    with pytest.raises(EmulatorError, match="data race") as e:
        k.run(np.ones(128, np.float32), np.zeros(128, np.float32))
    assert any("shared array 's'" in m and f"wave64_emu.hip:{line + 1}" in m
               for m in _errors(e.value.report))


def test_intact_exchange_is_clean():
    k = _build("lds_reverse", [Buffer("x", "float32"), Buffer("out", "float32")], threads=128)
    x = np.arange(128, dtype=np.float32)
    out = np.zeros(128, np.float32)
    assert k.run(x, out)["findings"] == []
    np.testing.assert_array_equal(out, x[::-1])


def test_out_of_bounds_lds_read_is_reported():
    source, line = _mutate("index", "s[127 - t]", "s[128 - t]")
    k = _build("lds_reverse", [Buffer("x", "float32"), Buffer("out", "float32")],
               threads=128, source=source)
    with pytest.raises(EmulatorError, match="out-of-bounds read") as e:
        k.run(np.ones(128, np.float32), np.zeros(128, np.float32))
    assert any("shared array 's'" in m and f"wave64_emu.hip:{line}" in m and
               "[wave 0 lane 0]" in m for m in _errors(e.value.report))


def test_wave_divergent_barrier_is_a_deadlock():
    source, line = _mutate("barrier", "sync_threads();", "if (lane_id() < 32) sync_threads();")
    k = _build("lds_reverse", [Buffer("x", "float32"), Buffer("out", "float32")],
               threads=128, source=source)
    # Lanes 32..63 of each wave also read LDS unordered after the barrier they skipped (a
    # race, reported too); the lanes waiting in it never get the other 64.
    with pytest.raises(EmulatorError) as e:
        k.run(np.ones(128, np.float32), np.zeros(128, np.float32))
    (msg,) = [m for m in _errors(e.value.report) if m.startswith("deadlock")]
    assert f"wave64_emu.hip:{line}" in msg and "waits for 64 more" in msg


def test_uninitialised_lds_read_is_a_warning():
    source, line = _mutate("write", "s[t] = x[t];", "if (t < 64) s[t] = x[t];")
    k = _build("lds_reverse", [Buffer("x", "float32"), Buffer("out", "float32")],
               threads=128, source=source)
    report = k.run(np.ones(128, np.float32), np.zeros(128, np.float32))
    warnings = [f for f in report["findings"] if f["severity"] == "warning"]
    assert _errors(report) == [] and len(warnings) == 1
    assert "uninitialised read" in warnings[0]["message"]
    assert f"wave64_emu.hip:{line + 2}" in warnings[0]["message"]
    assert warnings[0]["count"] == 64 * 4  # wave 0 reads the 64 floats wave 1 did not write


def test_a_32_bit_mask_on_a_wave_is_reported():
    # CUDA's full mask names lanes 0..31 only: lanes 32..63 of the wave run the shuffle
    # outside its mask (what the generated reductions did before they said kFullMask).
    source, line = _mutate("mask", "shfl_xor(kFullMask", "shfl_xor(0xffffffffu")
    k = _build("wave_sums", [Buffer("x", "float32"), Buffer("out", "float32")], grid=2,
               threads=128, source=source)
    # Lanes 0..31 read lanes 32..63 at the first butterfly (xor 32), outside the mask.
    with pytest.raises(EmulatorError, match=f"wave64_emu.hip:{line}: .* reads lane 32, which "
                       "is not in the mask"):
        k.run(np.ones(256, np.float32), np.zeros(8, np.float32))


def test_warps_are_32_or_64_lanes():
    with pytest.raises(ToolchainError, match="warps of 32 or 64 lanes, not 48"):
        _ = LaunchConfig((1, 1, 1), (64, 1, 1), warp_size=48).mode_flags


@pytest.mark.parametrize("stride", [1, 2, 32])
def test_lds_bank_conflicts_follow_the_wave64_model(stride):
    k = _build("lds_stride", [Buffer("x", "float32"), Buffer("out", "float32"),
                              Scalar("stride", stride)])
    x = np.arange(1024, dtype=np.float32)
    out = np.zeros(64, np.float32)
    report = k.run(x, out)
    w, v = (np.arange(64) * stride) % 256, (np.arange(64) * stride) % 64
    np.testing.assert_array_equal(out, x[w] + x[4 * v] + x[4 * v + 1] + x[4 * v + 2]
                                  + x[4 * v + 3])
    by_line = {b["line"]: b for b in report["bank_conflicts"]}
    line = next(n for n, t in enumerate(SOURCE.splitlines(), 1) if "const float one" in t)
    for width, at, addresses in ((4, line, 4 * w), (16, line + 1, 16 * v)):
        want = lds.cycles([int(a) for a in addresses], width)
        got = by_line.get(at, {"wavefronts": lds.ideal_cycles(width)})
        assert got["wavefronts"] == want, (width, got)


def test_buffer_load_past_the_end_reads_zero():
    k = _build("buffer_tail", [Buffer("x", "float32"), Buffer("out", "float32"),
                               Scalar("n", 40)])
    x = np.arange(1, 65, dtype=np.float32)
    out = np.full(64, -1.0, np.float32)
    assert k.run(x, out)["findings"] == []
    np.testing.assert_array_equal(out, np.where(np.arange(64) < 40, x, 0.0))


def test_buffer_resource_past_the_allocation_is_reported():
    k = _build("buffer_tail", [Buffer("x", "float32"), Buffer("out", "float32"),
                               Scalar("n", 256)])
    with pytest.raises(EmulatorError, match="out-of-bounds read.*'x'"):
        k.run(np.ones(40, np.float32), np.zeros(64, np.float32))


def _lds_direct(n, grid, source=SOURCE):
    k = _build("lds_direct", [Buffer("x", "float32"), Buffer("out", "float32"),
                              Scalar("n", n)], grid=grid, threads=256, source=source)
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    if n > 2:  # non-finite values move through LDS bit for bit
        x[0], x[-1] = np.inf, np.nan
    out = np.full(n, -7.0, np.float32)
    return k, x, out


def _lds_direct_want(x):
    # An independent formula: out[i] = 2 x[j] with j = 256 b + 255 - t, where both are < n.
    n = x.size
    want = np.full(n, -7.0, np.float32)
    for i in range(n):
        j = 256 * (i // 256) + 255 - i % 256
        if j < n:
            want[i] = 2 * x[j]
    return want


@pytest.mark.parametrize("n, grid", [(512, 2), (300, 2)])
def test_lds_direct_loads_fill_the_lanes_slots(n, grid):
    # 4 waves of 64 lanes per block fill a 256-float LDS tile by LDS-direct loads and read
    # slots other waves filled; n = 300 leaves lanes of the last block without a load.
    k, x, out = _lds_direct(n, grid)
    assert k.run(x, out)["findings"] == []
    np.testing.assert_array_equal(out, _lds_direct_want(x))


# No wait, or a wait leaving the lane's newest load in flight (vmcnt 1 after one load).
@pytest.mark.parametrize("wait", ["", "wait_vmcnt<1>();"])
def test_lds_direct_read_before_the_wait_is_reported(wait):
    source, line = _mutate("lds_wait", "wait_vmcnt<0>();", wait)
    k, x, out = _lds_direct(512, 2, source)
    with pytest.raises(EmulatorError, match="cp.async hazard") as e:
        k.run(x, out)
    # The read of the tile (after the barrier) finds the loads still in flight.
    assert any("LDS-direct load" in m and "shared array 'tile'" in m and
               f"wave64_emu.hip:{line + 3}" in m for m in _errors(e.value.report))


def test_lds_direct_wrong_slot_is_reported():
    # Each wave's slots shifted by one float: the last wave's 64th slot is past the tile.
    source, line = _mutate("lds_slot", "warp_id() * kWarpSize)", "warp_id() * kWarpSize + 1)")
    k, x, out = _lds_direct(512, 2, source)
    with pytest.raises(EmulatorError, match=f"out-of-bounds write.*wave64_emu.hip:{line}.*'tile'"):
        k.run(x, out)


def test_lds_direct_overlapping_waves_are_a_race():
    # Waves given overlapping slots (32 floats apart): two lanes' loads write one slot.
    source, line = _mutate("lds_slot", "warp_id() * kWarpSize", "warp_id() * 32")
    k, x, out = _lds_direct(512, 2, source)
    with pytest.raises(EmulatorError, match="data race") as e:
        k.run(x, out)
    assert any("shared array 'tile'" in m and f"wave64_emu.hip:{line}" in m
               for m in _errors(e.value.report))


@pytest.mark.parametrize("n", [512, 300])
def test_lds_direct_buffer_loads_land_zeros_past_the_resource(n):
    k = _build("lds_direct_buffer", [Buffer("x", "float32"), Buffer("out", "float32"),
                                     Scalar("n", n)], grid=2, threads=256)
    x, out = _lds_direct(n, 2)[1:]
    assert k.run(x, out)["findings"] == []
    # out[i] = x[j], j = 256 b + 255 - t, or 0 where j is past the n floats
    i = np.arange(n)
    j = 256 * (i // 256) + 255 - i % 256
    want = np.where(j < n, x[np.minimum(j, n - 1)], np.float32(0))
    np.testing.assert_array_equal(out, want)


def test_lds_direct_buffer_resource_past_the_allocation_is_reported():
    source, line = _mutate("lds_rsrc", "n * 4)", "n * 4 + 4)")
    k = _build("lds_direct_buffer", [Buffer("x", "float32"), Buffer("out", "float32"),
                                     Scalar("n", 300)], grid=2, threads=256, source=source)
    x, out = _lds_direct(300, 2)[1:]
    with pytest.raises(EmulatorError, match="out-of-bounds read.*'x'"):
        k.run(x, out)


def test_lds_direct_source_past_the_end_is_reported():
    source, line = _mutate("lds_slot", "if (i < n) ", "")
    k, x, out = _lds_direct(300, 2, source)
    with pytest.raises(EmulatorError, match=f"out-of-bounds read.*wave64_emu.hip:{line}.*'x'"):
        k.run(x, out)


@pytest.mark.skipif(toolchain.clang_path() is None,
                    reason=f"no clang for AMD GPUs: {toolchain.INSTALL_HINT}")
def test_the_same_text_compiles_for_gfx942():
    code = toolchain.compile_hip(SOURCE, "gfx942", file="wave64_emu.hip")
    assert re.search(r"v_mfma_f32_16x16x16_?f16", code.assembly)
    assert {"wave_sums", "wave_ballot", "lds_reverse", "buffer_tail",
            "lds_direct"} <= set(code.kernels)
    # lds_direct: the wave's LDS base goes to M0 and the load is global_load_lds_dword.
    assert re.search(r"s_mov_b32 m0, s\d+", code.assembly)
    assert "global_load_lds_dword" in code.assembly
