"""jaxtile/xla_math.h: XLA's per-element rules in device code, run in the emulator and checked
against numpy / XLA's documented results."""

import ml_dtypes
import numpy as np
import pytest

from jaxtile.compiler.emulator import Buffer, EmulatedKernel, LaunchConfig

_SOURCE = r"""
#include <jaxtile/device.h>
using namespace jaxtile;

JT_KERNEL void probe(ptr<float> fx, ptr<float> fy, ptr<int> ix, ptr<int> iy, ptr<float> fo,
                     ptr<int> io) {
  const int t = int(thread_idx().x);
  const float a = fx[t], b = fy[t];
  const int p = ix[t], q = iy[t];
  fo[t * 6 + 0] = xla_max<float>(a, b);
  fo[t * 6 + 1] = xla_min<float>(a, b);
  fo[t * 6 + 2] = xla_sign(a);
  fo[t * 6 + 3] = round_bf16(a);
  fo[t * 6 + 4] = round_f16(a);
  fo[t * 6 + 5] = xla_is_finite(a) ? 1.0f : 0.0f;
  io[t * 4 + 0] = xla_div<int>(p, q);
  io[t * 4 + 1] = xla_rem<int>(p, q);
  io[t * 4 + 2] = xla_f2i<int>(double(a), -2147483648.0, 2147483647.0, int(-2147483647 - 1),
                               2147483647);
  io[t * 4 + 3] = xla_ipow<int>(p, q);
}
"""


@pytest.fixture(scope="module")
def probe():
    params = [Buffer(n, "float32") for n in ("fx", "fy")] + \
        [Buffer(n, "int32") for n in ("ix", "iy")] + [Buffer("fo", "float32"),
                                                      Buffer("io", "int32")]
    return EmulatedKernel.build(_SOURCE, "probe", params, LaunchConfig((1, 1, 1), (8, 1, 1)),
                                file="xla_math_probe.cu")


def test_xla_rules(probe):
    fx = np.array([np.nan, 1.0, -0.0, 3e9, -3e9, 1.00390625, np.inf, 2.5], np.float32)
    fy = np.array([1.0, np.nan, 0.0, 1.0, 1.0, 0.0, 0.0, 2.5], np.float32)
    ix = np.array([7, -7, np.iinfo(np.int32).min, 5, 0, 2, -2, 3], np.int32)
    iy = np.array([0, 2, -1, -2, 0, 10, 3, -1], np.int32)
    fo = np.zeros(8 * 6, np.float32)
    io = np.zeros(8 * 4, np.int32)
    assert probe.run(fx, fy, ix, iy, fo, io)["findings"] == []
    fo, io = fo.reshape(8, 6), io.reshape(8, 4)
    # NaN-propagating max / min
    assert np.isnan(fo[0, 0]) and np.isnan(fo[1, 0]) and np.isnan(fo[0, 1])
    assert fo[3, 0] == 3e9 and fo[3, 1] == 1.0
    # sign keeps signed zeros and NaN
    assert np.isnan(fo[0, 2]) and np.signbit(fo[2, 2]) and fo[2, 2] == 0 and fo[4, 2] == -1
    # rounding to the 16-bit types: nearest even
    assert fo[5, 3] == float(np.float32(ml_dtypes.bfloat16(1.00390625)))
    assert fo[5, 4] == float(np.float16(1.00390625))
    assert list(fo[:, 5]) == [0, 1, 1, 1, 1, 1, 0, 1]
    # integer division: x / 0 = -1, x % 0 = x, INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0
    assert (io[0, 0], io[0, 1]) == (-1, 7)
    assert (io[1, 0], io[1, 1]) == (-3, -1)
    assert (io[2, 0], io[2, 1]) == (np.iinfo(np.int32).min, 0)
    # float -> int saturates, NaN -> 0
    assert io[0, 2] == 0 and io[3, 2] == np.iinfo(np.int32).max
    assert io[4, 2] == np.iinfo(np.int32).min and io[7, 2] == 2
    # integer power; negative exponents give 0 unless the base is +-1
    assert io[5, 3] == 1024 and io[6, 3] == -8 and io[3, 3] == 0
