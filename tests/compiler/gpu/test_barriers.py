"""Barrier insertion on loops on a condition (``jt.while_``): the condition's reads and the
body's writes of a shared buffer are ordered across iterations (a pass-level check: the
CUDA lowering of ``jt.while_`` is separate)."""

import jax.numpy as jnp

import jaxtile as jt
from jaxtile.compiler import ir
from jaxtile.compiler.gpu.barriers import insert_barriers
from jaxtile.compiler.gpu.copy_mapping import map_copies


@jt.kernel
def _refill_while_positive(x):
    n, m = x.shape
    out = jt.empty((1, m), jnp.float32)
    s = jt.shared((m,), jnp.float32)
    i = jt.local((1,), jnp.int32)
    jt.copy(x.at[0, 0], s)
    i[0] = 0

    @jt.while_(lambda: (i[0] < n) & (s[i[0]] >= 0))
    def _():
        jt.copy(x.at[i[0], 0], s)
        i[0] += 1

    jt.copy(s, out.at[0, 0])
    return out


def _reasons(body):
    return [s.notes["reason"] for s in body if isinstance(s, ir.Op) and s.kind == "barrier"]


def test_while_loops_order_the_condition_and_the_body():
    low = _refill_while_positive.lower(jnp.zeros((4, 128), jnp.float32))
    k = insert_barriers(map_copies(low.kernel))  # barriers read the copies' thread mapping
    loop = next(s for s in k.body if isinstance(s, ir.While))
    # The condition reads an element every thread needs: after the copy before the loop and
    # after the previous iteration's refill.
    assert _reasons(loop.cond) == ["read after write of smem0"]
    # The refill overwrites what the condition's readers just read.
    assert _reasons(loop.body) == ["write after read of smem0"]
    # The loop leaves after a condition, whose barrier already ordered the last refill
    # before every later read: the copy out after the loop needs none of its own.
    assert _reasons(k.body[k.body.index(loop) + 1:]) == []
