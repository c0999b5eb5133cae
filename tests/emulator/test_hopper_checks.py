"""Each Hopper check of the emulator bites: seeded mistakes in the sm_90a GEMM are reported
(or, for a wrong swizzle, give wrong numbers), and the correct kernel has no finding."""

import numpy as np
import pytest
from emu_kernels import kernel_source, marked_line, mutate
from hopper_kernels import gemm_args, gemm_sm90a

from jaxtile.compiler.emulator import EmulatorError

# 4 k-tiles around the 2-stage ring: every stage is refilled once.
M, N, K = 128, 64, 256
SOURCE = kernel_source("gemm_sm90a")


def _errors(src):
    with pytest.raises(EmulatorError) as e:
        gemm_sm90a(M, N, K, src).run(*gemm_args(M, N, K))
    return [f["message"] for f in e.value.report["findings"] if f["severity"] == "error"]


def _at(tag):
    return f"gemm_sm90a.cu:{marked_line(SOURCE, tag)}"


def test_the_correct_kernel_has_no_finding():
    args = gemm_args(M, N, K)
    report = gemm_sm90a(M, N, K).run(*args)
    assert report["findings"] == []
    a, b, c = args[3:]
    np.testing.assert_allclose(c, a.astype(np.float32) @ b.astype(np.float32).T, rtol=1e-5,
                               atol=1e-4)


def test_waiting_on_the_wrong_phase_is_a_deadlock_naming_the_barrier():
    # The producer waits for the parity of the stage's current use instead of the previous
    # one: it runs a phase ahead, and the consumers wait for a phase nobody completes.
    errors = _errors(mutate(SOURCE, "phase", "(kt / STAGES - 1) & 1", "(kt / STAGES) & 1"))
    deadlock = [m for m in errors if m.startswith("deadlock")]
    assert deadlock, errors
    assert "mbarrier 'full'" in deadlock[0] and "(initialised at gemm_sm90a.cu:" in deadlock[0]
    assert "for the phase of parity" in deadlock[0] and "waits for 1 of 1 arrivals" in deadlock[0]


def test_missing_expect_tx_bytes_are_reported():
    # The full barrier expects A's bytes only: its phase completes before B's copy lands.
    errors = _errors(mutate(SOURCE, "expect", "STAGE_BYTES", "A_STAGE * 2"))
    assert any(m.startswith("TMA hazard") and "shared array 'Bs'" in m for m in errors), errors
    assert any("transaction bytes more than arrive_expect_tx announced" in m
               and f"(at {_at('expect')})" in m for m in errors), errors


@pytest.mark.slow
def test_a_byte_count_that_never_completes_is_a_deadlock():
    errors = _errors(mutate(SOURCE, "expect", "STAGE_BYTES", "STAGE_BYTES + 16"))
    assert any(m.startswith("deadlock") and "16 transaction bytes never completed" in m
               for m in errors), errors


def test_missing_proxy_fence_is_reported():
    errors = _errors(mutate(SOURCE, "fence", "jaxtile::fence_proxy_async();", ""))
    assert any(m.startswith("missing fence.proxy.async") and "shared array 'Cs'" in m
               for m in errors), errors


def test_wrong_swizzle_in_the_descriptor_gives_wrong_numbers():
    src = mutate(SOURCE, "swizzle", "16, 1024, 128)", "16, 1024, 64)")
    args = gemm_args(M, N, K)
    gemm_sm90a(M, N, K, src).run(*args)
    a, b, c = args[3:]
    expected = a.astype(np.float32) @ b.astype(np.float32).T
    # The consumer rows of A are permuted within 16-byte chunks: most results are wrong.
    assert np.mean(~np.isclose(c, expected, rtol=1e-3, atol=1e-2)) > 0.5


def test_reading_the_accumulator_before_wait_group_is_reported():
    errors = _errors(mutate(SOURCE, "wait", "wgmma_wait_group<0>", "wgmma_wait_group<1>"))
    assert any(m.startswith("wgmma accumulator accessed too early") for m in errors), errors


def test_missing_wgmma_fence_is_reported():
    src = SOURCE.replace("    jaxtile::wgmma_fence();\n", "")
    assert src != SOURCE
    errors = _errors(src)
    assert any(m.startswith("missing wgmma_fence") for m in errors), errors


def test_setmaxnreg_over_budget_is_reported():
    # 40 + 2 x 256 registers per thread of 3 warpgroups exceed the block's 384 x 168: the
    # second consumer waits for registers forever.
    errors = _errors(mutate(SOURCE, "inc", "setmaxnreg_inc<232>", "setmaxnreg_inc<256>"))
    assert any("setmaxnreg_inc<256> for registers other warpgroups never free" in m
               and "of the block's pool of 64512" in m for m in errors), errors


@pytest.mark.slow
def test_setmaxnreg_count_must_be_a_multiple_of_8_in_range():
    errors = _errors(mutate(SOURCE, "inc", "setmaxnreg_inc<232>", "setmaxnreg_inc<228>"))
    assert any("not a multiple of 8 in [24, 256]" in m and _at("inc") in m for m in errors), errors


def test_releasing_a_stage_before_its_wgmma_retired_is_a_race():
    # The consumers arrive on the empty barrier before wgmma_wait_group: the producer's next
    # TMA into the stage may land while the async proxy still reads it. The wgmma's operands
    # count as read until the wait that retires it, so the refill races with them.
    src = mutate(SOURCE, "release", "jaxtile::mbarrier_arrive(empty + s);", "")
    src = mutate(src, "wait", "jaxtile::wgmma_wait_group<0>();",
                 "jaxtile::mbarrier_arrive(empty + s); jaxtile::wgmma_wait_group<0>();")
    errors = _errors(src)
    tma_lines = [n for n, line in enumerate(SOURCE.splitlines(), 1) if "tma_load_2d" in line]
    races = [m for m in errors if m.startswith("data race (write after read)")]
    assert races, errors
    assert all(any(f"wrote at gemm_sm90a.cu:{n}" in m for n in tma_lines) for m in races)
    assert all("read at gemm_sm90a.cu:" in m for m in races)


@pytest.mark.slow
def test_an_accumulator_index_out_of_range_is_reported():
    src = SOURCE.replace("cs[row * BN + col] = acc[i];", "cs[row * BN + col] = acc[i + 1];")
    assert src != SOURCE
    errors = _errors(src)
    assert any("wgmma accumulator index 32 at gemm_sm90a.cu:" in m
               and "outside the 32 registers of an m64n64 accumulator" in m for m in errors), errors
