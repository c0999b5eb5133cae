"""Code written against jaxtile's public API, for mypy (``test_typing.py``), not pytest.

``assert_type`` fails the check when a public function's result is not the stated type, in
particular when it degrades to ``Any``; the calls fail it when a parameter's type stops
accepting what users pass.
"""

from __future__ import annotations

from typing import assert_type

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt
from jaxtile.autotune import TunedKernel, TuningReport


@jt.kernel(threads=128)
def scale_rows(x: jt.Ref, w: jt.Ref, *, rows: int = 8) -> jt.Ref:
    n, d = x.shape
    out = jt.empty((n, d), x.dtype)
    assert_type(out, jt.Ref)
    r = jt.grid(jt.cdiv(n, rows))
    assert_type(r, jax.Array)
    assert_type(jt.cdiv(n, rows), int)
    t = jt.fragment((rows, d), jnp.float32)
    s = jt.shared((rows, d), jnp.float32)
    count = jt.local((1,), jnp.int32)
    jt.copy(x.at[r * rows, 0], t)
    jt.copy(t, s)
    assert_type(t[...], jax.Array)
    t[...] = t[...] * w[...][None, :]
    count[0] = 0

    @jt.loop(jt.cdiv(d, 4))
    def _(j: jax.Array) -> None:
        count[0] += 1

    @jt.pipelined(2, stages=2)
    def _(j: jax.Array) -> None:
        jt.gemm(s.at[:, jt.ds(0, rows)], s, t)

    @jt.when(r == 0)
    def _() -> None:
        jt.atomic_add(count.at[0], 1)

    @jt.while_(lambda: count[0] < 3)
    def _() -> None:
        count[0] += 1

    ids = jnp.zeros((rows,), jnp.int32)
    jt.gather(x, ids, t, pad=0.0)
    jt.scatter(t, ids, out)
    jt.copy(t, out.at[r * rows, 0])
    return out


def _two_dimensional_grid() -> None:
    bx, by = jt.grid(4, 8)
    assert_type(bx, jax.Array)
    assert_type(jt.grid(1, 2, 3), tuple[jax.Array, jax.Array, jax.Array])


assert_type(scale_rows, jt.Kernel)
assert_type(jt.kernel(lambda x: x), jt.Kernel)
assert_type(jt.kernel(lambda x: x, threads=64), jt.Kernel)
x = np.ones((16, 32), np.float32)
lowered = scale_rows.lower(x, np.ones((32,), np.float32), target="cuda:sm_80", rows=4)
assert_type(lowered, jt.Lowered)
assert_type(lowered.source, str)
assert_type(jt.ops.softmax, jt.Kernel)
assert_type(jt.backend(), str)
jt.set_backend("cpu")
jt.set_interpret(False)
assert_type(jt.export_checks(), list[jax.export.DisabledSafetyCheck])
assert_type(jt.stats(), dict[str, jt.KernelStats])
for counts in jt.stats(reset=True).values():
    assert_type(counts.compile_seconds, float)
tuned = jt.autotune(scale_rows, configs=[{"rows": 4}, {"rows": 8, "threads": 64}])
assert_type(tuned, TunedKernel)
assert_type(jt.autotune(configs=[{"rows": 4}])(scale_rows), TunedKernel)
assert_type(scale_rows.autotune([{"rows": 4}], runs=3), TunedKernel)
assert_type(tuned.tuning_report(x, np.ones((32,), np.float32)), TuningReport)
