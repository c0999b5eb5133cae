"""The target-neutral liveness analysis and storage sharing (compiler/passes/liveness.py)."""

import jax
import jax.numpy as jnp

import jaxtile as jt
from jaxtile.compiler import ir
from jaxtile.compiler.passes.fusion import fuse_elementwise
from jaxtile.compiler.passes.liveness import live_intervals, share_storage


def _fused(kernel, *args):
    return fuse_elementwise(kernel.lower(*args).kernel)


def test_a_chain_of_materialised_values_needs_two_buffers():
    @jt.kernel
    def chain(x):
        out = jt.empty(x.shape, x.dtype)
        v = x[...]
        for _ in range(30):
            v = jnp.tanh(v) * 0.5 + v * 0.25
        out[...] = v
        return out

    k = _fused(chain, jax.ShapeDtypeStruct((8, 128), jnp.float32))
    intervals = live_intervals(k)
    assert len(intervals) >= 25
    slots = share_storage(intervals, lambda v: (v.shape, v.dtype.name))
    assert len(set(slots.values())) == 2
    # No two values of one slot are ever live at once.
    by_slot = {}
    for iv in intervals:
        by_slot.setdefault(slots[iv.value.id], []).append(iv)
    for ivs in by_slot.values():
        ivs.sort(key=lambda iv: iv.start)
        assert all(a.end < b.start for a, b in zip(ivs, ivs[1:]))


def test_a_value_read_in_a_loop_lives_to_the_loop_end():
    @jt.kernel
    def looped(x):
        out = jt.empty(x.shape, x.dtype)
        acc = jt.fragment(x.shape, x.dtype)
        acc[...] = jnp.zeros(x.shape, x.dtype)
        v = jnp.exp(x[...])
        w = v * v                      # read in every iteration of the loop below

        @jt.loop(4)
        def _(i):
            acc[...] = acc[...] + w

        out[...] = acc[...]
        return out

    k = _fused(looped, jax.ShapeDtypeStruct((8, 128), jnp.float32))
    loop_pos = [i for i, s in enumerate(ir.walk(k.body)) if isinstance(s, ir.For)]
    assert len(loop_pos) == 1
    n_in_loop = len(list(ir.walk(next(s for s in k.body if isinstance(s, ir.For)).body)))
    loop_end = loop_pos[0] + n_in_loop
    ends = [iv.end for iv in live_intervals(k) if iv.start < loop_pos[0]]
    assert loop_end in ends
