"""Warn about direct ref indexing that JAX's clamping turns into wrong rows at a ragged edge.

``x[jt.ds(i * bm, bm), :]`` (a ``load`` or ``store`` op) follows JAX's ``get``/``swap``
rule: a start past ``length - size`` is clamped back into range, and a negative one counts
from the end. At a ragged edge (``length`` not a multiple of ``bm``) the last block then
reads or writes rows its neighbour owns, silently, where ``jt.copy`` would have padded the
read and dropped the write.

The range of each start is bounded by interval arithmetic over integer scalars: block
indices range over the grid, loop variables over their trip, constants are themselves, and
``+``, ``-``, ``*``, ``min``, ``max`` and conversions combine them. An access whose start can
leave ``[0, length - size]`` gets a :class:`ClampedIndexWarning` at its source line. Starts
this analysis cannot bound (values loaded from memory) are left alone. Target-neutral; the
kernel is returned unchanged.
"""

from __future__ import annotations

import warnings

from .. import ir, op_defs
from ..errors import ClampedIndexWarning

_Range = tuple[int, int]


def _combine(fn: str | None, x: _Range, y: _Range) -> _Range | None:
    if fn == "add":
        return x[0] + y[0], x[1] + y[1]
    if fn == "sub":
        return x[0] - y[1], x[1] - y[0]
    if fn == "mul":
        products = [a * b for a in x for b in y]
        return min(products), max(products)
    if fn == "max":
        return max(x[0], y[0]), max(x[1], y[1])
    if fn == "min":
        return min(x[0], y[0]), min(x[1], y[1])
    return None


def _ranges(kernel: ir.Kernel) -> dict[int, _Range]:
    """Bounds of the integer scalars the analysis can follow, by value id."""
    known: dict[int, _Range] = {v.id: (0, n - 1) for v, n in zip(kernel.block_indices,
                                                                 kernel.grid)}

    def visit(body: list[ir.Stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ir.For):
                start = (stmt.start, stmt.start) if isinstance(stmt.start, int) else \
                    known.get(stmt.start.id)
                if start is not None and isinstance(stmt.extent, int) and stmt.extent > 0:
                    known[stmt.var.id] = (start[0], start[1] + stmt.extent - 1)
                visit(stmt.body)
            elif isinstance(stmt, ir.If | ir.While):
                for block in ir.blocks(stmt):
                    visit(block)
            elif stmt.result is not None and stmt.result.shape == ():
                value = _scalar_range(stmt, known)
                if value is not None:
                    known[stmt.result.id] = value

    visit(kernel.body)
    return known


def _scalar_range(op: ir.Op, known: dict[int, _Range]) -> _Range | None:
    ops = [known.get(v.id) for v in op.operands]
    points = [r[0] for r in ops if r is not None and r[0] == r[1]]
    value = op_defs.evaluate(op, points) if len(points) == len(ops) else None
    if value is not None:
        return value, value
    if op.kind == "convert" and ops and ops[0] is not None:
        return ops[0] if op.result.dtype.kind in "iu" else None
    if op.kind == "elementwise" and len(ops) == 2 and None not in ops:
        return _combine(op.attrs.get("fn"), ops[0], ops[1])
    return None


def warn_clamped_accesses(kernel: ir.Kernel) -> ir.Kernel:
    """Warn (at the user's line) about every ``load``/``store`` whose start can be clamped or
    wrapped by JAX's indexing rule; see the module docstring. Returns the kernel unchanged."""
    known = _ranges(kernel)
    # A store is traced as a swap, whose read of the old value is usually dead: skip it.
    used = {v.id for stmt in ir.walk(kernel.body) for v in ir.uses(stmt)}
    for op in ir.walk(kernel.body):
        if not isinstance(op, ir.Op) or op.kind not in ("load", "store"):
            continue
        if op.kind == "load" and op.result.id not in used:
            continue
        region = op.attrs["src" if op.kind == "load" else "dst"]
        buf = kernel.buffer(region.buffer)
        for d, (index, length) in enumerate(zip(region.index, buf.shape)):
            size = 1 if index.size is None else index.size
            start = (index.start, index.start) if isinstance(index.start, int) else \
                known.get(index.start.id)
            if start is None or (start[0] >= 0 and start[1] + size <= length):
                continue
            _warn(kernel, op, buf, d, start, size, length)
            break
    return kernel


def _warn(kernel: ir.Kernel, op: ir.Op, buf: ir.Buffer, d: int, start: _Range, size: int,
          length: int) -> None:
    verb = "reads" if op.kind == "load" else "writes"
    if start[1] + size > length:
        what = (f"the start can reach {start[1]}, and {start[1]} + {size} > {length}: JAX "
                f"clamps it to {length - size}, so that block {verb} elements of another block")
    else:
        what = (f"the start can be {start[0]}: JAX counts a negative start from the end, so "
                f"that block {verb} the wrong elements")
    message = (f"jaxtile kernel '{kernel.name}': '{buf.name}' is indexed directly and, in "
               f"dimension {d}, {what}. Use jt.copy, which pads reads and drops writes past "
               "the edge, or a grid and tile size that divide the shape")
    filename, _, lineno = (op.line or "").rpartition(":")
    if filename and lineno.isdigit():
        warnings.warn_explicit(message, ClampedIndexWarning, filename, int(lineno))
    else:
        warnings.warn(message, ClampedIndexWarning, stacklevel=2)
