"""Loop-carried values and branch results compile for real GPUs: the CUDA code of the
carried-value kernels of ``tests/jaxtile/test_language_carry.py`` (which run it in the
emulator) goes through nvcc and ptxas without spills."""

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from cuda_kernels import needs_compiler

sys.path.insert(0, str(Path(__file__).parents[2] / "jaxtile"))
import test_language_carry as carry  # noqa: E402

pytestmark = [needs_compiler, pytest.mark.slow]


def _arrays(*shapes, dtype=jnp.float32):
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal(s), dtype) for s in shapes]


@pytest.mark.parametrize("name,lower", [
    ("attention", lambda: carry._attention.lower(*_arrays((16, 16), (24, 16), (24, 16)),
                                                 target="cuda:sm_80")),
    ("while", lambda: carry._collatz_kernel.lower(jnp.arange(1, 8, dtype=jnp.int32),
                                                  target="cuda:sm_80")),
    ("switch", lambda: carry._switch_rows.lower(*_arrays((40, 8)), target="cuda:sm_80")),
])
def test_carried_values_compile_without_spills(name, lower):
    r = lower().ptxas
    assert r.spill_stores == r.spill_loads == 0 and r.stack_frame == 0, (name, r)
