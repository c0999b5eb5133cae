"""Bounds proofs for the GPU: a global access keeps a mask only on the dimensions that
interval arithmetic, TVM's analyzer and z3 all fail to prove in bounds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import ir
from jaxtile.compiler.gpu import bounds
from jaxtile.compiler.gpu.bounds import check_bounds, kept_masks


def _ir(kernel, *shapes, dtype=jnp.float32, **params):
    specs = tuple(jax.ShapeDtypeStruct(s, d) for s, d in
                  (x if isinstance(x[1], type) else (x, dtype) for x in shapes))
    return check_bounds(kernel._specialise(specs, params).tile_ir)


def _masks(kernel_ir):
    """``{(op kind, buffer): dims kept}`` over the whole kernel."""
    out = {}
    for s in ir.walk(kernel_ir.body):
        if isinstance(s, ir.Op):
            for attr, dims in s.notes.get("masks", ()):
                out[(s.kind, s.attrs[attr].buffer)] = dims
    return out


def _provers(kernel_ir):
    return {p for s in ir.walk(kernel_ir.body) if isinstance(s, ir.Op)
            for *_, p in s.notes.get("bounds_proofs", ())}


@jt.kernel
def _tiles(x, *, bm=16, bn=32):
    n, m = x.shape
    out = jt.empty((n, m), x.dtype)
    i, j = jt.grid(jt.cdiv(n, bm), jt.cdiv(m, bn))
    a = jt.fragment((bm, bn), x.dtype)
    jt.copy(x.at[i * bm, j * bn], a)
    jt.copy(a, out.at[i * bm, j * bn])
    return out


@pytest.mark.parametrize("shape,kept", [((64, 64), ()), ((60, 64), (0,)), ((64, 40), (1,)),
                                        ((7, 33), (0, 1))])
def test_masks_only_on_ragged_dims(shape, kept, monkeypatch):
    def no_prover(*_):
        raise AssertionError("a corner of the grid refutes a ragged edge; no prover needed")

    monkeypatch.setattr(bounds._Provers, "_by_tvm", no_prover)
    monkeypatch.setattr(bounds._Provers, "_by_z3", no_prover)
    k = _ir(_tiles, shape)
    assert _masks(k) == {("copy", "x"): kept, ("copy", "out0"): kept}
    assert len(kept_masks(k)) == (2 if kept else 0)
    assert _provers(k) <= {"interval"}      # affine in the block index: no prover needed


@jt.kernel
def _gemm(a, b, *, bm=32, bn=32, bk=16):
    m, kd = a.shape
    n = b.shape[1]
    out = jt.empty((m, n), jnp.float32)
    i, j = jt.grid(jt.cdiv(m, bm), jt.cdiv(n, bn))
    acc = jt.fragment((bm, bn), jnp.float32)
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.pipelined(jt.cdiv(kd, bk), stages=2)
    def _(k):
        jt.copy(a.at[i * bm, k * bk], a_s)
        jt.copy(b.at[k * bk, j * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    jt.copy(acc, out.at[i * bm, j * bn])
    return out


def test_gemm_k_loop_ragged_only_in_k():
    k = _ir(_gemm, (64, 40), (40, 96))
    assert _masks(k) == {("copy", "a"): (1,), ("copy", "b"): (0,), ("copy", "out0"): ()}
    k = _ir(_gemm, (64, 48), (48, 96))
    assert all(d == () for d in _masks(k).values())


@jt.kernel
def _prefix(x, *, rows=8):
    """A loop bound traced from the block index: rows 0..b of x."""
    n, m = x.shape
    out = jt.empty((n, m), jnp.float32)
    b = jt.grid(jt.cdiv(n, rows))
    acc = jt.fragment((rows, m), jnp.float32)
    tile = jt.fragment((rows, m), jnp.float32)
    acc[...] = jnp.zeros((rows, m), jnp.float32)

    @jt.loop(0, jnp.minimum(jt.cdiv(n, rows), b + 1))
    def _(k):
        jt.copy(x.at[k * rows, 0], tile)
        acc[...] += tile[...]

    jt.copy(acc, out.at[b * rows, 0])
    return out


@pytest.mark.parametrize("n,kept", [(64, ()), (29, (0,))])
def test_traced_loop_bound(n, kept):
    assert _masks(_ir(_prefix, (n, 24))) == {("copy", "x"): kept, ("copy", "out0"): kept}


@jt.kernel
def _suffix(x, *, rows=8):
    """Loop k from the block index to the end; the copy's row is k - b: only z3 relates
    the loop variable to the block index it starts at."""
    n, m = x.shape
    out = jt.empty((n, m), jnp.float32)
    b = jt.grid(n // rows)
    acc = jt.fragment((rows, m), jnp.float32)
    tile = jt.fragment((rows, m), jnp.float32)
    acc[...] = jnp.zeros((rows, m), jnp.float32)

    @jt.loop(b, n // rows)
    def _(k):
        jt.copy(x.at[(k - b) * rows, 0], tile)
        acc[...] += tile[...]

    jt.copy(acc, out.at[b * rows, 0])
    return out


def test_only_z3_proves_a_correlated_start():
    k = _ir(_suffix, (64, 16))
    assert _masks(k) == {("copy", "x"): (), ("copy", "out0"): ()}
    proofs = {(s.attrs[a].buffer, d, p) for s in ir.walk(k.body) if isinstance(s, ir.Op)
              for a, d, p in s.notes.get("bounds_proofs", ())}
    assert ("x", 0, "z3") in proofs           # neither intervals nor TVM relate k and b
    assert ("x", 1, "interval") in proofs


@jt.kernel
def _by_start(x, starts):
    b = jt.grid(starts.shape[0])
    out = jt.empty((starts.shape[0] * 4, x.shape[1]), x.dtype)
    t = jt.fragment((4, x.shape[1]), x.dtype)
    jt.copy(x.at[starts[b], 0], t)
    jt.copy(t, out.at[b * 4, 0])
    return out


def test_nobody_proves_a_start_read_from_memory():
    k = _ir(_by_start, (10, 6), ((3,), jnp.int32))
    m = _masks(k)
    assert m[("copy", "x")] == (0,)
    assert m[("copy", "out0")] == ()
    assert m[("load", "starts")] == ()        # the scalar read itself is in bounds
    assert any(line.startswith("copy src=x dims (0,)") for line in kept_masks(k))


@jt.kernel
def _gather(table, ids):
    out = jt.empty((ids.shape[0], table.shape[1]), table.dtype)
    jt.grid(1)
    idx = jt.fragment(ids.shape, ids.dtype)
    rows = jt.fragment((ids.shape[0], table.shape[1]), table.dtype)
    jt.copy(ids, idx)
    jt.gather(table, idx[...], rows)
    jt.copy(rows, out)
    return out


def test_gather_dims_always_masked():
    m = _masks(_ir(_gather, (16, 8), ((4,), jnp.int32)))
    assert m[("copy", "table")] == (0,)       # gathered rows: per-element check
    assert m[("copy", "ids")] == () and m[("copy", "out0")] == ()


def _dynamic_kernel(rows_expr):
    """``x: [rows_expr, 64]``, grid ``n`` blocks, block b copies rows [16 b, 16 b + 16)."""
    b = ir.Value((), np.int32)
    c16 = ir.Value((), np.int32)
    start = ir.Value((), np.int32)
    bufs = (ir.Buffer("x", (rows_expr, 64), np.dtype(np.float32), "global", "input"),
            ir.Buffer("t", (16, 64), np.dtype(np.float32), "fragment", "scratch"))
    body = (ir.Op("const", (), c16, {"value": 16}),
            ir.Op("elementwise", (b, c16), start, {"fn": "mul"}),
            ir.Op("copy", (), None, {"src": ir.Region("x", (ir.Index(start, 16), ir.Index(0, 64))),
                                     "dst": ir.whole("t", (16, 64)), "pad": None}))
    return ir.Kernel("dyn", ("n",), 128, bufs, (b,), body)


@pytest.mark.parametrize("rows,kept", [("n*16", ()), ("n*16+3", ()), ("n*8", (0,)),
                                       ("floordiv(n,2)", (0,))])
def test_dynamic_sizes_are_symbols(rows, kept):
    k = check_bounds(_dynamic_kernel(rows))
    assert _masks(k) == {("copy", "x"): kept}
    if rows == "n*16":                  # 16 b + 16 <= 16 n from b < n: TVM's analyzer
        assert _provers(k) == {"interval", "tvm"}


def test_if_condition_is_known_in_its_branch():
    b, c, lim, start, cond = (ir.Value((), np.int32) for _ in range(5))
    cond = ir.Value((), np.bool_)
    bufs = (ir.Buffer("x", (40,), np.dtype(np.float32), "global", "input"),
            ir.Buffer("t", (8,), np.dtype(np.float32), "fragment", "scratch"))
    copy = ir.Op("copy", (), None, {"src": ir.Region("x", (ir.Index(start, 8),)),
                                    "dst": ir.whole("t", (8,)), "pad": None})
    body = (ir.Op("const", (), c, {"value": 8}), ir.Op("const", (), lim, {"value": 32}),
            ir.Op("elementwise", (b, c), start, {"fn": "mul"}),
            ir.Op("elementwise", (start, lim), cond, {"fn": "le"}),
            ir.If(cond, (copy,), (copy,)))
    k = check_bounds(ir.Kernel("cond", (8,), 128, bufs, (b,), body))
    then, otherwise = k.body[-1].then[0], k.body[-1].otherwise[0]
    assert dict(then.notes["masks"])["src"] == ()     # 8 b <= 32 there
    assert dict(otherwise.notes["masks"])["src"] == (0,)


def _random_case(rng):
    """A grid of g blocks, a loop k over [lo, lo + e) where lo is 0 or the block index b,
    and a copy of ``size`` elements at ``p*b + q*k + c`` (or ``min``/``max`` of that and a
    constant) from a buffer of n elements."""
    g, e, size, n = (int(rng.integers(1, 5)), int(rng.integers(0, 4)),
                     int(rng.integers(1, 5)), int(rng.integers(4, 24)))
    p, q, c = (int(x) for x in rng.integers(-3, 5, size=3))
    from_b = bool(rng.integers(2))
    clamp = [None, ("min", int(rng.integers(0, 20))), ("max", int(rng.integers(-2, 6)))][
        int(rng.integers(3))]
    i32 = np.dtype(np.int32)
    b, k = ir.Value((), i32), ir.Value((), i32)
    consts = {v: ir.Value((), i32) for v in {p, q, c, e} | ({clamp[1]} if clamp else set())}
    pb, qk, s1, start = (ir.Value((), i32) for _ in range(4))
    ops = [ir.Op("const", (), val, {"value": v}) for v, val in consts.items()]
    loop_ops = [ir.Op("elementwise", (b, consts[p]), pb, {"fn": "mul"}),
                ir.Op("elementwise", (k, consts[q]), qk, {"fn": "mul"}),
                ir.Op("elementwise", (pb, qk), s1, {"fn": "add"}),
                ir.Op("elementwise", (s1, consts[c]), start, {"fn": "add"})]
    if clamp:
        clamped = ir.Value((), i32)
        loop_ops.append(ir.Op("elementwise", (start, consts[clamp[1]]), clamped,
                              {"fn": clamp[0]}))
        start = clamped
    bufs = (ir.Buffer("x", (n,), np.dtype(np.float32), "global", "input"),
            ir.Buffer("t", (size,), np.dtype(np.float32), "fragment", "scratch"))
    loop_ops.append(ir.Op("copy", (), None, {"src": ir.Region("x", (ir.Index(start, size),)),
                                             "dst": ir.whole("t", (size,)), "pad": None}))
    loop = ir.For(k, b if from_b else 0, consts[e], "serial", 1, loop_ops)
    kernel = ir.Kernel("rand", (g,), 128, bufs, (b,), ops + [loop])

    def starts():
        for bv in range(g):
            for kv in range(bv if from_b else 0, (bv if from_b else 0) + e):
                v = p * bv + q * kv + c
                yield v if clamp is None else (min if clamp[0] == "min" else max)(v, clamp[1])

    in_bounds = all(0 <= v and v + size <= n for v in starts())
    return kernel, in_bounds


def test_masks_agree_with_enumerating_every_block_and_iteration():
    """Sound (no mask dropped that an execution needs) and, for these affine cases with
    min/max, complete: z3 decides linear integer arithmetic."""
    rng = np.random.default_rng(11)
    outcomes = set()
    for _ in range(60):
        kernel, in_bounds = _random_case(rng)
        copy = next(s for s in ir.walk(check_bounds(kernel).body)
                    if isinstance(s, ir.Op) and s.kind == "copy")
        assert (dict(copy.notes["masks"])["src"] == ()) == in_bounds
        outcomes.add(in_bounds)
    assert outcomes == {True, False}


@jt.kernel
def _split_k(a, b, *, splits=2, bm=16, bn=16, bk=16):
    m, k = a.shape
    n = b.shape[1]
    c = jt.empty((m, n), jnp.float32)
    bx, by, bs = jt.grid(jt.cdiv(n, bn), jt.cdiv(m, bm), splits)
    per_split = jt.cdiv(jt.cdiv(k, bk), splits)
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.loop(per_split)
    def _(i):
        kk = (bs * per_split + i) * bk
        jt.copy(a.at[by * bm, kk], a_s)
        jt.copy(b.at[kk, bx * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    jt.atomic_add(c.at[by * bm, bx * bn], acc[...])
    return c


@pytest.mark.parametrize("splits,k_kept", [(2, ()), (4, ()), (3, True)])
def test_split_k_masks_k_only_when_the_splits_overshoot(splits, k_kept):
    """k = 128 is 8 tiles: 2 or 4 splits cover them exactly, 3 splits of 3 tiles reach 9."""
    m = _masks(_ir(_split_k, (64, 128), (128, 48), splits=splits))
    assert m[("atomic", "out0")] == ()
    assert m[("copy", "a")] == ((1,) if k_kept else ())
    assert m[("copy", "b")] == ((0,) if k_kept else ())


@pytest.mark.parametrize("dtype,kept", [(np.int64, ()), (np.int8, (0,)), (np.uint32, (0,))])
def test_wrapping_conversions_keep_the_mask(dtype, kept):
    """``x[convert(8 b):+8]`` over 8 blocks of a 64-element x: exact through a widening
    conversion; an int8 or unsigned value may wrap, which the proof does not model."""
    i32 = np.dtype(np.int32)
    b, c8, start, conv = ir.Value((), i32), ir.Value((), i32), ir.Value((), i32), \
        ir.Value((), dtype)
    bufs = (ir.Buffer("x", (64,), np.dtype(np.float32), "global", "input"),
            ir.Buffer("t", (8,), np.dtype(np.float32), "fragment", "scratch"))
    body = (ir.Op("const", (), c8, {"value": 8}),
            ir.Op("elementwise", (b, c8), start, {"fn": "mul"}),
            ir.Op("convert", (start,), conv, {}),
            ir.Op("copy", (), None, {"src": ir.Region("x", (ir.Index(conv, 8),)),
                                     "dst": ir.whole("t", (8,)), "pad": None}))
    k = check_bounds(ir.Kernel("wrap", (8,), 128, bufs, (b,), body))
    assert _masks(k) == {("copy", "x"): kept}


@jt.kernel
def _keys(x, lengths, *, rows=32):
    """Like attention's key loop: the trip count is read from memory, so the loop variable is
    known only to be >= 0 (and below an unknown end)."""
    out = jt.empty((rows, x.shape[1]), x.dtype)
    jt.grid(1)
    acc = jt.fragment((rows, x.shape[1]), x.dtype)
    tile = jt.fragment((rows, x.shape[1]), x.dtype)
    acc[...] = jnp.zeros((rows, x.shape[1]), x.dtype)

    @jt.loop(jt.cdiv(lengths[0], rows))
    def _(i):
        jt.copy(x.at[i * rows, 0], tile)
        acc[...] += tile[...]
        jt.copy(x.at[i * rows, 0], tile)          # the same access again: answered once
        acc[...] += tile[...]

    jt.copy(acc, out.at[0, 0])
    return out


def test_a_data_dependent_trip_count_needs_no_prover(monkeypatch):
    """``0 <= i * rows`` follows from the loop's ``0 <= i`` by interval arithmetic; the end
    ``i * rows + rows <= n`` has a counterexample (an end of 2**21 with i = 2**20): neither
    imports TVM or z3, which cost a cold compile about a second. Each distinct query is
    decided once."""
    def no_prover(*_):
        raise AssertionError("intervals and the corner search decide this kernel")

    monkeypatch.setattr(bounds._Provers, "_by_tvm", no_prover)
    monkeypatch.setattr(bounds._Provers, "_by_z3", no_prover)
    decided = []
    prove = bounds._Provers._prove
    monkeypatch.setattr(bounds._Provers, "_prove",
                        lambda self, goal, facts: decided.append((goal, tuple(facts.conds)))
                        or prove(self, goal, facts))
    k = _ir(_keys, (256, 16), ((1,), jnp.int32))
    copies = [s for s in ir.walk(k.body) if isinstance(s, ir.Op) and s.kind == "copy"
              and s.attrs["src"].buffer == "x"]
    assert len(copies) == 2
    for copy in copies:
        assert dict(copy.notes["masks"]) == {"src": (0,)}
        assert set(copy.notes["bounds_proofs"]) == {("src", 1, "interval")}
    assert decided and len(decided) == len(set(decided))
