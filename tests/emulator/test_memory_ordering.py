"""Flags one block publishes and another waits for (``jt.store_release``, ``jt.load_acquire``,
``jt.fence``): right on the CPU, in the reference and in the SIMT emulator, with the PTX the
memory model asks for; and the emulator's finding when the flag is read with a plain
(volatile, relaxed) load, which orders nothing on a GPU."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import parser, printer
from jaxtile.compiler.cuda import nvrtc, toolchain
from jaxtile.compiler.emulator import Buffer, EmulatedKernel, EmulatorError, LaunchConfig


@jt.kernel(threads=64)
def chained_sums(x, *, b=16, order="acquire"):
    """``out[i] = sum(x[:(i + 1) * b])``: block i waits for block i - 1's flag, then adds its
    tile's sum to block i - 1's result. ``order``: "acquire" (load_acquire / store_release),
    "fence" (plain flag accesses after / before jt.fence()), "volatile" (plain accesses only:
    wrong on a GPU)."""
    nb = x.shape[0] // b
    out = jt.empty((nb,), jnp.float32)
    flags = jt.empty((nb,), jnp.int32)
    i = jt.grid(nb)
    before = jnp.maximum(i - 1, 0)        # block i - 1 (read only where i > 0)
    t = jt.fragment((b,), jnp.float32)
    jt.copy(x.at[i * b], t)
    s = jnp.sum(t[...])
    prev = jt.local((1,), jnp.float32)
    prev[0] = 0.0

    @jt.when(i > 0)
    def _():
        if order == "acquire":
            @jt.while_(lambda: jt.load_acquire(flags.at[before]) == 0)
            def _():
                pass
        else:
            @jt.while_(lambda: flags[before] == 0)
            def _():
                pass
            if order == "fence":
                jt.fence()
        prev[0] = out[before]

    out[i] = prev[0] + s
    if order == "acquire":
        jt.store_release(flags.at[i], 1)
    else:
        if order == "fence":
            jt.fence()
        flags[i] = 1
    return out, flags


def _case(blocks, b=16):
    x = jnp.asarray(np.random.default_rng(0).standard_normal(blocks * b), jnp.float32)
    want = np.cumsum(np.asarray(x, np.float64).reshape(blocks, b).sum(1))
    return x, want


def _check(got, want):
    out, flags = got
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(flags), 1)


@pytest.mark.parametrize("order", ["acquire", "fence"])
def test_published_data_on_the_cpu_and_in_the_reference(order):
    x, want = _case(24)
    _check(jax.jit(lambda x: chained_sums(x, order=order))(x), want)
    _check(chained_sums.reference(x, order=order), want)


def test_the_cpu_reads_a_polled_flag_from_memory_every_time():
    # A plain load in a loop that stores nothing else may be hoisted by LLVM (the loop would
    # spin on a stale value): the flag is read through the runtime's acquire load, an opaque
    # call, in both versions; release and fence are runtime calls too.
    x, _ = _case(6)
    src = chained_sums.lower(x, target="cpu").source
    assert "jaxtile_load_acquire_i32" in src and "jaxtile_store_release_i32" in src
    assert "jaxtile_fence" not in src
    src = chained_sums.lower(x, target="cpu", order="fence").source
    assert "jaxtile_load_acquire_i32" in src and src.count("jaxtile_fence") == 2
    assert re.search(r"= out1\[", src) is None         # the flags (out1) are never read plainly


@pytest.mark.parametrize("order", ["acquire", "fence"])
def test_published_data_in_the_emulator_is_clean(emulator, order):
    x, want = _case(6)
    _check(jax.jit(lambda x: chained_sums(x, order=order))(x), want)


def test_a_volatile_flag_read_does_not_order_the_data_read(emulator):
    # Two blocks, so that the block the error stops is never one another waits for.
    x, _ = _case(2)
    with pytest.raises(jax.errors.JaxRuntimeError, match="read not ordered after its flag") as e:
        jax.jit(lambda x: chained_sums(x, order="volatile"))(x)
    # The flag read is the loop's volatile load of the flags (out1), the data read the load
    # of the sums (out0) after it, in block 1.
    message = str(e.value)
    assert "relaxed (volatile) load" in message and "of block (1,0,0)" in message
    assert "global buffer 'out1'" in message and "reads global buffer 'out0'" in message
    assert "jt.load_acquire" in message and "jt.fence" in message


def test_the_cuda_source_orders_the_flag_accesses_and_flags_start_as_zeros():
    x, _ = _case(6)
    # The outputs are out0 (sums) and out1 (flags) in the generated code.
    low = chained_sums.lower(x, target="cuda:sm_80")
    assert "load_acquire(out1 + " in low.source and "store_release(out1 + " in low.source
    assert "fence();" not in low.source
    # A flag starts as zeros (an init buffer aliasing it): no block sees a stale one.
    assert {b.aliases for b in low.kernel.buffers if b.role == "init"} == {"out1"}
    low = chained_sums.lower(x, target="cuda:sm_80", order="fence")
    assert low.source.count("fence();") == 2 and "volatile_load(out1 + " in low.source
    assert "load_acquire" not in low.source and "store_release" not in low.source
    # Plain flags: every output the kernel reads starts as zeros.
    assert {b.aliases for b in low.kernel.buffers if b.role == "init"} == {"out0", "out1"}
    # The new ops print and parse back.
    for order in ("acquire", "fence"):
        text = chained_sums.lower(x, target="cuda:sm_80", order=order).tile_ir
        assert printer.format_kernel(parser.parse_kernel(text)) == text


@pytest.mark.skipif(not nvrtc.available() and toolchain.nvcc_path() is None,
                    reason="neither NVRTC (jaxtile[cuda]) nor nvcc is installed")
def test_the_ptx_has_gpu_scope_acquire_release_and_fence():
    from jaxtile.compiler import build
    from jaxtile.compiler.cuda.compile import compile_to_library
    from jaxtile.compiler.target import parse_target

    target = parse_target("cuda:sm_80")
    x, _ = _case(6)
    ptx = b""
    for order in ("acquire", "fence"):
        low = chained_sums.lower(x, target="cuda:sm_80", order=order)
        ptx += compile_to_library(build.lowered_ir(low.kernel, target), target).ptx
    assert b"ld.acquire.gpu" in ptx and b"st.release.gpu" in ptx and b"fence.acq_rel.gpu" in ptx


_HANDOFF = """#include <jaxtile/device.h>

using jaxtile::ptr;

// Block 0 writes the data and publishes it; in block 1 thread 0 waits for the flag, and after
// a barrier every thread reads the data.
JT_KERNEL void handoff(ptr<float> data, ptr<int> flags, ptr<float> out) {
  const int t = jaxtile::thread_idx().x;
  if (jaxtile::block_idx().x == 0) {
    data[t] = float(t) * 0.5f;
    jaxtile::sync_threads();
    if (t == 0) jaxtile::store_release(flags + 0, 1);
    return;
  }
  if (t == 0) {
    while (jaxtile::WAIT(flags + 0) == 0) {
    }
    FENCE
  }
  jaxtile::sync_threads();
  out[t] = data[t];
}
"""


@pytest.mark.parametrize("wait, fence, clean", [
    ("volatile_load", "", False), ("volatile_load", "jaxtile::fence();", True),
    ("load_acquire", "", True)], ids=["volatile", "volatile-fence", "acquire"])
def test_a_flag_read_by_one_thread_orders_the_block_only_with_a_fence(wait, fence, clean):
    # The barrier after thread 0's flag read orders the other threads after it, but only an
    # acquire (or a fence) at gpu scope orders them after block 0's writes.
    src = _HANDOFF.replace("WAIT", wait).replace("FENCE", fence)
    k = EmulatedKernel.build(src, "handoff", [Buffer("data", "float32"), Buffer("flags", "int32"),
                                              Buffer("out", "float32")],
                             LaunchConfig((2, 1, 1), (64, 1, 1)), file="handoff.cu")
    data, flags, out = np.zeros(64, np.float32), np.zeros(1, np.int32), np.zeros(64, np.float32)
    if clean:
        assert k.run(data, flags, out)["findings"] == []
        np.testing.assert_array_equal(out, np.arange(64, dtype=np.float32) * 0.5)
        return
    with pytest.raises(EmulatorError, match="read not ordered after its flag") as e:
        k.run(data, flags, out)
    (finding,) = e.value.report["findings"]
    message = finding["message"]
    assert finding["count"] == 64     # every thread; 63 ordered after the read by the barrier
    assert "global buffer 'flags'" in message and "reads global buffer 'data'" in message
    lines = src.splitlines()
    flag_line = next(n for n, line in enumerate(lines, 1) if "while (" in line)
    data_line = next(n for n, line in enumerate(lines, 1) if "out[t] = data[t]" in line)
    assert f"handoff.cu:{flag_line}" in message and f"handoff.cu:{data_line}" in message


def test_bad_flag_operands_are_kernel_errors():
    @jt.kernel
    def on_chip(x):
        out = jt.empty((4,), jnp.int32)
        s = jt.shared((4,), jnp.int32)
        jt.store_release(s.at[0], 1)
        out[...] = jnp.zeros((4,), jnp.int32)
        return out

    @jt.kernel
    def a_slice(x):
        out = jt.empty((4,), jnp.int32)
        out[...] = jnp.zeros((4,), jnp.int32)
        jt.store_release(out.at[jt.ds(0, 2)], 1)
        return out

    @jt.kernel
    def a_half_flag(x):
        out = jt.empty((4,), jnp.float16)
        out[...] = jnp.zeros((4,), jnp.float16)
        return out, jt.load_acquire(out.at[0])

    x = jnp.zeros((4,), jnp.float32)
    with pytest.raises(jt.KernelError, match="shared buffer"):
        on_chip(x)
    with pytest.raises(jt.KernelError, match="one element"):
        a_slice(x)
    with pytest.raises(jt.KernelError, match="float16"):
        a_half_flag(x)
