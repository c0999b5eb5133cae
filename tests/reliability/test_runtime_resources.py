"""Findings 11 and 13: the runtime's own resources. A scratch allocation that fails at run
time says so, with its size; an exported kernel does not keep a file descriptor open."""

from probes import assert_ran, run_python

_TWO_KERNELS = """
import os, resource
import jax.numpy as jnp, numpy as np
import jaxtile as jt
from jaxtile import _ffi
from jaxtile.compiler.target import parse_target
from jaxtile.primitives import kernel_call, payload

def scaler(factor):
    @jt.kernel(name=f"scale{factor}")
    def scale(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * factor
        return out
    return scale

def aligned(values):
    # The kernels assume 64-byte aligned buffers, which numpy does not promise.
    raw = np.empty(len(values) + 16, np.float32)
    start = (-raw.ctypes.data % 64) // 4
    out = raw[start:start + len(values)]
    out[...] = values
    return out

x = jnp.arange(8, dtype=jnp.float32)
libs = []
for factor in (3, 5):
    k = scaler(factor)
    k(x)
    entry = k._specialise((x,), {}).build(parse_target("cpu"), kernel_call.load)
    with open(entry.library, "rb") as f:
        libs.append((factor, entry, f.read()))
"""


def test_exported_kernels_do_not_keep_descriptors_open():
    proc = run_python(_TWO_KERNELS + """
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
before = len(os.listdir("/proc/self/fd"))
for i in range(300):
    factor, entry, lib = libs[i % 2]
    key = f"{i:064x}"
    _ffi.load_exported_kernel(key, payload.pack(key=key, name=f"k{i}", symbol=entry.symbol,
                                                num_blocks=1, library=lib,
                                                signature=entry.meta.signature))
    # The library loaded under a reused descriptor number is the new one, not the last.
    a = aligned(np.arange(8, dtype=np.float32))
    out = aligned(np.zeros(8, np.float32))
    _ffi.call_kernel(key, [a, out])
    np.testing.assert_array_equal(out, a * factor)
after = len(os.listdir("/proc/self/fd"))
assert after - before < 5, (before, after)
# Compiling still works: descriptors are not exhausted.
np.testing.assert_array_equal(np.asarray(scaler(7)(x)), np.arange(8) * 7)
print("ok", before, after)
""")
    assert_ran(proc)
    assert "ok" in proc.stdout


def test_failed_scratch_allocation_says_out_of_memory_and_how_much():
    proc = run_python("""
import resource
import jax.numpy as jnp, numpy as np
import jaxtile as jt

N = 1 << 27   # 512 MiB of float32 scratch, on the heap

@jt.kernel
def big(x):
    out = jt.empty(x.shape, x.dtype)
    f = jt.fragment((N,), jnp.float32)
    f[0:8] = x[...]
    out[...] = f[0:8] * 2
    return out

x = jnp.arange(8, dtype=jnp.float32)
np.testing.assert_array_equal(np.asarray(big(x)), np.arange(8) * 2)
with open("/proc/self/status") as s:
    vm = next(int(l.split()[1]) * 1024 for l in s if l.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (128 << 20), resource.RLIM_INFINITY))
try:
    np.asarray(big(x + 1))
except Exception as e:
    print("ERROR", e)
else:
    print("no error")
""")
    assert_ran(proc)
    assert "ERROR" in proc.stdout, proc.stdout
    message = proc.stdout
    assert "out of memory" in message and str(4 * (1 << 27)) in message, message
