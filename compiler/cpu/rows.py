"""Row-wise tile programs run one row at a time, for the CPU.

A row-wise kernel written the plain way (softmax, a norm, a cross-entropy over a tile of
``R`` whole rows) makes several passes over its tile: a reduction, a materialised
intermediate, another reduction, the store. Tile by tile, each pass streams ``R`` rows
through the cache before the next pass comes back to the first: with 8 rows of 1024 float32
the tile and its intermediates (32 KiB each) already overflow the L1 cache. When every value
of row ``r`` depends only on row ``r`` of the others, the statements can run in a loop over
the rows, each pass touching one row (4 KiB) that the next pass finds in L1: any row tile
then runs as fast as a tile of one row, and more blocks per call are not needed.

:func:`rows` decides whether a statement list (the forwarded branch of
:mod:`.forwarding`, where the copies are gone) can run so; the lowering then emits it inside
``for r in range(R)`` and every loop nest over a tile value's own shape fixes the leading
index to ``r`` (``Lowering.value_nest``). A value that nothing outside those statements reads
gets an array of one row (``Lowering.array_index`` indexes it by row 0): the intermediates
of every row then reuse the same few KiB, which stay in L1 and are never written back.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import ir

# Ops whose element at index i reads their operands at indices that keep i[0] (when the
# operand is indexed by the row at all); other kinds are checked one by one below.
_ROW_LOCAL = frozenset({"elementwise", "convert", "select", "const", "iota", "size"})
_ALLOWED = _ROW_LOCAL | {"load", "store", "broadcast", "reshape", "reduce"}


def rows(stmts: Sequence[ir.Stmt]) -> int | None:
    """The row count ``R`` when ``stmts`` can run row by row and gain by it, else ``None``.

    As :func:`separable`, and ``None`` when there is nothing to gain: no value
    materialised, or 1-D tiles without a reduction.
    """
    ops = [s for s in stmts if isinstance(s, ir.Op)]
    materialised = [op for op in ops if op.result is not None and op.result.shape
                    and not op.notes.get("inline")]
    if not materialised:
        return None
    stored = [op.operands[0] for op in ops if op.kind == "store"]
    if not any(op.kind == "reduce" for op in ops) and any(
            len(v.shape) < 2 for v in [op.result for op in materialised] + stored):
        # Without a reduction over each row, a 1-D tile would trade its vector loop for
        # the row loop.
        return None
    return separable(stmts)


def separable(stmts: Sequence[ir.Stmt]) -> int | None:
    """The row count ``R`` when ``stmts`` can run row by row, else ``None``.

    Assumes ``stmts`` is straight-line code of ops (no loops, conditionals or copies: the
    forwarded branch of a segment) whose scalar ops were emitted before. Guarantees, when
    it returns ``R``: ``R`` >= 2, every materialised value and every stored value has ``R``
    rows (leading extent), every reduction keeps the leading axis, and every read of a
    materialised value, or of a buffer written in ``stmts``, happens at the row being
    computed (element-wise ops, broadcasts and reshapes that keep the leading axis in
    place, reductions over the other axes). Buffers written in ``stmts`` are accessed
    through one region only.
    """
    ops = [s for s in stmts if isinstance(s, ir.Op)]
    if len(ops) != len(stmts) or any(op.kind not in _ALLOWED for op in ops):
        return None
    materialised = [op for op in ops if op.result is not None and op.result.shape
                    and not op.notes.get("inline")]
    stored = [op.operands[0] for op in ops if op.kind == "store"]
    lead = {op.result.shape[0] for op in materialised}
    lead |= {v.shape[0] for v in stored if v.shape}
    if len(lead) != 1:
        return None
    (n_rows,) = lead
    if n_rows < 2 or not _regions_fixed(ops):
        return None
    written = {op.attrs["dst"].buffer for op in ops if op.kind == "store"}
    row_dependent: set[int] = set()
    for op in ops:
        res = op.result
        if op.kind == "store":
            if not op.operands[0].shape or op.operands[0].shape[0] != n_rows:
                return None
            continue
        if op.kind == "reduce" and 0 in op.attrs["axes"]:
            return None
        deps = [v for v in op.operands if v.id in row_dependent]
        reads_written = op.kind == "load" and op.attrs["src"].buffer in written
        if deps and not all(_keeps_row(op, v, n_rows) for v in deps):
            return None
        if (deps or reads_written) and (not res.shape or res.shape[0] != n_rows):
            return None
        if deps or reads_written or not op.notes.get("inline"):
            row_dependent.add(res.id)
    return n_rows


def _keeps_row(op: ir.Op, operand: ir.Value, n_rows: int) -> bool:
    """Whether ``op`` reads ``operand`` at the leading index of its own element."""
    res = op.result
    if not operand.shape or not res.shape or operand.shape[0] != n_rows \
            or res.shape[0] != n_rows:
        return False
    if op.kind in _ROW_LOCAL or op.kind == "reduce":
        return True
    if op.kind == "broadcast":
        return op.attrs["dims"][0] == 0
    if op.kind == "reshape":
        return [d for d in operand.shape if d != 1] == [d for d in res.shape if d != 1]
    return False


def _regions_fixed(ops: Sequence[ir.Op]) -> bool:
    """Every buffer that is stored to is loaded and stored through one and the same
    region (so row ``r`` of a load sees what row ``r`` of the store wrote, and no other
    row's)."""
    seen: dict[str, ir.Region] = {}
    written = {op.attrs["dst"].buffer for op in ops if op.kind == "store"}
    for op in ops:
        for region in ir.regions(op):
            if region.buffer in written and seen.setdefault(region.buffer, region) != region:
                return False
    return True
