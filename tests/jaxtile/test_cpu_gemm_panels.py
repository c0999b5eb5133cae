"""GEMM panels filled by one copy (``compiler/passes/gemm_panels.py``): when the tiles of a
panel lie side by side in the source, the pass copies the whole panel at once; when they
do not (here: a K loop that walks backwards), it copies them one by one. Both give the
result of the loop as written, bitwise."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from language_helpers import BF16, F32, data

import jaxtile as jt
from jaxtile.compiler import build, ir
from jaxtile.compiler.target import parse_target


@jt.kernel
def matmul(a, b, *, bm=16, bn=32, bk=8, backwards=False, hoisted=False):
    m, k = a.shape
    n = b.shape[1]
    steps = -(-k // bk)
    c = jt.empty((m, n), jnp.float32)
    j, i = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm))
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)
    row = i * bm if hoisted else None

    @jt.loop(steps)
    def _(kk):
        t = steps - 1 - kk if backwards else kk
        jt.copy(a.at[i * bm if row is None else row, t * bk], a_s)
        jt.copy(b.at[t * bk, j * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    jt.copy(acc, c.at[i * bm, j * bn])
    return c


def _copies(kernel):
    """(source K extent, destination buffer) of every copy into a panel."""
    out = []
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Op) and s.kind == "copy" and "panel" in s.attrs["dst"].buffer:
            src = s.attrs["src"]
            k_dim = 1 if src.buffer == "a" else 0
            out.append((src.index[k_dim].size, s.attrs["dst"].buffer))
    return out


def test_side_by_side_tiles_are_copied_at_once():
    x = jnp.zeros((20, 300), jnp.float32)
    y = jnp.zeros((300, 40), jnp.float32)
    kernel = build.lowered_ir(matmul.lower(x, y).kernel, parse_target("cpu"))
    # 38 steps of 8 in one panel of all of K (304): 16 x 304 and 304 x 32 float32 fit the
    # budget; one copy per operand, and no K loop left.
    assert sorted(_copies(kernel)) == [(304, "smem0_panel"), (304, "smem1_panel")]
    assert not any(isinstance(s, ir.For) for s in kernel.body)
    # 625 steps: 16 x 5000 float32 is over the budget, so panels of 32 steps (256) and one
    # of the 17 left (136).
    x, y = jnp.zeros((20, 5000), jnp.float32), jnp.zeros((5000, 40), jnp.float32)
    kernel = build.lowered_ir(matmul.lower(x, y).kernel, parse_target("cpu"))
    assert sorted(_copies(kernel)) == [(136, "smem0_panel1"), (136, "smem1_panel1"),
                                       (256, "smem0_panel"), (256, "smem1_panel")]
    kernel = build.lowered_ir(matmul.lower(x, y, backwards=True).kernel, parse_target("cpu"))
    assert {size for size, _ in _copies(kernel)} == {8}           # one copy per tile


def test_a_k_step_shared_with_a_constant_outside_the_loop_is_still_seen():
    # With bm == bk and the row start computed before the loop, canonicalisation shares the
    # loop's constant 8 (in t * 8) with the one outside: the K start stays 8 * t.
    x = jnp.zeros((20, 300), jnp.float32)
    y = jnp.zeros((300, 40), jnp.float32)
    lowered = matmul.lower(x, y, bm=8, hoisted=True)
    kernel = build.lowered_ir(lowered.kernel, parse_target("cpu"))
    assert sorted(_copies(kernel)) == [(304, "smem0_panel"), (304, "smem1_panel")]
    np.testing.assert_array_equal(
        jax.jit(lambda a, b: matmul(a, b, bm=8, hoisted=True))(x + 1, y + 2),
        np.full((20, 40), 600.0, np.float32))


@pytest.mark.parametrize("k", [300, 5000], ids=["one_panel", "panels_and_rest"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("backwards", [False, True], ids=["forwards", "backwards"])
def test_panel_copies_give_the_loop_as_written(rng, dtype, backwards, k):
    m, n = 37, 45
    a = data(rng, (m, k), dtype, edges=False)
    b = data(rng, (k, n), dtype, edges=False)
    got = np.asarray(jax.jit(lambda a, b: matmul(a, b, backwards=backwards))(a, b))
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    bound = k * 2.0 ** -24 * (np.abs(np.asarray(a, np.float64)) @ np.abs(np.asarray(b,
                                                                                   np.float64)))
    assert (np.abs(got - exact) <= bound + 1e-30).all()
    ref = np.asarray(matmul.reference(a, b, backwards=backwards))
    assert (np.abs(got - ref) <= 2 * bound + 1e-30).all()
    if not backwards:
        # One step over all of K adds the same products in the same order.
        whole = jax.jit(lambda a, b: matmul(a, b, bk=-(-k // 8) * 8))(a, b)
        np.testing.assert_array_equal(got, np.asarray(whole))
