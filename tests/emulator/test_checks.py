"""Each check of the emulator bites: mutations of correct kernels are reported."""

import numpy as np
import pytest
from emu_kernels import block_sum, gemm, kernel_source, marked_line, mutate, softmax

from jaxtile.compiler.emulator import Buffer, EmulatedKernel, EmulatorError, LaunchConfig


def _gemm_args(M, N, K):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    return a, b, np.zeros((M, N), np.float32)


def _wait_off_by_one():
    return mutate(kernel_source("gemm_f16"), "wait", "cp_async_wait<STAGES - 2>",
                  "cp_async_wait<STAGES - 1>")


def _messages(report, severity="error"):
    return [f["message"] for f in report["findings"] if f["severity"] == severity]


def test_removed_barrier_is_a_race():
    src = mutate(kernel_source("gemm_f16"), "barrier", "jaxtile::sync_threads();", "")
    with pytest.raises(EmulatorError, match="data race") as e:
        gemm(128, 128, 96, src).run(*_gemm_args(128, 128, 96))
    races = [m for m in _messages(e.value.report) if m.startswith("data race")]
    assert races
    # The report names the shared array, both threads and both lines.
    assert any("shared array 'As'" in m or "shared array 'Bs'" in m for m in races)
    assert all(m.count("thread (") == 2 and m.count("gemm_f16.cu:") == 2 for m in races)


@pytest.mark.parametrize("stages", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_barrier_after_the_refill_is_a_write_after_read_race(stages):
    # The stage a refill overwrites was read by every warp in the previous iteration; with
    # the barrier after the refill instead of before it, a fast warp's cp.async overwrites it
    # while slower warps may still read it. The copy is issued before those reads' barrier but
    # lands (at its wait, two iterations on) after it, so it must be checked when issued.
    source = kernel_source("gemm_f16").replace("STAGES = 3,", f"STAGES = {stages},")
    src = mutate(source, "barrier", "jaxtile::sync_threads();", "")
    src = mutate(src, "refilled", "jaxtile::cp_async_commit();",
                 "jaxtile::cp_async_commit(); jaxtile::sync_threads();")
    with pytest.raises(EmulatorError, match="data race") as e:
        # stages + 1 k-tiles: the first refill of a stage read before (iteration 1) happens.
        gemm(128, 128, 32 * (stages + 1), src).run(*_gemm_args(128, 128, 32 * (stages + 1)))
    races = [m for m in _messages(e.value.report) if m.startswith("data race (write after read)")]
    assert races, _messages(e.value.report)
    issue_lines = {f"gemm_f16.cu:{n}" for n, line in enumerate(source.splitlines(), 1)
                   if "jaxtile::cp_async<16>" in line}
    # The write is the refill's cp.async; the read, an ldmatrix of the previous iteration.
    assert all(any(f"wrote at {loc}" in m for loc in issue_lines) for m in races)
    read_lines = {f"gemm_f16.cu:{n}" for n, line in enumerate(source.splitlines(), 1)
                  if "ldmatrix_x4" in line}
    assert all(any(f"read at {loc}" in m for loc in read_lines) for m in races)


def test_wait_group_off_by_one_is_a_hazard():
    src = _wait_off_by_one()
    with pytest.raises(EmulatorError, match="cp.async hazard") as e:
        gemm(128, 128, 96, src).run(*_gemm_args(128, 128, 96))
    assert any("still in flight" in m for m in _messages(e.value.report))


def test_wait_group_off_by_one_gives_stale_data_with_checks_off():
    # Without the hazard check the copy still lands only at its wait: the result is wrong,
    # not right by luck.
    src = _wait_off_by_one()
    kernel = gemm(128, 128, 96, src)
    a, b, c = _gemm_args(128, 128, 96)
    kernel.set_checks(False)
    try:
        kernel.run(a, b, c)
    finally:
        kernel.set_checks(True)
    assert not np.allclose(c, a.astype(np.float32) @ b.astype(np.float32), atol=1e-2)


def test_out_of_bounds_is_reported_with_its_line():
    source = kernel_source("softmax_rows")
    src = mutate(source, "oob", "y[int64_t(row) * n + c]", "y[int64_t(row) * n + c + 1]")
    x = np.zeros((3, 40), np.float32)
    storage = np.full(128, -7.0, np.float32)  # y, then a guard the kernel must not touch
    y = storage[:120].reshape(3, 40)
    with pytest.raises(EmulatorError, match="out-of-bounds write") as e:
        softmax(3, 40, src).run(x, y)
    line = marked_line(source, "oob")
    msg = _messages(e.value.report)[0]
    assert f"softmax_rows.cu:{line}" in msg and "global buffer 'y'" in msg
    assert "byte offset 480" in msg  # one past the end of 3 x 40 floats
    assert (storage[120:] == -7.0).all()  # the bad write did not happen


def test_barrier_in_a_branch_is_a_deadlock():
    source = kernel_source("block_sum")
    src = source.replace(
        "    if (t < s) buf[t] += buf[t + s];\n    jaxtile::sync_threads();",
        "    if (t < s) {\n      buf[t] += buf[t + s];\n      jaxtile::sync_threads();\n    }",
    )
    assert src != source
    with pytest.raises(EmulatorError, match="deadlock") as e:
        block_sum(2, src).run(np.ones(256, np.float32), np.zeros(2, np.float32))
    msg = _messages(e.value.report)[0]
    assert "barrier 0 at block_sum.cu:" in msg
    assert "reached by threads 0-63" in msg and "threads 64-127 exited" in msg


def test_shuffle_mask_omitting_active_lanes_is_reported():
    source = kernel_source("softmax_rows")
    src = mutate(source, "mask", "jaxtile::kFullMask", "0x0000ffffu")
    with pytest.raises(EmulatorError, match="mask") as e:
        softmax(4, 64, src).run(np.zeros((4, 64), np.float32), np.zeros((4, 64), np.float32))
    where = f"softmax_rows.cu:{marked_line(source, 'mask')}"
    messages = _messages(e.value.report)
    # Lanes 0-15 complete the shuffle among themselves but read lanes outside the mask;
    # lanes 16-31 then execute it with a mask that leaves them out.
    assert any("reads lane 16, which is not in the mask" in m and where in m for m in messages)
    assert any("omits the calling lane" in m and where in m for m in messages)


def test_shuffle_after_some_lanes_exited_is_a_deadlock():
    source = kernel_source("softmax_rows")
    src = source.replace("if (row >= rows) return;", "if (row >= rows || lane >= 16) return;")
    assert src != source
    with pytest.raises(EmulatorError, match="deadlock") as e:
        softmax(4, 64, src).run(np.zeros((4, 64), np.float32), np.zeros((4, 64), np.float32))
    msg = _messages(e.value.report)[0]
    assert f"shfl_xor (mask 0xffffffff) at softmax_rows.cu:{marked_line(source, 'mask')}" in msg
    assert "reached by threads 0-15" in msg and "missing: threads 16-31 exited" in msg


_UNINIT = """
#include <jaxtile/device.h>
using jaxtile::ptr;
JT_KERNEL void halves(ptr<const float> x, ptr<float> y) {
  JT_SHARED(float, buf, 64);
  const int t = jaxtile::thread_idx().x;
  if (t < 32) buf[t] = x[t];
  jaxtile::sync_threads();
  y[t] = buf[t];
}
"""


def test_uninitialised_shared_read_is_a_warning():
    kernel = EmulatedKernel.build(
        _UNINIT, "halves", [Buffer("x", "float32"), Buffer("y", "float32")],
        LaunchConfig((8, 1, 1), (64, 1, 1)), file="halves.cu",
    )
    report = kernel.run(np.ones(64, np.float32), np.zeros(64, np.float32))
    warnings = _messages(report, "warning")
    assert _messages(report) == []
    assert len(warnings) == 1
    assert "uninitialised read" in warnings[0] and "halves.cu:9" in warnings[0]
    # 32 threads x 4 bytes each in every one of the 8 blocks (CPU threads run several blocks
    # in turn, reusing their shadow memory), counted under one finding.
    assert report["findings"][0]["count"] == 8 * 32 * 4


def test_unswizzled_tiles_show_bank_conflicts():
    source = kernel_source("gemm_f16")
    src = source.replace("((chunk ^ ((row >> 1) & 3)) << 3)", "(chunk << 3)")
    src = src.replace("((chunk ^ (row & 7)) << 3)", "(chunk << 3)")
    assert src.count("(chunk << 3)") == 2
    a, b, c = _gemm_args(128, 128, 64)
    report = gemm(128, 128, 64, src).run(a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-5, atol=1e-4)
    ldmatrix = {n for n, line in enumerate(src.splitlines(), 1) if "ldmatrix_x4" in line}
    banks = {s["line"]: s for s in report["bank_conflicts"]}
    assert len(ldmatrix) == 2
    for line in ldmatrix:
        # 128-byte (B) rows put all 8 rows of a phase in one bank group: 8-way conflicts;
        # 64-byte (A) rows two rows per group: 4-way (2 distinct words x ... per bank).
        assert banks[line]["wavefronts"] >= 4 * banks[line]["ideal_wavefronts"]
