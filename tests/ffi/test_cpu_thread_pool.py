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


def test_thread_plan_borrows_the_host_pool_unless_the_count_was_requested():
    # No host pool (the call_kernel hook): jaxtile's own pool, its own count.
    assert _ffi.plan_threads(4, False, 0) == (4, False)
    # Under XLA: XLA's intra-op threads, never more than the CPUs jaxtile may use...
    assert _ffi.plan_threads(2, False, 2) == (2, True)
    assert _ffi.plan_threads(2, False, 16) == (2, True)
    # ... nor more than the calling thread plus one task per host thread.
    assert _ffi.plan_threads(8, False, 2) == (3, True)
    assert _ffi.plan_threads(1, False, 4) == (1, True)
    # JAXTILE_NUM_THREADS wins, on jaxtile's own pool, whatever XLA has.
    assert _ffi.plan_threads(3, True, 16) == (3, False)
    assert _ffi.plan_threads(1, True, 2) == (1, False)


# A jitted multi-block kernel (98 blocks), checked against jnp, then which pool ran it.
JITTED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    import jaxtile as jt
    from jaxtile import _ffi
    n = 100_000
    x = jnp.arange(n, dtype=jnp.float32)
    y = jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32)
    add = jax.jit(lambda x, y: jt.ops.add(x, y, block=1024))
    for _ in range(20):  # enough calls for any helper to have run some chunks
        np.testing.assert_array_equal(np.asarray(add(x, y)), np.asarray(x) + np.asarray(y))
    print(_ffi.own_pool_started())
    """
)


def _own_pool_started(num_threads):
    env = {k: v for k, v in os.environ.items() if k != "JAXTILE_NUM_THREADS"}
    if num_threads is not None:
        env["JAXTILE_NUM_THREADS"] = num_threads
    proc = subprocess.run([sys.executable, "-c", JITTED], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()[-1] == "True"


def test_jitted_calls_run_on_xla_threads_unless_the_variable_is_set():
    """Under jax.jit the blocks go to XLA's intra-op pool (jaxtile starts no threads of its
    own); with JAXTILE_NUM_THREADS set, jaxtile's own pool runs them as before."""
    assert not _own_pool_started(None)
    assert _own_pool_started("2")
