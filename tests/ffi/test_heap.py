"""The runtime's allocator setting (ffi/cpu/heap.cc): outputs of a jit of one kernel reuse
freed memory instead of faulting in fresh pages on every call."""

import platform
import subprocess
import sys
import textwrap

import pytest


def test_the_setting_applies_on_glibc():
    from jaxtile import _ffi

    libc = platform.libc_ver()[0]
    assert _ffi.keep_freed_memory() is (libc == "glibc"), libc


_SCRIPT = textwrap.dedent(
    """
    import resource, statistics
    import jax, jax.numpy as jnp
    import jaxtile as jt

    @jt.kernel
    def scale(x, *, rows=8):
        out = jt.empty(x.shape, x.dtype)
        i = jt.grid(jt.cdiv(x.shape[0], rows))
        t = jt.fragment((rows, x.shape[1]), jnp.float32)
        jt.copy(x.at[i * rows, 0], t)
        t[...] = t[...] * 2.0
        jt.copy(t, out.at[i * rows, 0])
        return out

    x = jnp.ones((4096, 1024), jnp.float32)           # 16 MiB in, 16 MiB out
    ours, theirs = jax.jit(scale), jax.jit(lambda x: x * 3.0)
    assert float(ours(x)[5, 7]) == 2.0

    def faults_per_call(fn, calls=10):
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(calls):
            fn(x).block_until_ready()
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / calls

    # Alternating with an XLA computation is what left the main heap's top trimmed.
    counts = []
    for _ in range(6):
        counts.append(faults_per_call(ours))
        faults_per_call(theirs)
    print(statistics.median(counts[1:]))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator: Linux only")
def test_kernel_outputs_reuse_freed_memory():
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    faults = proc.stdout.split()[-1]
    # A 16 MiB output on fresh memory is 4096 faults; reused memory takes none.
    assert float(faults) < 256, f"{faults} page faults per call"
