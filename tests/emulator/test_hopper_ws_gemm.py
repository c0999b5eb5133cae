"""The warp-specialised GEMM (tests/ws_gemm.py: 128 x 256 x 64 tiles, two consumer
warpgroups, the producer warpgroup the compiler adds) run as sm_90a code in the emulator,
against the kernel's reference semantics and a float64 numpy product, on shapes that do and
do not divide the tiles, with no emulator finding; and the seeded mistakes of a split the
emulator reports: the producer waiting on the wrong parity of "empty", consumers that never
release a stage or release it before reading it, a missing ``setmaxnreg.dec``, a consumer
budget past the block's registers (the CTA pool setmaxnreg moves them in)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ws_gemm import ws_gemm

from jaxtile import ops
from jaxtile.compiler.cuda import emulated
from jaxtile.compiler.emulator import EmulatedKernel, EmulatorError


def _operands(m, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((m, k)), dtype),
            jnp.asarray(rng.standard_normal((k, n)), dtype))


def _check(got, a, b, ref):
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    # the f32 sum is rounded once to the output type (half an ulp: 2^-9 of |C| for bf16,
    # 2^-12 for f16), plus f32 rounding in the sum
    rtol, atol = (4e-3, 2e-2) if a.dtype == jnp.bfloat16 else (1e-3, 4e-3)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol)
    np.testing.assert_allclose(np.asarray(ref, np.float64), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype, shape, stages", [
    (jnp.float16, (128, 256, 256), 2),     # dividing; 4 k-tiles wrap a 2-stage ring twice
    (jnp.bfloat16, (100, 72, 200), 2),     # ragged M, K, N: TMA's zero fill is the mask
])
def test_ws_gemm_runs_split(hopper, dtype, shape, stages):
    m, k, n = shape
    a, b = _operands(m, k, n, dtype)
    got = jax.jit(lambda x, y: ws_gemm(x, y, stages=stages))(a, b)
    src = hopper[-1]
    assert "JT_LAUNCH_BOUNDS(384, 1)" in src and "setmaxnreg_inc<232>" in src
    assert "wgmma_" in src and "tma_load_2d(" in src
    _check(got, a, b, ws_gemm.reference(a, b, stages=stages))


@pytest.mark.slow
@pytest.mark.parametrize("dtype, shape, stages", [
    (jnp.float16, (256, 320, 512), 3),     # 2 x 2 blocks, 5 k-tiles over 3 stages
    (jnp.bfloat16, (200, 136, 296), 4),    # ragged everywhere, more stages than k-tiles
])
def test_ws_gemm_runs_split_larger(hopper, dtype, shape, stages):
    m, k, n = shape
    a, b = _operands(m, k, n, dtype, seed=1)
    got = jax.jit(lambda x, y: ws_gemm(x, y, stages=stages))(a, b)
    assert "setmaxnreg_dec<40>" in hopper[-1]
    _check(got, a, b, ws_gemm.reference(a, b, stages=stages))


def _split_gemm():
    """The split kernel for 128 x 256 x 256 (f16), its arrays and the float64 product."""
    a, b = _operands(128, 256, 256, jnp.float16, seed=3)
    code = ws_gemm.lower(a, b, target="cuda:sm_90a")._gpu
    arrays = [np.asarray(a).view(np.float16), np.asarray(b).view(np.float16),
              np.zeros((128, 256), np.float16)]
    return code, arrays, np.asarray(a, np.float64) @ np.asarray(b, np.float64)


def _build(source: str, code, name: str) -> EmulatedKernel:
    params, launch = emulated.emulator_launch(code)
    return EmulatedKernel.build(source, code.symbol, params, launch, file=f"{name}.cu")


def test_the_unmutated_split_runs_clean():
    code, arrays, want = _split_gemm()
    report = _build(code.source, code, "ws_ok").run(*arrays)
    assert report["findings"] == []
    np.testing.assert_allclose(arrays[2].astype(np.float64), want, rtol=1e-3, atol=4e-3)


def _release_first(source: str) -> str:
    """The consumers' arrival on "empty" moved to right after their wait on "full": the
    producer refills a stage the consumers' wgmma may still read."""
    lines = source.splitlines()
    release = lines.pop(next(i for i, t in enumerate(lines) if "mbarrier_arrive(empty" in t))
    wait = next(i for i, t in enumerate(lines) if "has landed" in t)
    return "\n".join([*lines[:wait + 1], release, *lines[wait + 1:]])


@pytest.mark.parametrize("mutate, finding", [
    # the producer waits for parity (t / S) & 1 of "empty": its first refill of a stage
    # waits for a release of the tile it is about to load
    (lambda s: s.replace("& 1) ^ 1);  // its last tile", "& 1));  // its last tile"),
     "for the phase of parity 0 of mbarrier 'empty"),
    # the consumers never arrive on "empty": the third tile's refill waits forever
    (lambda s: s.replace("if (lane_id() == 0) mbarrier_arrive(", "if (false) mbarrier_arrive("),
     "waits for 8 of 8 arrivals"),
    (_release_first, "data race (write after read) on shared array"),
    # no setmaxnreg.dec: the consumers' increase never finds the registers
    (lambda s: s.replace("setmaxnreg_dec<40>();", ""),
     "in setmaxnreg_inc<232> for registers other warpgroups never free"),
    # 128 x 40 + 256 x 240 = 66560 registers: the second consumer warpgroup never gets its own
    (lambda s: s.replace("setmaxnreg_inc<232>", "setmaxnreg_inc<240>"),
     "in setmaxnreg_inc<240> for registers other warpgroups never free"),
    # 128 x 48 + 256 x 232 = 65536: within the register file, past the block's 384 x 168
    (lambda s: s.replace("setmaxnreg_dec<40>", "setmaxnreg_dec<48>"),
     "of the block's pool of 64512"),
])
def test_seeded_split_mistakes_are_reported(mutate, finding):
    code, arrays, _ = _split_gemm()
    bad = mutate(code.source)
    assert bad != code.source
    kernel = _build(bad, code, "ws_mutated")
    kernel.set_timeout(60)
    with pytest.raises(EmulatorError) as err:
        kernel.run(*arrays)
    text = str(err.value) + str(err.value.report)
    assert finding in text, text[:2000]


def test_a_stuck_split_leaves_no_stale_tma_marks_for_the_next_launch():
    """A split block that deadlocks with TMA loads in flight after its producer warpgroup
    exited (128 threads done), then, in the same thread, a 128-thread cp.async kernel: it
    starts on fresh shadow memory. (The emulator took "threads done == the new launch's
    threads" for a clean end and kept the stale in-flight marks: a TMA hazard in a kernel
    with no TMA.)"""
    # K = 128: two k-tiles in two stages, so the producer issues both and exits
    a, b = _operands(128, 128, 256, jnp.float16, seed=5)
    code = ws_gemm.lower(a, b, target="cuda:sm_90a")._gpu
    arrays = [np.asarray(a).view(np.float16), np.asarray(b).view(np.float16),
              np.zeros((128, 256), np.float16)]
    bad = re.sub(r"(mbarrier_arrive_expect_tx\([^,]+, )(\d+)\)",
                 lambda m: f"{m.group(1)}{int(m.group(2)) - 16})", code.source, count=1)
    assert bad != code.source
    with pytest.raises(EmulatorError, match="16 transaction bytes more"):
        _build(bad, code, "ws_stuck").run(*arrays)     # in this process: no timeout set
    a, b = _operands(70, 40, 90, jnp.float16, seed=4)
    plain = ops.matmul.lower(a, b, target="cuda:sm_90a")._gpu
    assert "cp_async<" in plain.source and plain.threads == 128
    out = np.zeros((70, 90), np.float16)
    report = _build(plain.source, plain, "after_stuck").run(
        np.asarray(a).view(np.float16), np.asarray(b).view(np.float16), out)
    assert report["findings"] == []
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=1e-3, atol=4e-3)
