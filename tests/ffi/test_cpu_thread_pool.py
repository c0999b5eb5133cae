"""The CPU thread pool sizes itself by what the process may use: its affinity mask (capped
by a cgroup v2 CPU quota), unless ``JAXTILE_NUM_THREADS`` (``set_num_threads``) says
otherwise. ``tests/ffi/test_cpu_runtime.py`` and ``tests/reliability/test_config.py`` check
that the variable reaches ``set_num_threads``."""

import os
import subprocess
import sys
import textwrap

import pytest

from jaxtile import _ffi

# Loads the extension alone (no JAX): the pool's size is the runtime's own decision.
SCRIPT = textwrap.dedent(
    """
    import importlib.util, os, sys
    path, cpus, override = sys.argv[1:]
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    spec = importlib.util.spec_from_file_location("jaxtile._ffi", path)
    ffi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ffi)
    if override:
        assert ffi.set_num_threads(int(override))
    print(ffi.num_threads())
    assert not ffi.set_num_threads(5)  # fixed once read
    print(ffi.num_threads())
    """
)


def _threads(cpus, override=""):
    """The pool size of a fresh process restricted to ``cpus``."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, _ffi.__file__,
                           ",".join(map(str, cpus)), override],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, again = map(int, proc.stdout.split())
    assert first == again
    return first


def _quota():
    """The CPUs of this cgroup's v2 quota (rounded up), or None."""
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
    except (OSError, ValueError):
        return None
    return None if quota == "max" else -(-int(quota) // int(period))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to narrow the mask")
def test_pool_size_follows_the_affinity_mask_and_the_override():
    cpus = sorted(os.sched_getaffinity(0))
    everything = min(len(cpus), _quota() or len(cpus))
    # One CPU allowed: no workers, the calling thread runs every block.
    assert _threads(cpus[:1]) == 1
    assert _threads(cpus[:2]) == min(2, everything)
    assert _threads(cpus) == everything
    # The override wins over the mask.
    assert _threads(cpus[:1], override="3") == 3
