"""Atomic updates built on compare-and-swap (``jaxtile/atomics.h``): float and double
max/min with XLA's NaN and signed-zero rules, double and int64 adds, under heavy contention
(many blocks on several CPU threads, every thread of a block on the same few addresses), in
the emulator; and the same text compiles for the GPU (atom.cas)."""

import numpy as np
import pytest

from jaxtile.compiler.cuda import compile as cuda_compile
from jaxtile.compiler.emulator import Buffer, EmulatedKernel, LaunchConfig
from jaxtile.compiler.gpu.launch import Launch
from jaxtile.compiler.target import parse_target

SLOTS, BLOCKS, THREADS = 4, 48, 128

_SOURCE = r"""
#include <jaxtile/device.h>
using namespace jaxtile;

JT_KERNEL JT_LAUNCH_BOUNDS(128) void contend(ptr<float> x, ptr<double> xd, ptr<int64_t> xi,
                                             ptr<float> hi, ptr<float> lo, ptr<double> hid,
                                             ptr<double> lod, ptr<double> sumd,
                                             ptr<int64_t> sumi, ptr<int64_t> hii,
                                             ptr<int64_t> loi, ptr<float> olds) {
  const int t = int(thread_idx().x);
  const int i = int(block_idx().x) * int(block_dim().x) + t;
  const int s = t % 4;
  const float old = atomic_max(hi + s, x[i]);
  atomic_min(lo + s, x[i]);
  atomic_max(hid + s, xd[i]);
  atomic_min(lod + s, xd[i]);
  atomic_add(sumd + s, xd[i]);
  atomic_add(sumi + s, xi[i]);
  atomic_max(hii + s, xi[i]);
  atomic_min(loi + s, xi[i]);
  olds[i] = old;
}
"""


def _params():
    dt = {"x": "float32", "xd": "float64", "xi": "int64", "hi": "float32", "lo": "float32",
          "hid": "float64", "lod": "float64", "sumd": "float64", "sumi": "int64",
          "hii": "int64", "loi": "int64", "olds": "float32"}
    return [Buffer(n, d) for n, d in dt.items()]


@pytest.fixture(scope="module")
def contend():
    return EmulatedKernel.build(_SOURCE, "contend", _params(),
                                LaunchConfig((BLOCKS, 1, 1), (THREADS, 1, 1)),
                                file="atomics_cas.cu")


def _inputs(rng):
    n = BLOCKS * THREADS
    x = (rng.standard_normal(n) * 100).astype(np.float32)
    slot = np.arange(n) % SLOTS
    # slot 1 holds a NaN among its values; slot 3 only signed zeros, negative ones first
    x[np.flatnonzero(slot == 1)[n // 8]] = np.nan
    zeros = np.flatnonzero(slot == 3)
    x[zeros] = np.where(np.arange(zeros.size) < zeros.size // 2, -0.0, 0.0)
    xd = x.astype(np.float64)
    xd[slot == 2] = rng.integers(-1000, 1000, size=(slot == 2).sum())  # exact sums
    xi = rng.integers(-2**40, 2**40, size=n).astype(np.int64)
    return x, xd, xi, slot


def _expect_max(v, start):
    if np.isnan(v).any():
        return np.nan
    m = max(np.max(v), start)
    if m == 0:  # XLA's order: -0.0 < 0.0
        return 0.0 if (~np.signbit(v[v == 0])).any() else -0.0
    return m


def _expect_min(v, start):
    if np.isnan(v).any():
        return np.nan
    m = min(np.min(v), start)
    if m == 0:
        return -0.0 if np.signbit(v[v == 0]).any() else 0.0
    return m


def test_contended_cas_updates_follow_xla(contend, rng):
    x, xd, xi, slot = _inputs(rng)
    hi = np.full(SLOTS, -np.inf, np.float32)
    lo = np.full(SLOTS, np.inf, np.float32)
    hid, lod = hi.astype(np.float64), lo.astype(np.float64)
    sumd = np.zeros(SLOTS)
    sumi = np.zeros(SLOTS, np.int64)
    hii = np.full(SLOTS, np.iinfo(np.int64).min, np.int64)
    loi = np.full(SLOTS, np.iinfo(np.int64).max, np.int64)
    olds = np.zeros_like(x)
    for _ in range(2):  # a lost update would show in one of the runs
        outs = [a.copy() for a in (hi, lo, hid, lod, sumd, sumi, hii, loi, olds)]
        report = contend.run(x, xd, xi, *outs)
        assert report["findings"] == []
        got_hi, got_lo, got_hid, got_lod, got_sumd, got_sumi, got_hii, got_loi, got_olds = outs
        for s in range(SLOTS):
            v, vd, vi = x[slot == s], xd[slot == s], xi[slot == s]
            for got, want in ((got_hi[s], _expect_max(v, -np.inf)),
                              (got_lo[s], _expect_min(v, np.inf)),
                              (got_hid[s], _expect_max(vd, -np.inf)),
                              (got_lod[s], _expect_min(vd, np.inf))):
                np.testing.assert_array_equal(got, want)
                assert np.signbit(got) == np.signbit(want)
            assert got_hii[s] == vi.max() and got_loi[s] == vi.min()
            assert got_sumi[s] == vi.sum()
        assert got_sumd[2] == xd[slot == 2].sum()
        np.testing.assert_allclose(got_sumd[[0, 3]], [xd[slot == 0].sum(),
                                                   xd[slot == 3].sum()])
        # every returned old value is one the slot held: the start, or one of its values
        for s in (0, 2):
            assert set(got_olds[slot == s]) <= set(x[slot == s]) | {-np.inf}


@pytest.mark.skipif(not (cuda_compile.nvrtc.available()
                         or cuda_compile.toolchain.nvcc_path() is not None),
                    reason="neither NVRTC nor nvcc is installed")
def test_cas_updates_compile_to_atom_cas():
    c = cuda_compile.compile_kernel(_SOURCE, "contend", parse_target("cuda:sm_80"),
                                    Launch((BLOCKS, 1, 1), (THREADS, 1, 1)))
    assert b"atom.global.cas.b32" in c.ptx and b"atom.global.cas.b64" in c.ptx
