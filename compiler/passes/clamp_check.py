"""Warn about direct ref indexing that JAX's clamping turns into wrong rows at a ragged edge.

``x[jt.ds(i * bm, bm), :]`` (a ``load`` or ``store`` op) follows JAX's ``get``/``swap``
rule: a start past ``length - size`` is clamped back into range, and a negative one counts
from the end. At a ragged edge (``length`` not a multiple of ``bm``) the last block then
reads or writes rows its neighbour owns, silently, where ``jt.copy`` would have padded the
read and dropped the write.

The range of each start comes from the scalar analysis (:mod:`..analysis.scalars`): block
indices range over the grid, loop variables over their trip, constants are themselves, and
integer arithmetic combines them, with the wrap-around of their dtype. An access whose start
can leave ``[0, length - size]`` gets a :class:`ClampedIndexWarning` at its source line.
Starts the analysis cannot bound (values loaded from memory) are left alone. Target-neutral;
the kernel is returned unchanged.
"""

from __future__ import annotations

import warnings

from .. import ir
from ..analysis import scalars
from ..errors import ClampedIndexWarning


def warn_clamped_accesses(kernel: ir.Kernel) -> ir.Kernel:
    """Warn (at the user's line) about every ``load``/``store`` whose start can be clamped or
    wrapped by JAX's indexing rule; see the module docstring. Returns the kernel unchanged."""
    known = scalars.scalar_ranges(kernel)
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
                known.get(index.start)
            if start is None or (start[0] >= 0 and start[1] + size <= length):
                continue
            _warn(kernel, op, buf, d, start, size, length)
            break
    return kernel


def _warn(kernel: ir.Kernel, op: ir.Op, buf: ir.Buffer, d: int, start: scalars.Range,
          size: int, length: int) -> None:
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
