"""Floating-point environment: emulated kernels keep subnormals as a GPU does, and CPU kernels
compute alike on every thread of jaxtile's pool, whichever thread created it."""

import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxtile import _ffi
from jaxtile.compiler.emulator import Buffer, EmulatedKernel, LaunchConfig

_SCALE = """
#include <jaxtile/device.h>
using jaxtile::ptr;
JT_KERNEL void quarter(ptr<const float> x, ptr<float> y) {
  const int i = jaxtile::block_idx().x * 128 + jaxtile::thread_idx().x;
  y[i] = x[i] * 0.25f;
}
"""


def test_emulated_kernel_keeps_subnormals_under_jit():
    # XLA calls custom calls with subnormals flushed; sm_80 keeps f32 subnormals (no -ftz).
    jax.ffi.register_ffi_target("jaxtile_cpu_call", _ffi.cpu_handler(), platform="cpu")
    kernel = EmulatedKernel.build(_SCALE, "quarter", [Buffer("x", "float32"),
                                                      Buffer("y", "float32")],
                                  LaunchConfig((8, 1, 1), (128, 1, 1)), file="quarter.cu")
    x = np.full(1024, 2.0**-126, np.float32)
    out = jax.jit(lambda a: kernel.ffi_call([((1024,), jnp.float32)], a)[0])(x)
    np.testing.assert_array_equal(np.asarray(out), np.float32(2.0**-128))


_POOL = """
import sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, {ffi_tests!r})
import ffi_kernels
from jaxtile import _ffi

ffi_kernels.build({lib!r})
jax.ffi.register_ffi_target("jaxtile_cpu_call", _ffi.cpu_handler(), platform="cpu")
n = 64 * ffi_kernels.BLOCK
_ffi.load_kernel("vadd", {lib!r}, "vadd", 64, 64)

def aligned(value):
    raw = np.empty(n * 4 + 64, np.uint8)
    start = -raw.ctypes.data % 64
    a = raw[start : start + n * 4].view(np.float32)
    a[:] = value
    return a

x, y, out = aligned(1.5e-38), aligned(-1.4e-38), aligned(0)
# The first multi-block call comes from Python's thread (subnormals kept): the pool's
# threads are created here.
_ffi.call_kernel("vadd", [x, y, out])
assert (out == np.float32(1.5e-38) + np.float32(-1.4e-38)).all()
call = jax.ffi.ffi_call("jaxtile_cpu_call", jax.ShapeDtypeStruct((n,), jnp.float32))
got = np.asarray(jax.jit(lambda a, b: call(a, b, key="vadd"))(x, y))
want = np.asarray(jax.jit(lambda a, b: a + b)(x, y))
assert (want == 0).all(), want[:4]  # XLA flushes the subnormal sum
np.testing.assert_array_equal(got, want)
print("ok")
"""


def test_pool_threads_adopt_the_callers_floating_point_state(tmp_path):
    # A fresh process, so that this test decides which thread creates the pool.
    ffi_tests = str(Path(__file__).resolve().parents[1] / "ffi")
    script = textwrap.dedent(_POOL.format(ffi_tests=ffi_tests, lib=str(tmp_path / "k.so")))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
