"""``C += op(A) @ op(B)`` on on-chip tiles as TIR loop nests, for the CPU.

The bulk of ``C`` is computed in register tiles of a few rows by two vectors (of the
target's width; :func:`tile_shape` chooses from the vector registers there are): the tile of
``C`` is loaded into a small local array once, then for every ``k`` one row segment of ``B``
(converted to the accumulator type) is multiplied by one element of ``A`` per row and added
in, and the tile is stored back after the last ``k``. The rows of a tile are unrolled here,
in Python, so every access to the local arrays has a constant offset and LLVM keeps them in
vector registers: each ``k`` step is one fused multiply-add per row and vector on
registers, with no load or store of ``C``. Columns left over go in tiles of one vector, then
of 8 lanes; the rest, and rows left over, use a plain i-k-j nest with the j loop
vectorised. bfloat16 operands on a target with the bfloat16 dot go to :mod:`.gemm_bf16`;
both skip the tiles past the bounds :mod:`..passes.gemm_edges` notes (:mod:`.gemm_live`).

``A`` is read as ``A[i, k]`` (or ``A[k, i]`` when transposed); a transposed ``B`` is first
copied once into a local tile in ``[k, j]`` layout, so the j loop has unit stride. An
on-chip ``B`` that only copies fill and only such gemms read is held strip-major
(:func:`strip_panels`): the columns of one register tile, all of K, lie contiguously.
"""

from __future__ import annotations

from collections.abc import Callable

from tvm import tirx
from tvm.ir import Expr

from .. import ir
from ..target import CpuCaps
from . import elementwise as ew
from . import forwarding
from .context import FALLBACK_LANES, Lowering, extent
from .copies import strip_index
from .gemm_bf16 import lower_gemm_bf16
from .gemm_live import Live, when

ROWS = (8, 4)
VECTORS = 2
"""With 32 vector registers (AVX-512) a register tile is ``ROWS[0]`` rows by ``VECTORS``
vectors, and rows left over take tiles of ``ROWS[1]`` rows: 16 accumulators, two vectors
of ``B`` and the broadcasts of ``A``, each feeding two multiply-adds. Each ``k`` step is
10 loads for 16 multiply-adds; 8 x 1 tiles took 9 for 8, which bounds a core that
retires two 512-bit multiply-adds but only two 512-bit loads per cycle (Zen 5): 1024^3
float32 with 64 x 64 x 64 tiles, one thread, thread CPU time per call, medians of 21
calls in alternating processes: 8 x 1 13.6-15.4 ms, 8 x 2 12.2-13.6 (6 x 4 and 4 x 4
about the same as 8 x 2). On Zen 4 (512-bit multiply-adds on two 256-bit
pipes, so one per cycle) 8 x 1 and 8 x 2 ran alike: 12.6-12.9 ms on 2 threads (XLA
10.9-11.0)."""

ROWS_16_REGISTERS = (6, 4)
VECTORS_16_REGISTERS = 2
"""With 16 vector registers (AVX2) there is no embedded broadcast: each element of ``A``
takes a ``vbroadcastss`` of its own, so a tile spans two vectors of ``B`` and every
broadcast feeds two multiply-adds: 6 x 2 accumulators, 2 vectors of ``B`` and one
broadcast are 15 of the 16 ymm registers (rows left over: 4 x 2). Each ``k`` step is 8
loads for 12 multiply-adds, against 9 for 8 in 8 x 1 tiles; the k loop is those 20
instructions and the loop's three, with no spill (``tests/jaxtile/test_cpu_isa.py`` checks
it instruction by instruction). On one Zen 4 core, 1024^3 float32 in 64 x 64 x 64 tiles,
thread CPU time per call, min of 30 calls in alternating processes (machine load 8-9, so
only the minima compare): 21.3-24.0 ms, against 20.4-20.6 for the AVX-512 8 x 2 tile of
the same core, whose FMA rate is the same, and 19.7 ms for two FMAs per cycle at 3.4 GHz.
Alternatives measured the same way lost: 4 x 3 (24 columns, each broadcast feeding three
FMAs: 64 columns leave 16 for 4 x 1 tiles, and it reads 1.5x the bytes of B per FMA)
25.6-27.7 ms; a k-major copy of each strip of B per call, so that a strip stays in L1 in
blocks of 128 or 256 ``k`` (its rows are 256 bytes apart in the panel and map to a
quarter of L1's sets), 22.2-26.5 ms; blocks of 256 ``k`` without the copy, 32 ms; rows
of tiles outermost, the same as columns outermost. What was kept: the panel copy itself
writes B strip-major (:func:`strip_panels`), which costs no extra pass: on two threads,
process CPU time per call in one process against two row-major kernels of the same IR
(the A/A control, 0-2% apart), 30-60 rounds in shuffled order, 3-6% less (AVX2), 2.3%
for bfloat16 widened into float32 panels, 3.3-3.5% on one thread, none on AVX-512
(``benchmarks/README.md``, "Issue 20, point 1 (2026-12-03, avx2panel)")."""


def tile_shape(caps: CpuCaps) -> tuple[tuple[int, int], int]:
    """The rows (main tiles, then tiles of the rows left over) and the vectors of a register
    tile on a CPU with ``caps``."""
    if caps.vector_registers >= 32:
        return ROWS, VECTORS
    return ROWS_16_REGISTERS, VECTORS_16_REGISTERS


def strip_panels(kernel: ir.Kernel, caps: CpuCaps) -> dict[str, int]:
    """The on-chip buffers to hold strip-major, with the width of their strips: buffer name
    -> ``w``, the columns of a main register tile (:func:`tile_shape`) on ``caps``.

    A ``K x N`` buffer held strip-major keeps element ``(k, j)`` at offset
    ``(j // w) * K * w + k * w + j % w`` of its storage (:func:`.copies.strip_index`): a
    register tile's strip of B is then one contiguous run of ``K * w`` elements, read at
    unit stride k after k, rather than ``w`` elements every ``N`` (rows ``N * 4`` bytes
    apart, which fall in a fraction of L1's sets).

    Assumes: the lowering of copies and gemms consults the result for every access to
    these buffers (``Lowering.panel_strips``). A scratch buffer qualifies when it is 2-D and
    static, ``N`` a multiple of ``w`` and more than ``w``, and every op that names it is
    either a copy into a region of it from another buffer at scalar starts, or a
    float32-FMA gemm (:func:`_lower_fma`) reading all of it as its untransposed ``b`` and
    not as its ``a`` or ``c``. Guarantees: nothing else reads or writes such a buffer, so
    the layout is invisible outside those copies and gemms.
    """
    lanes = caps.vector_bits // 32
    width = lanes * tile_shape(caps)[1]
    bufs = {b.name: b for b in kernel.buffers}
    fits: dict[str, bool] = {}
    for stmt in ir.walk(kernel.body):
        if not isinstance(stmt, ir.Op):
            continue
        for region in ir.regions(stmt):
            if bufs[region.buffer].role != "scratch":
                continue
            fits[region.buffer] = fits.get(region.buffer, True) and _strip_use(
                stmt, region, bufs, caps)
    out = {}
    for name, ok in fits.items():
        shape = bufs[name].shape
        if ok and len(shape) == 2 and all(isinstance(d, int) for d in shape) \
                and shape[1] % width == 0 and shape[1] > width:
            out[name] = width
    return out


def _strip_use(op: ir.Op, region: ir.Region, bufs: dict, caps: CpuCaps) -> bool:
    """Whether ``op``'s access to ``region`` may see a strip-major buffer (see
    :func:`strip_panels`)."""
    a = op.attrs
    if op.kind == "copy":
        return (region is a["dst"] and a["src"].buffer != region.buffer
                and not any(isinstance(i.start, ir.Value) and i.start.shape != ()
                            for r in (a["src"], a["dst"]) for i in r.index))
    if op.kind != "gemm" or region is not a["b"] or a["transpose_b"] \
            or region.buffer in (a["a"].buffer, a["c"].buffer) \
            or not region.is_whole(bufs[region.buffer].shape):
        return False
    dtypes = [bufs[a[role].buffer].dtype.name for role in ("a", "b", "c")]
    # The bfloat16-dot gemm (gemm_bf16.py) has a layout of its own for B.
    return not (getattr(caps, "bf16_dot", False) and dtypes[:2] == ["bfloat16"] * 2
                and dtypes[2] == "float32")


def lower_gemm(low: Lowering, op: ir.Op, *, lanes: int) -> None:
    """Emit ``c += op(a) @ op(b)`` for the regions and transposes of a ``gemm`` op, with
    vectors of ``lanes`` float32 elements. Operands that are part of a buffer (or read the
    buffer ``c`` writes) are first copied into local tiles, and a partial ``c`` is written
    back after."""
    a = dict(op.attrs)

    def whole(region: ir.Region) -> bool:
        shape = [extent(d) for d in low.bufs[region.buffer].shape]
        return (len(shape) == 2 and all(isinstance(d, int) for d in shape)
                and region.is_whole(shape))

    c_region = a["c"]
    a["c"] = c_region.buffer if whole(c_region) else low.snapshot(c_region)
    for role in ("a", "b"):
        r = a[role]
        a[role] = r.buffer if whole(r) and r.buffer != c_region.buffer else low.snapshot(r)
    # Rows and columns that reach no output are left out (noted at ragged edges only on a
    # whole accumulator, so the bounds are in c's coordinates).
    live = Live.of(low, op)
    if _uses_bf16_dot(low, *(low.bufs[a[role]] for role in ("a", "b", "c"))):
        # An operand that a copy shared by the blocks fills is re-laid only after that copy.
        kept = {role: low.relayout(op, role) for role in ("a", "b")
                if a[role] == op.attrs[role].buffer}
        A = low.bufs[a["a"]]
        source = low.gemm_sources.get(a["a"])   # A forwarded to global memory
        a_read = None if source is None else forwarding.gemm_operand_reader(
            low, source, int(A.shape[0] if a["transpose_a"] else A.shape[1]),
            a["transpose_a"])
        lower_gemm_bf16(low, A, low.bufs[a["b"]], low.bufs[a["c"]],
                        transpose_a=a["transpose_a"], transpose_b=a["transpose_b"], live=live,
                        kept={role: r for role, r in kept.items() if r is not None},
                        a_read=a_read, a_rows=None if source is None
                        else forwarding.gemm_operand_rows(low, source))
    else:
        _lower_fma(low, a, lanes, live)
    if a["c"] != c_region.buffer:
        low.write_back(a["c"], c_region)


def _uses_bf16_dot(low: Lowering, A: tirx.Buffer, B: tirx.Buffer, C: tirx.Buffer) -> bool:
    """bfloat16 operands of a float32 accumulator, on a target with the bfloat16 dot."""
    caps = low.target.caps
    return (getattr(caps, "bf16_dot", False) and str(A.dtype) == str(B.dtype) == "bfloat16"
            and str(C.dtype) == "float32")


def _lower_fma(low: Lowering, a: dict, lanes: int, live: Live) -> None:
    """The float32 FMA path (operands converted to the accumulator type)."""
    if a["transpose_b"]:
        b = a["b"]
        a["b"] = low.snapshot(ir.whole(b, low.bufs[b].shape), transpose=True)
        a["transpose_b"] = False
    A, B, C = low.bufs[a["a"]], low.bufs[a["b"]], low.bufs[a["c"]]
    m, n = (int(d) for d in C.shape)
    k = int(A.shape[0] if a["transpose_a"] else A.shape[1])
    acc = str(C.dtype)

    source = low.gemm_sources.get(a["a"])   # A forwarded to global memory
    k_parts = forwarding.gemm_k_parts(low, source, k, live.k)

    def a_at(i: Expr, kk: Expr, read: bool = True) -> Expr:
        idx = (kk, i) if a["transpose_a"] else (i, kk)
        if not read:    # a forwarded A's K tail: the pad its panel would hold
            return ew.const(source.pad, acc)
        value = A[idx] if source is None else forwarding.gemm_operand(low, source, idx)
        return ew.convert(value, low.dtype(A), acc, low.bind)

    strips = low.panel_strips.get(a["b"])
    shape = (int(B.shape[0]), int(B.shape[1]))

    def b_at(kk: Expr, j: Expr) -> Expr:
        idx = [kk, j] if strips is None else strip_index(shape, strips, kk, j)
        return ew.convert(B[tuple(idx)], low.dtype(B), acc, low.bind)

    # Rows in bands of row_tiles[0] then row_tiles[1] rows, each band's columns in register
    # tiles of `vectors` vectors, then of one, then of one 8-lane vector (a 64 x 56 tile on
    # AVX-512: 32 + 16 + 8), the rest of the columns and rows in the i-k-j nest.
    row_tiles, vectors = tile_shape(low.target.caps)
    bands, m_main = [], 0
    for rows in row_tiles:
        stop = m_main + (m - m_main) // rows * rows
        if stop > m_main:
            bands.append((m_main, stop, rows))
        m_main = stop
    n_main = 0
    for width, count in dict.fromkeys(((lanes, vectors), (lanes, 1), (FALLBACK_LANES, 1))):
        end = n_main + (n - n_main) // (width * count) * (width * count)
        if end > n_main:
            for band in bands:
                _register_tiles(low, C, a_at, b_at, (band, (n_main, end), k_parts),
                                (width, count), live)
        n_main = end
    if m_main < m:
        with when(low, live.reaches(0, m_main)):
            _plain(low, C, a_at, b_at, (m_main, live.end(0, m_main, m)), (0, n), k_parts,
                   lanes)
    if m_main and n_main < n:
        with when(low, live.reaches(1, n_main)):
            _plain(low, C, a_at, b_at, (0, live.end(0, 0, m_main)), (n_main, n), k_parts,
                   lanes)


def _register_tiles(low: Lowering, C: tirx.Buffer, a_at: Callable, b_at: Callable,
                    mnk: tuple[tuple[int, int, int], tuple[int, int], list],
                    shape: tuple[int, int], live: Live) -> None:
    """Rows ``first..last`` and columns ``start..stop`` of ``C`` in tiles of ``rows`` rows
    by ``vectors`` vectors of ``lanes`` (``shape``)."""
    kb, acc = low.kb, str(C.dtype)
    (first, last, rows), (start, stop), k_parts = mnk
    lanes, vectors = shape
    width = lanes * vectors
    tile = kb.alloc_local(low.name("ctile"), (rows, width), acc)
    b_row = kb.alloc_local(low.name("brow"), (width,), acc)

    def each_vector(body: Callable[[int, Expr], None]) -> None:
        """``body(r, column)`` for every row and vector of the tile, one vector loop each."""
        for r in range(rows):
            for q in range(vectors):
                with kb.loop(low.name("v"), lanes, kind="vectorized") as v:
                    body(r, q * lanes + v if q else v)

    # Column strips outermost: one strip of B (K x width) serves every row tile while it is
    # in L1. Rows outermost streamed all of B from L2 for every row tile: 1024^3 float32
    # with 64 x 64 x 64 tiles, one Zen 4 core, 27.0 ms against 25.0.
    with kb.loop(low.name("nt"), live.tiles(1, (stop - start) // width, width, start)) as jt, \
            kb.loop(low.name("mt"), live.tiles(0, (last - first) // rows, rows, first)) as it:
        i0, j0 = first + it * rows, start + jt * width
        each_vector(lambda r, c: kb.store(tile, [r, c], C[i0 + r, j0 + c]))
        for k0, k1, read in k_parts:
            with kb.loop(low.name("k"), k1 - k0, start=k0) as kk:
                for q in range(vectors):
                    with kb.loop(low.name("v"), lanes, kind="vectorized") as v:
                        c = q * lanes + v if q else v
                        kb.store(b_row, [c], b_at(kk, j0 + c))
                # One load of each A element, broadcast for every vector of its row (LLVM
                # merges the loads; on AVX-512 it folds a broadcast used once into the FMA).
                a_vals = [a_at(i0 + r, kk, read) for r in range(rows)]
                each_vector(lambda r, c, a_vals=a_vals: kb.store(
                    tile, [r, c], tirx.Add(tile[r, c], tirx.Mul(a_vals[r], b_row[c]))))
        each_vector(lambda r, c: kb.store(C, [i0 + r, j0 + c], tile[r, c]))


def _plain(low: Lowering, C: tirx.Buffer, a_at: Callable, b_at: Callable,
           rows: tuple[int, int | Expr], cols: tuple[int, int], k_parts: list,
           lanes: int) -> None:
    kb = low.kb
    width = cols[1] - cols[0]
    with kb.loop(low.name("m"), rows[1] - rows[0], start=rows[0]) as i:
        for k0, k1, read in k_parts:
            with kb.loop(low.name("k"), k1 - k0, start=k0) as kk:
                a_val = kb.let(low.name("a"), a_at(i, kk, read))
                step = lanes if width % lanes == 0 else 1
                with kb.loop(low.name("j"), width // step) as jo, \
                        kb.loop(low.name("v"), step,
                                kind="vectorized" if step > 1 else "serial") as v:
                    j = cols[0] + jo * step + v
                    kb.store(C, [i, j], tirx.Add(C[i, j], tirx.Mul(a_val, b_at(kk, j))))
