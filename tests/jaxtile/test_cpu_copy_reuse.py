"""Copies shared by the blocks of a call on the CPU (``compiler/cpu/copy_reuse.py``): which
copies are made once and in which block order, and the results, for whole calls and for
calls that run any part of the grid, against the reference semantics and numpy; and the
re-layouts of a shared operand that the bfloat16 gemms keep from one block to the next."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemm_kernels import matmul
from language_helpers import BF16, F32, aligned, data

import jaxtile as jt
from jaxtile import _ffi
from jaxtile.compiler import build
from jaxtile.compiler.cpu import copy_reuse, forwarding
from jaxtile.compiler.target import parse_target


@jt.kernel
def scaled_rows(x, w, *, rows=8):
    """``w`` is copied into a fragment that loads read: forwarding may leave it unfilled,
    so it is not shared."""
    out = jt.empty(x.shape, x.dtype)
    i = jt.grid(jt.cdiv(x.shape[0], rows))
    t = jt.fragment((rows, x.shape[1]), jnp.float32)
    w_t = jt.fragment((x.shape[1],), jnp.float32)
    jt.copy(x.at[i * rows, 0], t)
    jt.copy(w, w_t)
    t[...] = t[...] * w_t[...][None, :]
    jt.copy(t, out.at[i * rows, 0])
    return out


def _plan(kernel, *args, **params):
    lowered = build.lowered_ir(kernel.lower(*args, **params).kernel, parse_target("cpu"))
    return copy_reuse.plan(lowered, forwarding.gemm_operands(lowered)), lowered


def _shared_sources(plan, lowered):
    return sorted(s.attrs["src"].buffer for s in lowered.body if id(s) in plan.copies)


def test_the_panel_of_b_is_shared_with_the_row_blocks_fastest():
    a, b = jnp.zeros((64, 96), F32), jnp.zeros((96, 128), F32)
    plan, lowered = _plan(matmul, a, b)
    # The copy of B (256-byte rows) costs more than A's (384-byte rows, as many bytes):
    # blocks down a column of C run one after another and share it.
    assert plan.fastest == 1 and _shared_sources(plan, lowered) == ["b"]
    # One column of blocks: A's copy depends on the only axis that moves; B's is shared.
    plan, lowered = _plan(matmul, a, jnp.zeros((96, 32), F32))
    assert plan.fastest == 1 and _shared_sources(plan, lowered) == ["b"]
    # One row of blocks: the copy of A would be the one to share, but the gemm reads A's
    # rows where they are (forwarding.gemm_operands), so no copy stays for a block to share.
    plan, lowered = _plan(matmul, jnp.zeros((16, 96), F32), b)
    assert plan is None
    assert [r.src.buffer for r in forwarding.gemm_operands(lowered).values()] == ["a"]
    # bfloat16 A is widened by its copy where the gemm takes the FMA path (the operands
    # forwarded without caps): that copy stays, and is shared.
    plan, lowered = _plan(matmul, jnp.zeros((16, 96), BF16), b.astype(BF16))
    assert plan.fastest == 0 and _shared_sources(plan, lowered) == ["a"]


def test_copies_not_shared():
    # A K loop too deep for one panel keeps its copies in the loop, unshared; only the
    # remainder panel (17 steps of 8, all of its K in one copy) is the block's own.
    plan, lowered = _plan(matmul, jnp.zeros((32, 5000), F32), jnp.zeros((5000, 64), F32))
    shared = [s for s in lowered.body if id(s) in plan.copies]
    assert [(s.attrs["src"].buffer, s.attrs["src"].index[0].size) for s in shared] == \
        [("b", 136)]
    plan, _ = _plan(scaled_rows, jnp.zeros((64, 128), F32), jnp.zeros((128,), F32))
    assert plan is None


def _bound(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape[1] * 2.0 ** -24 * (np.abs(a) @ np.abs(b)) + 1e-30


@pytest.mark.parametrize("shape", [(37, 300, 45), (64, 96, 128)], ids=["ragged", "even"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_shared_copies_give_the_product(rng, shape, dtype):
    m, k, n = shape
    a, b = data(rng, (m, k), dtype, edges=False), data(rng, (k, n), dtype, edges=False)
    plan, _ = _plan(matmul, a, b)
    assert plan is not None
    got = np.asarray(jax.jit(matmul)(a, b))
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    assert (np.abs(got - exact) <= _bound(a, b)).all()
    ref = np.asarray(matmul.reference(a, b))
    assert (np.abs(got - ref) <= 2 * _bound(a, b)).all()


@pytest.mark.parametrize("cuts", [(0, 16), (0, 5, 16), (0, 7, 9, 16), tuple(range(17))])
def test_calls_over_parts_of_the_grid(rng, cuts):
    """However the runtime splits the grid into calls (one per thread chunk), each call
    starts with nothing shared, and together they compute the product."""
    a = np.asarray(data(rng, (64, 96), F32, edges=False))
    b = np.asarray(data(rng, (96, 128), F32, edges=False))
    lowered = matmul.lower(a, b)                       # grid (4, 4)
    want = np.asarray(jax.jit(matmul)(a, b))           # also loads the kernel
    out = aligned(np.full((64, 128), np.nan, np.float32))
    args = [aligned(a), aligned(b), out]
    for begin, end in zip(cuts, cuts[1:]):
        _ffi.call_kernel(lowered.key, args, begin, end)
    np.testing.assert_array_equal(out, want)
    assert (np.abs(out - np.asarray(a, np.float64) @ b) <= _bound(a, b)).all()


@pytest.mark.parametrize("cuts", [(0, 16), (0, 5, 16), (0, 7, 9, 16), tuple(range(17))])
def test_a_shared_operand_is_relaid_again_only_after_its_copy(relaying, rng, cuts):
    """The gemm re-lays B's panel under a flag that the call starts with raised and the
    shared copy of B raises again: the blocks of one column of C (fastest) re-lay it
    once. However the grid is split into calls, and wherever a call crosses from one
    column of blocks to the next (B's panel changes), the product is right: bitwise what
    the whole call computes, within the float32 bound of the float64 product."""
    a = np.asarray(data(rng, (64, 96), BF16, edges=False))
    b = np.asarray(data(rng, (96, 128), BF16, edges=False))
    lowered = matmul.lower(a, b)                       # grid (4, 4)
    source = lowered.source
    stale = sorted(set(re.findall(r"\b(stale\d*)\[0\]", source)))
    assert len(stale) == 1, stale                      # B's; A's copy is not shared
    raised = re.findall(rf"{stale[0]}\[0\] = 1\b", source)
    assert len(raised) == 2                            # before the blocks, by the copy
    assert len(re.findall(rf"if {stale[0]}\[0\] != 0", source)) == 1
    # A fresh function, traced for this target (jax.jit(matmul) may hold another's).
    want = np.asarray(jax.jit(lambda x, y: matmul(x, y))(a, b))   # also loads the kernel
    out = aligned(np.full((64, 128), np.nan, np.float32))
    args = [jnp.asarray(a), jnp.asarray(b), out]        # numpy's bfloat16 has no DLPack
    for begin, end in zip(cuts, cuts[1:]):
        _ffi.call_kernel(lowered.key, args, begin, end)
    np.testing.assert_array_equal(out, want)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    assert (np.abs(out - exact) <= _bound(a, b)).all()
