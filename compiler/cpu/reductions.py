"""``reduce`` of tile values as TIR loop nests for the CPU.

Reductions along the contiguous axis keep partial results in up to four vectors, so the
combining ops are independent, and combine them pairwise at the end. Reductions that keep
the contiguous axis (``sum(x, axis=0)``) update the result array by one vectorised pass per
reduced index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tvm import tirx
from tvm.ir import Expr

from .. import ir
from . import elementwise as ew
from .context import FALLBACK_LANES, Lowering
from .forwarding import EDGE, INSIDE, PAST

UNROLLED_VECTORS = 64
"""A contiguous reduction's loop over whole chunks is unrolled in the TIR when the chunks
hold at most this many vectors. The backend compiles with LLVM's O2 pipeline
(:func:`.tir_emit.build`), which leaves such a loop rolled (a few chunks per iteration)
where O3 unrolled it fully: unrolled here, the RMS and layer norms got O3's machine code
back, instruction for instruction, and their speed (rolled, they ran 5-15% slower on
Zen 4)."""


def _width(low: Lowering) -> int:
    """32-bit lanes of one vector register of the target."""
    return low.target.caps.vector_bits // 32


def _lanes(low: Lowering, extent: int) -> int:
    """Partial results for a contiguous reduction of ``extent`` elements: up to four
    vectors' worth (a power of two). The elements past the last whole group are added
    one by one, each waiting on the previous (about 4 cycles), so the count with the
    least estimated time wins."""
    width = _width(low)
    candidates = [n for n in (4 * width, 2 * width, width, FALLBACK_LANES) if n <= extent]
    if not candidates:
        return 1
    return min(candidates, key=lambda n: extent // n + 4 * (extent % n))


def _source_index(rank: int, keep: Sequence[int], kept_idx: Sequence[Expr],
                  red: Sequence[int], red_idx: Sequence[Expr]) -> list[Expr]:
    """The source element at result index ``kept_idx`` and reduced index ``red_idx``."""
    full: list[Expr] = [None] * rank
    for d, e in (*zip(keep, kept_idx), *zip(red, red_idx)):
        full[d] = e
    return full


def _reduce_leading(low: Lowering, op: ir.Op, keep: list[int], red: list[int]) -> None:
    """A reduction that keeps the contiguous axis (``sum(x, axis=0)`` of a 2-D tile):
    the result array is the accumulator, updated by one vectorised pass over each
    reduced index, so the source is read row by row."""
    src, res, fn = op.operands[0], op.result, op.attrs["fn"]
    dtype, src_dtype = ew.tvm_dtype(res.dtype), ew.tvm_dtype(src.dtype)
    arr = low.value_array(res)
    for out_idx in low.value_nests(res.shape):
        low.kb.store(arr, low.array_index(arr, out_idx), ew.reduce_init(fn, dtype))
    with low.nest([src.shape[d] for d in red], vectorize=False) as red_idx:
        for out_idx in low.value_nests(res.shape):
            full = _source_index(len(src.shape), keep, out_idx, red, red_idx)
            x = ew.convert(low.at(src, full), src_dtype, dtype, low.bind)
            at = low.array_index(arr, out_idx)
            low.kb.store(arr, at, ew.reduce_combine(fn, arr[tuple(at)], x, dtype, low.bind))


def lower_reduce(low: Lowering, op: ir.Op) -> None:
    """Emit a ``reduce`` of a tile value into an array (or a scalar)."""
    src, res = op.operands[0], op.result
    fn, axes = op.attrs["fn"], set(op.attrs["axes"])
    dtype = ew.tvm_dtype(res.dtype)
    src_dtype = ew.tvm_dtype(src.dtype)
    keep = [d for d in range(len(src.shape)) if d not in axes]
    red = sorted(axes)
    if red[-1] != len(src.shape) - 1:
        # A reduction to a scalar reduces the last axis too, so res.shape is not empty.
        _reduce_leading(low, op, keep, red)
        return
    n_last = src.shape[red[-1]]
    # Reducing along the innermost (contiguous) axis: partial results in several vectors
    # of lanes, combined pairwise at the end. Several vectors keep the additions (or
    # max) independent, so they run at the CPU's throughput rather than one dependent
    # op per vector, and the partial sums keep float sums more exact.
    lanes = _lanes(low, n_last)
    acc = low.kb.alloc_local(low.name("acc"), (lanes,), dtype)
    arr = low.value_array(res) if res.shape else None

    def accumulate(lane: Expr, red_idx: Sequence[Expr], last: Expr) -> None:
        full = _source_index(len(src.shape), keep, out_idx, red, [*red_idx, last])
        x = ew.convert(low.at(src, full), src_dtype, dtype, low.bind)
        low.kb.store(acc, [lane], ew.reduce_combine(fn, acc[lane], x, dtype, low.bind))

    with low.value_nest(res.shape, vectorize=False) as out_idx:
        with low.kb.loop(low.name("l"), lanes, kind="vectorized" if lanes > 1 else
                          "serial") as lane:
            low.kb.store(acc, [lane], ew.reduce_init(fn, dtype))
        with low.nest([src.shape[d] for d in red[:-1]], vectorize=False) as red_idx:
            edges = low.edges
            if edges is not None and edges.splits(n_last) and lanes % edges.lanes == 0:
                _edge_chunks(low, n_last, lanes, lambda *a: accumulate(*a[:1], red_idx,
                                                                        *a[1:]))
            else:
                chunks = n_last // lanes
                unrolled = chunks * lanes <= UNROLLED_VECTORS * _width(low)
                with low.kb.loop(low.name("c"), chunks,
                                  kind="unrolled" if unrolled else "serial") as chunk:
                    with low.kb.loop(low.name("l"), lanes,
                                      kind="vectorized" if lanes > 1 else "serial") as lane:
                        accumulate(lane, red_idx, chunk * lanes + lane)
            tail = n_last % lanes
            if tail:
                with low.kb.loop(low.name("t"), tail, start=n_last - tail) as last:
                    accumulate(tirx.const(0, "int32"), red_idx, last)
        width = lanes
        while width > 1:
            width //= 2
            with low.kb.loop(low.name("l"), width,
                              kind="vectorized" if width > 1 else "serial") as lane:
                low.kb.store(acc, [lane], ew.reduce_combine(
                    fn, acc[lane], acc[lane + width], dtype, low.bind))
        if arr is not None:
            low.kb.store(arr, low.array_index(arr, out_idx), acc[0])
    if arr is None:
        low.scalars[res.id] = low.kb.let(low.name("s"), acc[0])


def _edge_chunks(low: Lowering, n_last: int, lanes: int,
                 accumulate: Callable[[Expr, Expr], None]) -> None:
    """The whole chunks of a contiguous reduction over a last axis forwarded with masked
    edges (:class:`.forwarding.Edges`): element ``c`` still goes to partial result
    ``c % lanes``, in the same order, so the result is the same bit for bit. The chunks
    before the straddling vector run as usual; the vectors from the chunk that holds it
    run one by one, each in its part (inside, straddling, past the end)."""
    edges = low.edges
    width = edges.lanes
    group = lanes // width          # vectors per chunk
    chunks = tirx.floordiv(edges.whole, group)
    n_vectors = (n_last - n_last % lanes) // width
    with low.kb.loop(low.name("c"), chunks) as chunk, \
            low.kb.loop(low.name("l"), lanes, kind="vectorized") as lane:
        for column in edges.mark(chunk * lanes + lane, INSIDE):
            accumulate(lane, column)
    whole = tirx.min(edges.whole, n_vectors)
    spans = [(chunks * group, whole, INSIDE), (whole, tirx.min(whole + 1, n_vectors), EDGE),
             (whole + 1, n_vectors, PAST)]
    for begin, end, part in spans:
        with low.kb.loop(low.name("c"), tirx.max(end - begin, 0), start=begin) as vector, \
                low.kb.loop(low.name("l"), width, kind="vectorized") as lane:
            slot = tirx.floormod(vector, group) * width + lane
            for column in edges.mark(vector * width + lane, part, lane):
                accumulate(slot, column)
