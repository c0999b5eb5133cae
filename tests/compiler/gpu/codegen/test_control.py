"""``jt.while_`` on CUDA: a ``while (true) { cond; if (!test) break; body }`` loop. A condition
computed from inputs or on-chip data is the same in every thread, so barriers inside are
legal; one that reads global memory the kernel writes may differ between threads, and a
barrier (or any code all threads must reach together) inside it is a KernelError."""

import re

import jax.numpy as jnp
import pytest

import jaxtile as jt
from jaxtile.compiler.gpu.codegen import control


@jt.kernel
def _first_negative(x, *, rows=8):
    n, m = x.shape
    out = jt.empty((n,), jnp.int32)
    r = jt.grid(jt.cdiv(n, rows))
    t = jt.fragment((rows, m), x.dtype)
    jt.copy(x.at[r * rows, 0], t, pad=-1)
    res = jt.fragment((rows,), jnp.int32)
    i = jt.local((1,), jnp.int32)

    @jt.loop(rows)
    def _(k):
        i[0] = 0

        @jt.while_(lambda: (i[0] < m) & (t[k, jnp.minimum(i[0], m - 1)] >= 0))
        def _():
            i[0] += 1

        res[k] = i[0]

    jt.copy(res, out.at[r * rows])
    return out


def _spin(body_reads_fragment: bool):
    @jt.kernel
    def spin(x):
        """Waits until the blocks' atomic increments of count[0] reach 4: a condition read
        from memory other blocks write while the loop runs."""
        count = jt.empty((1,), jnp.int32)
        jt.grid(4)
        t = jt.fragment((128,), jnp.int32)
        jt.copy(x.at[0], t)
        i = jt.local((1,), jnp.int32)
        i[0] = 0
        jt.atomic_add(count.at[0], jnp.ones((1,), jnp.int32))

        @jt.while_(lambda: count[0] < 4)
        def _():
            if body_reads_fragment:
                i[0] += t[i[0] % 128]       # another thread's element: through shared memory
            else:
                i[0] += 1
        return count
    return spin


def test_a_uniform_condition_keeps_its_barriers_inside_the_loop():
    src = _first_negative.lower(jnp.ones((13, 10)), target="cuda:sm_80").source
    loop = src[src.index("while (true)"):]
    # the condition reads t[k, i] of the fragment through shared memory, every iteration
    assert "sync_threads();" in loop[:loop.index("break;")]
    assert re.search(r"if \(!\(v\d+\)\) break;", loop)


def test_a_thread_varying_condition_refuses_a_barrier_inside():
    x = jnp.ones((128,), jnp.int32)
    with pytest.raises(jt.KernelError, match=r"jt.while_ at \S*test_control.py:\d+ reads "
                       r"global memory the kernel writes.*block-wide barrier.*for the op at "
                       r"\S*test_control.py:\d+"):
        _ = _spin(True).lower(x, target="cuda:sm_80").source
    # without such code inside, the same loop lowers; the counter is read from memory
    # every iteration, not once into a register
    src = _spin(False).lower(x, target="cuda:sm_80").source
    assert "while (true)" in src and re.search(r"= volatile_load\(\w+ \+ 0\);", src)


def test_which_values_may_differ_between_threads():
    x = jnp.ones((128,), jnp.int32)
    k = _spin(False).lower(x, target="cuda:sm_80").kernel
    (loop,) = [s for s in _walk(k.body) if type(s).__name__ == "While"]
    assert loop.test.id in control.thread_varying(k)
    k = _first_negative.lower(jnp.ones((13, 10))).kernel
    (loop,) = [s for s in _walk(k.body) if type(s).__name__ == "While"]
    assert loop.test.id not in control.thread_varying(k)


def _walk(body):
    from jaxtile.compiler import ir
    return ir.walk(body)


_VOLATILE = r"""
#include <jaxtile/device.h>
using namespace jaxtile;

JT_KERNEL JT_LAUNCH_BOUNDS(32) void probe(ptr<float> f, ptr<half> h, ptr<int64_t> i,
                                          ptr<float> out) {
  const int t = int(thread_idx().x);
  out[t] = volatile_load(f + t) + to_float(volatile_load(h + t)) +
           float(volatile_load(i + t));
}
"""


def test_volatile_loads_read_memory_in_the_emulator_and_compile_for_the_gpu():
    import numpy as np

    from jaxtile.compiler.cuda import compile as cuda_compile
    from jaxtile.compiler.emulator import Buffer, EmulatedKernel, LaunchConfig
    from jaxtile.compiler.gpu.launch import Launch
    from jaxtile.compiler.target import parse_target

    params = [Buffer("f", "float32"), Buffer("h", "float16"), Buffer("i", "int64"),
              Buffer("out", "float32")]
    k = EmulatedKernel.build(_VOLATILE, "probe", params, LaunchConfig((1, 1, 1), (32, 1, 1)),
                             file="volatile_probe.cu")
    f = np.arange(32, dtype=np.float32) * 0.5
    h = np.arange(32, dtype=np.float16)
    i = np.arange(32, dtype=np.int64) * 1000
    out = np.zeros(32, np.float32)
    assert k.run(f, h, i, out)["findings"] == []
    np.testing.assert_array_equal(out, f + h.astype(np.float32) + i.astype(np.float32))
    if cuda_compile.nvrtc.available() or cuda_compile.toolchain.nvcc_path() is not None:
        c = cuda_compile.compile_kernel(_VOLATILE, "probe", parse_target("cuda:sm_80"),
                                        Launch((1, 1, 1), (32, 1, 1)))
        assert b"ld.volatile.global" in c.ptx
