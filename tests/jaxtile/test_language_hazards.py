"""The tile language on the CPU: read/write hazards of in-place tile updates.

Shared helpers and the testing approach: ``language_helpers``.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from language_helpers import F32, check

import jaxtile as jt

# --- hazards -------------------------------------------------------------------------------

@jt.kernel
def in_place(x, *, which):
    """In-place updates of one tile whose result depends on reading before writing."""
    (n, n2) = x.shape
    out = jt.empty((n, n2), x.dtype)
    t = jt.fragment((n, n2), x.dtype)
    jt.copy(x, t)
    if which == "transpose":
        t[...] = t[...].T
    elif which == "transpose_add":
        t[...] = t[...] + t[...].T
    elif which == "repeat_double":
        t[...] = t[...] * 2
        t[...] = t[...] * 2
        t[...] = t[...] * 2
    elif which == "read_overwrite_use":
        v = t[...]
        t[...] = jnp.zeros_like(v)
        t[...] = v + 1
    elif which == "scalar_then_overwrite":
        s = t[0, 0]
        t[...] = t[...] * 0 + 5
        t[...] = t[...] + s
    elif which == "shift_rows":
        t[jt.ds(1, n - 1), :] = t[jt.ds(0, n - 1), :]
    elif which == "normalise_by_first_col":
        t[...] = t[...] - t[:, 0:1]
    elif which == "subtract_row_max":
        t[...] = t[...] - jnp.max(t[...], axis=1, keepdims=True)
    elif which == "copy_overlap":
        jt.copy(t.at[jt.ds(0, n - 1), :], t.at[jt.ds(1, n - 1), :])
    elif which == "gemm_alias":
        jt.gemm(t, t, t)
    jt.copy(t, out)
    return out


def _hazard_want(x, which):
    x = np.asarray(x, np.float64)
    if which == "transpose":
        return x.T
    if which == "transpose_add":
        return x + x.T
    if which == "repeat_double":
        return x * 8
    if which == "read_overwrite_use":
        return x + 1
    if which == "scalar_then_overwrite":
        return np.full_like(x, 5) + x[0, 0]
    if which in ("shift_rows", "copy_overlap"):
        return np.concatenate([x[:1], x[:-1]])
    if which == "normalise_by_first_col":
        return x - x[:, :1]
    if which == "subtract_row_max":
        return x - x.max(axis=1, keepdims=True)
    if which == "gemm_alias":
        return x + x @ x
    raise AssertionError(which)


HAZARDS = ["transpose", "transpose_add", "repeat_double", "read_overwrite_use",
           "scalar_then_overwrite", "shift_rows", "normalise_by_first_col", "subtract_row_max",
           "copy_overlap", "gemm_alias"]


@pytest.mark.parametrize("which,n", [
    pytest.param(w, n, id=f"{w}-{n}")
    for w, n in [(w, 5) for w in HAZARDS] + [("transpose", 8)]
])
def test_read_write_hazards(rng, which, n):
    x = jnp.asarray(rng.integers(-8, 8, (n, n)).astype(F32))   # exact in every formula
    check(in_place, [x], _hazard_want(x, which).astype(F32), {"which": which})
