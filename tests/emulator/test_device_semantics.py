"""Warp collectives, named barriers, atomics, dynamic shared memory, coordinates and launch
limits behave as CUDA defines them."""

import numpy as np
import pytest
from emu_kernels import kernel_source

from jaxtile.compiler.emulator import Buffer, EmulatedKernel, EmulatorError, LaunchConfig


def _build(name, params, grid, block, smem=0):
    return EmulatedKernel.build(
        kernel_source("warp_memory"), name, params, LaunchConfig(grid, block, smem),
        file="warp_memory.cu",
    )


def test_shuffles_and_votes_match_the_ptx_definitions():
    kernel = _build("warp_probe", [Buffer("x", "int32"), Buffer("arg", "int32"),
                                   Buffer("out", "int32")], (1, 1, 1), (64, 1, 1))
    rng = np.random.default_rng(0)
    x = rng.integers(-1000, 1000, 64).astype(np.int32)
    x[32:] = np.abs(x[32:]) + 1  # warp 1: every predicate true
    arg = rng.integers(0, 32, 64).astype(np.int32)
    out = np.zeros(8 * 64, np.int32)
    assert kernel.run(x, arg, out)["findings"] == []
    out = out.reshape(8, 64)
    lane = np.arange(64) % 32
    base = np.arange(64) - lane
    src = {
        "xor": lane ^ arg,
        "down": np.where(lane + arg <= 31, lane + arg, lane),
        "up": np.where(lane - arg >= 0, lane - arg, lane),
        "idx": arg & 31,
    }
    for k, name in enumerate(["xor", "down", "up", "idx"]):
        np.testing.assert_array_equal(out[k], x[base + src[name]], err_msg=name)
    pred = (x > 0).reshape(2, 32)
    ballots = [sum(1 << i for i in range(32) if pred[w, i]) for w in range(2)]
    np.testing.assert_array_equal(out[4], np.repeat(pred.all(axis=1), 32))
    np.testing.assert_array_equal(out[5], np.repeat(pred.any(axis=1), 32))
    np.testing.assert_array_equal(out[6].view(np.uint32), np.repeat(ballots, 32))
    np.testing.assert_array_equal(out[7], x[base + (lane ^ 1)])


@pytest.fixture(scope="module")
def named_groups():
    return _build("named_groups", [Buffer("x", "float32"), Buffer("mode", "int32"),
                                   Buffer("y", "float32")], (1, 1, 1), (128, 1, 1))


def test_named_barrier_orders_its_group(named_groups):
    x = np.arange(128, dtype=np.float32)
    y = np.zeros(128, np.float32)
    assert named_groups.run(x, np.array([0], np.int32), y)["findings"] == []
    np.testing.assert_array_equal(y, x[np.arange(128) ^ 32])


def test_named_barrier_does_not_order_other_groups(named_groups):
    x = np.arange(128, dtype=np.float32)
    # Group 0 passes its barrier and reads group 1's slots before group 1 wrote them.
    race = r"data race \(write after read\) on shared array 'buf'"
    with pytest.raises(EmulatorError, match=race):
        named_groups.run(x, np.array([1], np.int32), np.zeros(128, np.float32))


@pytest.mark.parametrize("synced", [True, False])
def test_sync_warp_orders_a_warp(synced):
    kernel = _build("warp_exchange", [Buffer("x", "float32"), Buffer("mode", "int32"),
                                      Buffer("y", "float32")], (1, 1, 1), (32, 1, 1))
    x = np.arange(32, dtype=np.float32)
    y = np.zeros(32, np.float32)
    mode = np.array([int(synced)], np.int32)
    if synced:
        kernel.run(x, mode, y)
        np.testing.assert_array_equal(y, x[np.arange(32) ^ 1])
    else:
        with pytest.raises(EmulatorError, match="data race"):
            kernel.run(x, mode, y)


def test_atomics_are_atomic_across_concurrent_blocks():
    blocks = 16
    kernel = _build("atomics", [Buffer("fsum", "float32"), Buffer("isum", "int32"),
                                Buffer("imax", "int32"), Buffer("per_block", "int32")],
                    (blocks, 1, 1), (128, 1, 1))
    fsum, isum = np.zeros(1, np.float32), np.zeros(1, np.int32)
    imax, per_block = np.full(1, -1, np.int32), np.zeros(blocks, np.int32)
    for _ in range(3):  # lost updates would show up as a smaller sum in some run
        fsum[:] = 0
        isum[:] = 0
        kernel.run(fsum, isum, imax, per_block)
        assert fsum[0] == 0.5 * 128 * blocks
        assert isum[0] == blocks * (127 * 128 // 2)
    assert imax[0] == (blocks - 1) * 1000 + 127
    np.testing.assert_array_equal(per_block, 128)


def test_coordinates_and_dynamic_shared_memory():
    grid, block = (2, 3, 2), (8, 4, 2)
    n = 64
    kernel = _build("coords", [Buffer("out", "int32"), Buffer("passed", "int32")], grid, block,
                    smem=n * 4)
    out = np.zeros(12 * n, np.int32)
    passed = np.zeros(12 * n, np.int32)
    kernel.run(out, passed)
    bz, by, bx, tz, ty, tx = np.meshgrid(range(2), range(3), range(2), range(2), range(4),
                                         range(8), indexing="ij")
    expected = tx + 10 * ty + 100 * tz + 1000 * bx + 10000 * by + 100000 * bz
    np.testing.assert_array_equal(out, expected.reshape(-1))
    t = np.arange(n)
    np.testing.assert_array_equal(passed.reshape(12, n),
                                  np.tile((t + 1) % n + 1000 * (t // 32) + 100000 * (t % 32),
                                          (12, 1)))


@pytest.mark.parametrize(
    "grid,block,smem,message",
    [
        ((1, 1, 1), (2048, 1, 1), 0, "at most 1024 threads"),
        ((1, 1, 1), (1, 1, 128), 0, "z <= 64"),
        ((1, 70000, 1), (32, 1, 1), 0, "65535"),
        ((1, 1, 1), (64, 1, 1), 300 * 1024, "227 KiB"),
    ],
)
def test_launch_limits(grid, block, smem, message):
    kernel = _build("coords", [Buffer("out", "int32"), Buffer("passed", "int32")], grid, block,
                    smem)
    size = grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2]
    with pytest.raises(EmulatorError, match=message):
        kernel.run(np.zeros(size, np.int32), np.zeros(size, np.int32))


def test_dtype_mismatch_is_rejected():
    kernel = _build("warp_exchange", [Buffer("x", "float32"), Buffer("mode", "int32"),
                                      Buffer("y", "float32")], (1, 1, 1), (32, 1, 1))
    with pytest.raises(ValueError, match="buffer 'x' must be float32"):
        kernel.run(np.zeros(32, np.float64), np.zeros(1, np.int32), np.zeros(32, np.float32))


def test_write_after_several_concurrent_readers_is_checked_against_each():
    kernel = _build("late_reader", [Buffer("x", "float32"), Buffer("y", "float32")],
                    (1, 1, 1), (128, 1, 1))
    with pytest.raises(EmulatorError, match=r"data race \(write after read\)") as e:
        kernel.run(np.ones(32, np.float32), np.zeros(128, np.float32))
    races = [f for f in e.value.report["findings"] if "write after read" in f["message"]]
    # The unordered readers are in warps 2 and 3, never warp 1 (ordered by the named barrier),
    # although warp 1 read last: every byte of the 32 floats is reported, not just those whose
    # last reader happened to be in warp 2 or 3.
    assert len(races) == 1 and sum(f["count"] for f in races) == 32 * 4
    assert "[warp 2" in races[0]["message"] or "[warp 3" in races[0]["message"]


@pytest.fixture(scope="module")
def vectors():
    return _build("vectors", [Buffer("x", "float32"), Buffer("shift", "int32"),
                              Buffer("y", "float32")], (1, 1, 1), (32, 1, 1))


def test_vector_accesses(vectors):
    x = np.arange(128, dtype=np.float32)
    y = np.zeros(128, np.float32)
    report = vectors.run(x, np.array([0], np.int32), y)
    np.testing.assert_array_equal(y.reshape(32, 4), x.reshape(32, 4)[np.arange(32) ^ 1])
    # 32 lanes x 16 bytes: 4 phases of 8 lanes, each served in one wavefront.
    banks = report["bank_conflicts"]
    assert len(banks) == 2
    assert all(s["wavefronts"] == s["ideal_wavefronts"] == 4 * s["instructions"] for s in banks)


def test_misaligned_vector_access_is_reported(vectors):
    with pytest.raises(EmulatorError, match="misaligned 16-byte access at warp_memory.cu:"):
        vectors.run(np.zeros(128, np.float32), np.array([1], np.int32),
                    np.zeros(128, np.float32))
