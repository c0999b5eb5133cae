"""Layouts (compiler/gpu/layout.py): the maps against independently written tables."""

import numpy as np
import pytest

from jaxtile.compiler.gpu import layout as L


def _check_bijective(lay: L.Layout) -> None:
    """Every element has `replication` owners, and (thread, slot) pairs are not shared."""
    el = lay.elements()
    real = el[..., 0] >= 0
    flat = [tuple(c) for c in el[real]]
    counts = {}
    for c in flat:
        counts[c] = counts.get(c, 0) + 1
    assert len(counts) == int(np.prod(lay.shape))
    assert set(counts.values()) == {lay.replication}


def test_mma_accumulator_matches_the_ptx_table():
    lay = L.mma_accumulator((32, 16), (1, 1))   # one warp, 2x2 atoms of m16n8
    assert lay.text() == "#mma(m16n8k16, warps 1x1)"
    assert lay.num_local == 16 and lay.threads == 32
    thread, local = lay.owners()
    # m16n8k16 C/D (docs/ptx_facts.md): lane L, g = L >> 2, t = L % 4: c0,c1 at row g,
    # c2,c3 at row g + 8; column 2t + (i & 1). Atom (mi, ni) is slot group mi * 2 + ni.
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for mi in range(2):
            for ni in range(2):
                for i in range(4):
                    r = 16 * mi + g + (8 if i >= 2 else 0)
                    c = 8 * ni + 2 * t + (i & 1)
                    assert thread[r, c, 0] == lane
                    assert local[r, c] == (mi * 2 + ni) * 4 + i
    _check_bijective(lay)


def test_mma_accumulator_warp_grid():
    lay = L.mma_accumulator((64, 32), (2, 2))
    thread, _ = lay.owners()
    warp = thread[..., 0] // 32
    # warp (i, j) = i * 2 + j owns the (i, j) 32x16 quadrant
    for i in range(2):
        for j in range(2):
            assert (warp[32 * i:32 * i + 32, 16 * j:16 * j + 16] == i * 2 + j).all()
    assert lay.num_local == 2 * 2 * 4


def test_mma_extra_threads_replicate():
    lay = L.mma_accumulator((16, 8), (1, 1), threads=64)
    thread, _ = lay.owners()
    assert (thread[..., 1] == thread[..., 0] + 32).all()
    assert lay.replica_expr("tid") == "(tid >> 5)"


@pytest.mark.parametrize("shape,threads,vec", [((8, 64), 128, 4), ((4, 100), 128, 4),
                                               ((3, 5), 32, 1), ((1000,), 128, 1),
                                               ((2, 3, 8), 16, 2), ((4, 4), 128, 4)])
def test_blocked_covers_every_element(shape, threads, vec):
    lay = L.blocked(shape, threads, vec)
    _check_bijective(lay)
    assert lay.vector_width() == vec
    el = lay.elements()
    # each thread's first vec slots are contiguous along the last dimension
    for t in range(threads):
        for k in range(0, lay.num_local, vec):
            run = el[t, k:k + vec]
            if (run >= 0).all():
                assert (np.diff(run[:, -1]) == 1).all()


def test_blocked_is_coalesced():
    lay = L.blocked((8, 64), 128, 4)
    el = lay.elements()
    # slot 0 of threads 0..15 covers row 0 in consecutive 4-element vectors
    assert [tuple(el[t, 0]) for t in range(16)] == [(0, 4 * t) for t in range(16)]
    assert tuple(el[16, 0]) == (1, 0)
    assert lay.padded_dims() == ()


def test_ragged_tiles_pad():
    lay = L.blocked((4, 100), 128, 4)
    assert lay.padded_dims() == (1,)
    assert lay.extents()[1] >= 100
    assert (lay.elements()[..., 1] < 100).all()


def test_replicated():
    lay = L.replicated((3, 2), 64)
    thread, local = lay.owners()
    assert lay.text() == "#replicated"
    assert (thread == np.arange(64)).all()
    assert (local == np.arange(6).reshape(3, 2)).all()


def test_drop_makes_reduced_threads_replicas():
    lay = L.mma_accumulator((32, 16), (1, 1))
    rows = lay.drop([1])
    assert rows.shape == (32,)
    thread, local = rows.owners()
    # row r's result sits in the 4 lanes of group g = r % 8: lanes 4g .. 4g + 3
    for r in range(32):
        assert sorted(thread[r]) == [4 * (r % 8) + i for i in range(4)]
    # a reduced slot maps to the slot of its row
    full_thread, full_local = lay.owners()
    for r in range(32):
        for c in range(16):
            assert lay.drop_slot(int(full_local[r, c]), [1]) == local[r]
    assert rows.text() == "#slice(mma(m16n8k16, warps 1x1), [32, 16], dims (1,))"


def test_c_expressions_agree_with_the_map():
    for lay in (L.mma_accumulator((64, 32), (2, 2)), L.blocked((4, 100), 128, 4),
                L.blocked((6, 10), 96, 2)):
        exprs = lay.thread_coord_exprs("tid")
        for t in range(lay.threads):
            for k in range(lay.num_local):
                got = tuple(eval(e.replace("/", "//"), {"tid": t}) + lc
                            for e, lc in zip(exprs, lay.local_coords(k)))
                assert got == lay.coords(t, k)


@pytest.mark.parametrize("lay", [
    L.mma_accumulator((64, 32), (2, 2)), L.blocked((4, 100), 128, 4), L.replicated((5,), 32),
    L.mma_accumulator((32, 16), (1, 1)).drop([1]), L.blocked((6, 10), 96, 2).drop([0]),
    L.Layout((4, 8), ((L.Factor(4, "thread", 8),), (L.Factor(8, "thread", 1),)), (), 32),
    L.Layout((), (), (L.Factor(32, "thread", 1),), 32),
    L.blocked((4, 100), 128, 4).drop([1], keepdims=True),
    L.mma_accumulator((64, 32), (2, 2)).permute((1, 0)),
    # numpy's integers (layout inference inverts permutations with np.argsort) print as
    # plain ones: "perm (np.int64(1), ...)" parsed back as the permutation (64, 1, 64, 0)
    L.blocked((16, 16), 128, 16).permute(np.argsort((1, 0))),
    L.blocked((6, 10), 96, 2).drop(np.array([1]), keepdims=True),
])
def test_text_round_trips(lay):
    back = L.parse(lay.text(), lay.shape, lay.threads)
    assert back == lay and back.text() == lay.text()


def test_invalid_factors_are_rejected():
    with pytest.raises(ValueError, match="tile"):
        L.Layout((4,), ((L.Factor(4, "thread", 2),),), (), 8)
    with pytest.raises(ValueError, match="covers"):
        L.Layout((5,), ((L.Factor(4, "thread", 1),),), (), 4)


def test_keepdims_and_permute():
    lay = L.blocked((4, 100), 128, 4)
    kept = lay.drop([1], keepdims=True)
    assert kept.shape == (4, 1) and kept.drop([1]) == lay.drop([1])
    t = L.mma_accumulator((64, 32), (2, 2)).permute((1, 0))
    thread, local = t.owners()
    t0, l0 = L.mma_accumulator((64, 32), (2, 2)).owners()
    assert (thread == t0.transpose(1, 0, 2)).all() and (local == l0.T).all()


def test_slot_expressions():
    lay = L.mma_accumulator((64, 32), (2, 2))
    exprs = lay.local_coord_exprs("k")
    for k in range(lay.num_local):
        assert tuple(eval(e, {"k": k}) for e in exprs) == lay.local_coords(k)
        assert eval(lay.drop_slot_expr("k", [1]), {"k": k}) == lay.drop_slot(k, [1])


def test_dropping_kept_dims_prints_as_the_plain_slice():
    lay = L.blocked((4, 384), 128, 4)
    twice = lay.drop([0], keepdims=True).drop([0])
    assert twice == lay.drop([0]) and twice.text() == lay.drop([0]).text()
    assert L.parse(twice.text(), twice.shape, 128) == twice


def test_the_transposed_operand_of_a_select_round_trips():
    """``lax.select(p, a[:, :16], a[:, :16].T)``: layout inference gives the transpose's
    operand the transposed layout of the slice's (a relayout before the transpose), whose text
    names the permutation; the lowered IR parses back to the same text (JAXTILE_VERIFY_IR,
    which the suite sets, makes lowering check it and the source printed from the re-parsed
    IR)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    import jaxtile as jt
    from jaxtile.compiler import parser, printer

    @jt.kernel
    def select_transposed(a, pattern):
        out = jt.empty((16, 16), a.dtype)
        t = jt.fragment(a.shape, a.dtype)
        jt.copy(a, t)
        p = jt.fragment(pattern.shape, pattern.dtype)
        jt.copy(pattern, p)
        o = jt.fragment((16, 16), a.dtype)
        o[...] = lax.select(p[...], t[:, :16], t[:, :16].T)
        jt.copy(o, out)
        return out

    for dtype in (jnp.float16, jnp.float32):
        low = select_transposed.lower(jax.ShapeDtypeStruct((16, 32), dtype),
                                      jax.ShapeDtypeStruct((16, 16), jnp.bool_),
                                      target="cuda:sm_80")
        text = low.lowered_ir
        assert "perm (1, 0))" in text and "np.int" not in text
        assert printer.format_kernel(parser.parse_kernel(text)) == text


@pytest.mark.parametrize("lay", [L.mma_accumulator((16, 8), (1, 1), threads=64),
                                 L.mma_accumulator((64, 32), (2, 2)),
                                 L.blocked((4, 100), 128, 4), L.blocked((2, 3, 8), 16, 2)],
                         ids=["replicated", "warp_grid", "padded", "rank3"])
def test_owners_are_coords_per_thread_and_slot(lay):
    """``owners`` (computed for every element at once) against :meth:`Layout.coords` asked
    one (thread, slot) at a time: each element's threads in ascending order, its slot."""
    thread, local = lay.owners()
    held: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for t in range(lay.threads):
        for k in range(lay.num_local):
            c = lay.coords(t, k)
            if all(x < n for x, n in zip(c, lay.shape)):
                held.setdefault(c, []).append((t, k))
    assert len(held) == thread[..., 0].size
    for c, pairs in held.items():
        assert list(thread[c]) == [t for t, _ in pairs]
        assert {local[c]} == {k for _, k in pairs}
