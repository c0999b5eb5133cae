"""``C += op(A) @ op(B)`` for bfloat16 ``A`` and ``B`` into a float32 ``C`` with
``vdpbf16ps`` (see :mod:`.bf16_dot`), on targets whose capabilities say they have it
(``CpuCaps.bf16_dot``); elsewhere :mod:`.gemm` widens the operands and uses float32 FMAs.

The instruction multiplies bfloat16 values in pairs along K, so both operands are first
repacked into int32 arrays whose every element holds one pair: ``A`` as
``(A[i, 2p], A[i, 2p+1])`` at ``[i, p]`` and ``B`` as ``(B[2p, j], B[2p+1, j])`` at
``[p, j]`` (transposes are undone by the same copies). An odd K gets a zero partner in
both operands, whose product is 0 (0 x 0: the padding never meets an infinity), and the
columns of ``B`` are padded with zeros to whole vectors. The repacking reads every element
once, against ``m * n * k`` multiply-adds, so it costs about ``1/n + 1/m`` of the work.

``C`` is computed in register tiles of :data:`ROWS` rows by :data:`VECTORS` vectors of
16 float32 lanes: per pair of K, one vector load of ``B`` per column vector, one broadcast
of a pair of ``A`` per row, and ``ROWS * VECTORS`` dot instructions on registers (the
tile's rows and vectors are unrolled here, in Python). Tiles at the right and bottom
edges are the same code with fewer rows and vectors; a last, partial vector is loaded and
stored element by element, and its lanes past ``n`` (fed by the zero padding) are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tvm import tirx
from tvm.ir import Expr

from . import gemm_amx
from .bf16_dot import LANES, dot_pairs
from .context import Lowering
from .copy_reuse import Relayout, relaid_array, relaying
from .gemm_live import Live, when

ROWS = 4
VECTORS = 4
"""A register tile is ``ROWS`` x ``VECTORS`` accumulators of 16 lanes: 16 of the 32 zmm
registers, plus four vectors of ``B`` and a broadcast of ``A``; ``vdpbf16ps`` has a
latency of 6 cycles and a throughput of 1 per cycle on Zen 4, so 16 independent
accumulators keep it busy."""


def lower_gemm_bf16(low: Lowering, A: tirx.Buffer, B: tirx.Buffer, C: tirx.Buffer, *,
                    transpose_a: bool, transpose_b: bool, live: Live,
                    kept: Mapping[str, Relayout] | None = None,
                    a_read: Callable[[Expr, Expr], Expr] | None = None,
                    a_rows: tuple[tirx.Buffer, Expr, Expr] | None = None) -> None:
    """Emit ``C += op(A) @ op(B)`` for whole local buffers ``A``, ``B`` (bfloat16) and
    ``C`` (float32) with static shapes; register tiles with no ``live`` row or column are
    left out. An operand named in ``kept`` (``"a"``, ``"b"``) is re-laid into its
    :class:`.copy_reuse.Relayout`'s arrays only while that is stale, else every time.
    ``a_read(i, kk)``, where given, is ``op(A)[i, kk]`` (as float32) read from elsewhere
    (:func:`.forwarding.gemm_operand_reader`): ``A`` is then never read; ``a_rows`` where
    those elements lie as they are (:func:`.forwarding.gemm_operand_rows`). On a target
    with AMX (:func:`.gemm_amx.enabled`) the tiles of :mod:`.gemm_amx` compute it instead
    (all of ``C``: rows past ``live`` too)."""
    kept = kept or {}
    if gemm_amx.enabled(low.target.caps):
        gemm_amx.lower_gemm_amx(low.kb, low.name, low.target.caps, A, B, C,
                                transpose_a=transpose_a, transpose_b=transpose_b, kept=kept,
                                a_read=a_read,
                                a_rows=None if a_rows is None else gemm_amx.Rows(*a_rows))
        return
    m, n = (int(d) for d in C.shape)
    k = int(A.shape[0] if transpose_a else A.shape[1])
    pairs = (k + 1) // 2
    vectors = -(-n // LANES)
    kb = low.kb
    ap = relaid_array(kb, low.name, kept.get("a"), "a_pairs", (m, pairs), "int32")
    bp = relaid_array(kb, low.name, kept.get("b"), "b_pairs", (pairs, vectors * LANES), "int32")

    def a_at(i: Expr, kk: Expr) -> Expr:
        if a_read is not None:
            return a_read(i, kk)
        return A[kk, i] if transpose_a else A[i, kk]

    def b_at(kk: Expr, j: Expr) -> Expr:
        return B[j, kk] if transpose_b else B[kk, j]

    with relaying(kb, kept.get("a")):
        _pack(low, ap, (m, pairs), k, a_at, pair_axis=1)
    with relaying(kb, kept.get("b")):
        _pack(low, bp, (pairs, n), k, b_at, pair_axis=0, vectorize=not transpose_b)
        if n < vectors * LANES:
            with kb.loop(low.name("p"), pairs) as p, \
                    kb.loop(low.name("j"), vectors * LANES - n, start=n) as j:
                kb.store(bp, [p, j], tirx.const(0, "int32"))

    cols = VECTORS * LANES
    row_tiles, rows_left = divmod(m, ROWS)
    col_tiles, cols_left = divmod(n, cols)

    # Tiles past the live bounds are skipped by a test per register tile: loops with a
    # trip count computed on the device made LLVM keep the accumulator tile in memory,
    # rebuilt lane by lane at every step (13x slower).
    def tiles_of_rows(i0: Expr, rows: int) -> None:
        if col_tiles:
            with kb.loop(low.name("nt"), col_tiles) as jt, when(low, live.reaches(1, jt * cols)):
                _register_tile(low, C, ap, bp, (i0, jt * cols), (rows, VECTORS, cols), pairs)
        if cols_left:
            with when(low, live.reaches(1, col_tiles * cols)):
                _register_tile(low, C, ap, bp, (i0, col_tiles * cols),
                               (rows, -(-cols_left // LANES), cols_left), pairs)

    if row_tiles:
        with kb.loop(low.name("mt"), row_tiles) as it, when(low, live.reaches(0, it * ROWS)):
            tiles_of_rows(it * ROWS, ROWS)
    if rows_left:
        with when(low, live.reaches(0, row_tiles * ROWS)):
            tiles_of_rows(tirx.const(row_tiles * ROWS, "int32"), rows_left)


def _pack(low: Lowering, dst: tirx.Buffer, shape: tuple[int, int], k: int, at,
          pair_axis: int, vectorize: bool = False) -> None:
    """``dst[i, j]`` = the pair of ``at`` at K indices ``2q`` and ``2q + 1`` (``q`` the
    index along ``pair_axis``), zero past K; ``at(row, kk)`` or ``at(kk, col)``. With
    ``vectorize`` (``j`` contiguous in the source), ``j`` goes in whole vectors and a
    scalar tail: LLVM vectorised a ``j`` loop of 40 with gathers, a third of the gemm."""
    kb = low.kb

    def store(i: Expr, j: Expr) -> None:
        q = j if pair_axis == 1 else i
        other = i if pair_axis == 1 else j

        def element(kk: Expr) -> Expr:
            return at(other, kk) if pair_axis == 1 else at(kk, other)

        lo = _bits(element(2 * q))
        if k % 2 == 0:
            hi = _bits(element(2 * q + 1))
        else:
            # The partner of the last K index is zero. ``if_then_else`` reads the operand
            # only where the condition holds: a ``Select`` evaluates both sides, and TVM's
            # simplifier drops an index clamp under the Select's own condition, so a clamped
            # read there still read one element past the operand.
            hi = tirx.if_then_else(2 * q + 1 < k, _bits(element(2 * q + 1)),
                                   tirx.const(0, "uint32"))
        pair = tirx.bitwise_or(hi, tirx.shift_right(lo, tirx.const(16, "uint32")))
        kb.store(dst, [i, j], tirx.reinterpret("int32", pair))

    full = shape[1] - shape[1] % LANES if vectorize else 0
    with kb.loop(low.name("i"), shape[0]) as i:
        if full:
            with kb.loop(low.name("jo"), full // LANES) as jo, \
                    kb.loop(low.name("v"), LANES, kind="vectorized") as v:
                store(i, jo * LANES + v)
        if full < shape[1]:
            with kb.loop(low.name("j"), shape[1] - full, start=full) as j:
                store(i, j)


def _bits(x: Expr) -> Expr:
    """The bits of bfloat16 ``x`` in the upper half of a uint32 (its float32 widening,
    which is exact: the lower half is zero)."""
    return tirx.reinterpret("uint32", tirx.Cast("float32", x))


def _register_tile(low: Lowering, C: tirx.Buffer, ap: tirx.Buffer, bp: tirx.Buffer,
                   origin: tuple[Expr, Expr], size: tuple[int, int, int],
                   pairs: int) -> None:
    """``C[i0:i0+rows, j0:j0+valid] += A-pairs @ B-pairs`` in ``rows x vectors``
    accumulator registers; lanes past ``valid`` are computed and dropped."""
    kb = low.kb
    (i0, j0), (rows, vectors, valid) = origin, size
    vec = f"float32x{LANES}"
    tile = kb.alloc_local(low.name("ctile"), (rows, vectors * LANES), "float32")

    def lanes_of(w: int) -> int:
        return min(LANES, valid - w * LANES)

    for r in range(rows):
        for w in range(vectors):
            if lanes_of(w) == LANES:
                kb.emit(tile.vstore([r, w * LANES], C.vload([i0 + r, j0 + w * LANES], vec)))
                continue
            for c in range(LANES):
                value = C[i0 + r, j0 + w * LANES + c] if c < lanes_of(w) else 0.0
                kb.store(tile, [r, w * LANES + c], value)
    with kb.loop(low.name("p"), pairs) as p:
        b_vecs = [kb.let(low.name("b"), bp.vload([p, j0 + w * LANES], f"int32x{LANES}"))
                  for w in range(vectors)]
        for r in range(rows):
            a_pair = kb.let(low.name("a"), tirx.Broadcast(ap[i0 + r, p], LANES))
            for w in range(vectors):
                acc = tile.vload([r, w * LANES], vec)
                kb.emit(tile.vstore([r, w * LANES], dot_pairs(acc, a_pair, b_vecs[w])))
    for r in range(rows):
        for w in range(vectors):
            if lanes_of(w) == LANES:
                kb.emit(C.vstore([i0 + r, j0 + w * LANES], tile.vload([r, w * LANES], vec)))
                continue
            for c in range(lanes_of(w)):
                kb.store(C, [i0 + r, j0 + w * LANES + c], tile[r, w * LANES + c])
