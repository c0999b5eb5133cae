"""benchmarks/_ynnpack_isa.py caps the YNNPACK kernels inside XLA:CPU at AVX2 + FMA3, so that
the plain-kernel benchmark's AVX2 comparison is against XLA's AVX2 code: with the pinned
jaxlib it finds YNNPACK's feature flags, clears every bit above FMA3, and XLA's dots still
compute the right thing afterwards. A jaxlib where the flags are no longer found fails here
rather than letting the benchmark compare with AVX-512 kernels unnoticed."""

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

CHILD = f"""
import ctypes, json, sys
sys.path.insert(0, {str(BENCHMARKS)!r})
import numpy as np, jax, jax.numpy as jnp
import _ynnpack_isa as y
first = y.cap_to_avx2()
again = y.cap_to_avx2()
import jaxlib, os
lib = os.path.join(os.path.dirname(jaxlib.__file__), "libjax_common.so")
addr = y._load_base(lib) + y._symbol_values(lib, (y.FLAGS,))[y.FLAGS]
flags = ctypes.c_uint64.from_address(addr).value
rng = np.random.default_rng(0)
a = rng.standard_normal((300, 200), np.float32)
b = rng.standard_normal((200, 170), np.float32)
got = np.asarray(jax.jit(jnp.matmul)(a, b))
err = float(np.abs(got - a.astype(np.float64) @ b).max())
print(json.dumps({{"first": first, "again": again, "flags": flags, "err": err}}))
"""


@pytest.mark.skipif(platform.machine() != "x86_64" or sys.platform != "linux",
                    reason="the cap is for XLA:CPU's x86-64 Linux YNNPACK build")
def test_cap_clears_every_feature_above_fma3_and_dots_stay_right():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["first"].startswith("capped: "), row
    assert row["first"].endswith(f"-> {row['flags']:#x}"), row
    assert row["flags"] & ~0x7F == 0 and row["flags"] & 0x60 == 0x60, row
    assert row["again"] == f"capped: {row['flags']:#x} -> {row['flags']:#x}", row
    assert row["err"] < 1e-3, row
