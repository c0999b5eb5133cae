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


def test_a_buffer_touched_in_a_nested_loop_lives_for_the_outermost_loop():
    """Buffer lifetimes on the values' numbering (the shared-memory plan's): ``a`` is only
    touched before the loops, ``b`` in the inner loop (so for the whole outer one, whose
    next iteration touches it again), ``c`` in both branches of a conditional after them."""
    from jaxtile.compiler import parser
    from jaxtile.compiler.passes.liveness import buffer_lifetimes

    k = parser.parse_kernel("\n".join([
        "kernel k(grid=[1], threads=32) blocks(%0):",
        "  input x: global float32[4]",
        "  output y: global float32[4]",
        "  scratch a: shared float32[4]",
        "  scratch b: shared float32[4]",
        "  scratch c: shared float32[4]",
        "  copy() {dst=a[0:+4], pad=None, src=x[0:+4]}",                     # 0
        "  for %1 in serial(0, +2):",                                       # 1
        "    %2: int32[] = const() {value=1}",                              # 2
        "    for %3 in serial(0, +2):",                                     # 3
        "      copy() {dst=b[0:+4], pad=None, src=a[0:+4]}",                 # 4
        "    %4: int32[] = const() {value=2}",                              # 5
        "  %5: bool[] = elementwise(%0, %0) {fn='eq'}",                     # 6
        "  if %5:",                                                         # 7
        "    copy() {dst=c[0:+4], pad=None, src=x[0:+4]}",                   # 8
        "  else:",
        "    copy() {dst=y[0:+4], pad=None, src=c[0:+4]}",                   # 9
    ]))

    def shared(op):
        return [r.buffer for r in ir.regions(op) if r.buffer in "abc"]

    assert buffer_lifetimes(k.body, shared) == {"a": (0, 5), "b": (1, 5), "c": (8, 9)}
