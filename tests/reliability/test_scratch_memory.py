"""Finding 1: scratch memory must never overflow a thread's stack (it used to SIGSEGV), and
a kernel that truly cannot fit is a KernelError at compile time."""

import numpy as np
import pytest
from probes import assert_ran, run_python

import jaxtile as jt
from jaxtile.compiler.errors import KernelError

CHAIN = """
    import jax, jax.numpy as jnp, numpy as np
    import jaxtile as jt

    STEPS, ROWS = {steps}, {rows}

    @jt.kernel
    def chain(x):
        out = jt.empty(x.shape, x.dtype)
        i = jt.grid(x.shape[0] // 64)
        t = x.at[jt.ds(i * 64, 64), :]
        v = t[...]
        for _ in range(STEPS):
            v = jnp.tanh(v) * 0.5 + v * 0.25
        out.at[jt.ds(i * 64, 64), :][...] = v
        return out

    x = jax.random.normal(jax.random.key(0), (ROWS, 1024), jnp.float32)
    got = np.asarray(chain(x))
    want = np.asarray(x, np.float64)
    for _ in range(STEPS):
        want = np.tanh(want) * 0.5 + want * 0.25
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ref = np.asarray(chain.reference(x))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    print("ok")
"""


@pytest.mark.parametrize("rows", [64, 512], ids=["calling-thread", "pool-threads"])
def test_long_non_fusible_chain_runs(rows):
    # 40 materialised (64, 1024) float32 tiles were 40 stack arrays of 256 KiB: 10 MiB.
    proc = run_python(CHAIN.format(steps=40, rows=rows))
    assert_ran(proc)
    assert "ok" in proc.stdout


def test_many_large_scratch_buffers_run():
    # 40 jt.fragment tiles of 256 KiB each, all live to the end: they cannot share memory,
    # so the stack must not hold them all.
    proc = run_python("""
        import jax.numpy as jnp, numpy as np
        import jaxtile as jt

        @jt.kernel
        def many(x):
            out = jt.empty(x.shape, x.dtype)
            frags = [jt.fragment((64, 1024), jnp.float32) for _ in range(40)]
            for k, f in enumerate(frags):
                f[...] = x[...] + k
            acc = frags[0][...]
            for f in frags[1:]:
                acc = acc + f[...]
            out[...] = acc
            return out

        x = jnp.ones((64, 1024), jnp.float32)
        np.testing.assert_array_equal(np.asarray(many(x)), 40 + sum(range(40)))
        print("ok")
    """)
    assert_ran(proc)
    assert "ok" in proc.stdout


def test_kernel_that_cannot_fit_is_a_kernel_error():
    @jt.kernel
    def huge(x):
        out = jt.empty(x.shape, x.dtype)
        s = jt.shared((1 << 15, 1 << 14), x.dtype)   # 2 GiB of scratch
        s[0:1, 0:8] = x[...][None, :]
        out[...] = s[0, 0:8]
        return out

    with pytest.raises(KernelError, match=r"(?s)huge.*scratch.*GiB"):
        huge(np.ones(8, np.float32))
