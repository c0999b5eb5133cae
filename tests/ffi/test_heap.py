"""The runtime's memory settings (ffi/cpu/heap.cc): with JAXTILE_KEEP_FREED_MEMORY=1 (opt-in:
it changes the allocator of the whole process) outputs of a jit of one kernel reuse freed
memory instead of faulting in fresh pages on every call; outputs too big to be reused are
backed by huge pages whatever the setting. tests/reliability/test_import_memory.py checks that
the default leaves the allocator alone."""

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def test_the_setting_applies_on_glibc():
    # In a child: applying it here would change this test process's allocator.
    proc = subprocess.run([sys.executable, "-c", "from jaxtile import _ffi; "
                           "print(_ffi.keep_freed_memory())"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    libc = platform.libc_ver()[0]
    assert proc.stdout.split()[-1] == str(libc == "glibc"), libc


_KERNEL = """
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

    def faults_per_call(fn, calls=10):
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(calls):
            fn(x).block_until_ready()
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / calls
"""

_SCRIPT = textwrap.dedent(_KERNEL + """
    x = jnp.ones((4096, 1024), jnp.float32)           # 16 MiB in, 16 MiB out
    ours, theirs = jax.jit(scale), jax.jit(lambda x: x * 3.0)
    assert float(ours(x)[5, 7]) == 2.0

    # Alternating with an XLA computation is what left the main heap's top trimmed.
    counts = []
    for _ in range(6):
        counts.append(faults_per_call(ours))
        faults_per_call(theirs)
    print(statistics.median(counts[1:]))
    """)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator: Linux only")
def test_kernel_outputs_reuse_freed_memory_when_opted_in():
    env = {**os.environ, "JAXTILE_KEEP_FREED_MEMORY": "1"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    faults = proc.stdout.split()[-1]
    # A 16 MiB output on fresh memory is 4096 faults; reused memory takes none.
    assert float(faults) < 256, f"{faults} page faults per call"


_HUGE_SCRIPT = textwrap.dedent(_KERNEL + """
    x = jnp.ones((8192, 1024), jnp.float32)           # 32 MiB out: mapped afresh every call
    ours = jax.jit(scale)
    assert float(ours(x)[8191, 1023]) == 2.0
    print(statistics.median(faults_per_call(ours, calls=4) for _ in range(3)))
    """)


def _thp_mode() -> str | None:
    """The transparent huge page mode the kernel offers ("always", "madvise", "never")."""
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not path.exists():
        return None
    text = path.read_text()
    return text[text.index("[") + 1:text.index("]")]


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"),
                    reason="this kernel offers no transparent huge pages to madvise")
def test_big_outputs_fault_in_huge_pages():
    proc = subprocess.run([sys.executable, "-c", _HUGE_SCRIPT], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    faults = float(proc.stdout.split()[-1])
    # 8192 faults per call in 4 KiB pages; in 2 MiB pages 16, plus the unaligned ends.
    assert faults < 2048, f"{faults} page faults per call"


_TRIMMED_SCRIPT = textwrap.dedent(_KERNEL + """
    import ctypes
    libc = ctypes.CDLL(None)
    x = jnp.ones((4096, 1024), jnp.float32)           # 16 MiB out: from the heap
    ours = jax.jit(scale)
    assert float(ours(x)[4095, 1023]) == 2.0

    def trimmed_call(x):
        # glibc hands the heap's free memory back to the kernel (as its adaptive trimming
        # does after some allocation histories), so the next output is new memory.
        libc.malloc_trim(0)
        return ours(x)

    counts = [faults_per_call(trimmed_call, calls=4) for _ in range(3)]
    print(statistics.median(counts))
    """)


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise") or platform.libc_ver()[0] != "glibc",
                    reason="needs transparent huge pages to madvise and glibc's malloc_trim")
def test_heap_outputs_on_memory_handed_back_fault_in_huge_pages():
    proc = subprocess.run([sys.executable, "-c", _TRIMMED_SCRIPT], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    faults = float(proc.stdout.split()[-1])
    # A 16 MiB output on new memory is 4096 faults in 4 KiB pages; in 2 MiB pages 8, plus the
    # unaligned ends and what malloc_trim returned of the rest of the heap.
    assert faults < 1024, f"{faults} page faults per call"
