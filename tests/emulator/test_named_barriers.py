"""Named barriers in the emulator (``barrier_sync`` / ``barrier_arrive``: PTX ``bar.sync`` and
``bar.arrive``): a producer/consumer hand-off over a block split in two runs clean and right,
and each seeded mistake is reported -- an arrival that never comes (deadlock naming the
barrier), a count that is not a multiple of 32, an id past 15, a consumer-only barrier counting
the whole block, and a producer that refills without waiting for the consumers' release
(a race the arrive-only clocks expose).

The rules are the PTX ISA's ("bar, barrier"): 16 barriers per CTA (ids 0..15); the thread count
is a multiple of the warp size, and bar.arrive needs one; bar.arrive does not wait."""

import numpy as np
import pytest
from emu_kernels import kernel_source, mutate

from jaxtile.compiler.emulator import Buffer, EmulatedKernel, EmulatorError, LaunchConfig

ROUNDS = 3


def _build(source: str) -> EmulatedKernel:
    return EmulatedKernel.build(
        source, "named_barriers", [Buffer("x", "float32"), Buffer("y", "float32")],
        LaunchConfig((1, 1, 1), (256, 1, 1)), file="named_barriers.cu")


def _arrays():
    x = np.random.default_rng(0).standard_normal((ROUNDS, 128)).astype(np.float32)
    return x, np.full((ROUNDS, 128), np.nan, np.float32)


def _expected(x: np.ndarray) -> np.ndarray:
    """Independent of the kernel's indexing: consumer c accumulates x[r, 127 - c] + r over the
    rounds and writes its neighbour's (c + 1) running total."""
    total = np.cumsum(x[:, ::-1] + np.arange(ROUNDS, dtype=np.float32)[:, None], axis=0)
    return np.roll(total, -1, axis=1)


def test_producer_consumer_hand_off_runs_clean():
    x, y = _arrays()
    report = _build(kernel_source("named_barriers")).run(x, y)
    assert not report["findings"], report["findings"]
    np.testing.assert_allclose(y, _expected(x), rtol=1e-6)


@pytest.mark.parametrize("tag, old, new, finding", [
    # the producers never arrive: the consumers wait forever at barrier 1
    ("arrive", "jaxtile::barrier_arrive(1, 256);", "", "barrier 1 at named_barriers.cu:"),
    ("arrive", "(1, 256)", "(1, 100)", "multiple of 32"),
    ("wait", "(1, 256)", "(16, 256)", "below 16"),
    # a consumer-only barrier counting the whole block: 128 arrivals of 256
    ("consumers", "(2, 128)", "(2, 256)", "waits for 128 more"),
    # the consumers release `buf` before reading it: the producers' refill races the reads
    ("early", "false", "true", "data race (write after read) on shared array 'buf'"),
    # the producers do not wait for the release: their next arrival on barrier 1 comes while
    # its instance is still open
    ("refill", "if (r > 0) jaxtile::barrier_sync(3, 256);", "", "twice before the barrier"),
])
def test_seeded_named_barrier_mistakes_are_reported(tag, old, new, finding):
    bad = mutate(kernel_source("named_barriers"), tag, old, new)
    kernel = _build(bad)
    kernel.set_timeout(60)
    x, y = _arrays()
    with pytest.raises(EmulatorError) as err:
        kernel.run(x, y)
    text = str(err.value) + str(err.value.report)
    assert finding in text, text[:2000]


def test_named_barriers_assemble():
    """The PTX side of the header: ``bar.arrive`` and ``bar.sync`` with a thread count."""
    from jaxtile.compiler.cuda.toolchain import compile_cubin, nvcc_path

    if nvcc_path() is None:
        pytest.skip("nvcc not found (PATH, $NVCC, $CUDA_HOME): cannot check the PTX side")
    cubin = compile_cubin(kernel_source("named_barriers"), "sm_80", file="named_barriers.cu")
    ptx = cubin.ptx.decode()
    assert "bar.arrive" in ptx and "bar.sync" in ptx, ptx
