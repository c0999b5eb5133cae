"""Check that the grid covers every output: the classic ``N // bn`` instead of ``cdiv`` bug.

For each output, the writes at the kernel's top level (not inside loops or conditionals)
are examined. Where a write's start in a dimension is constant or affine in one block index,
``start = s * block + o``, its blocks together cover ``[o, s * (extent - 1) + o + size)``
without gaps when ``s <= size``. If every write of an output is of that form and in some
dimension the union of their intervals misses an index, no element with that index is ever
written, and the kernel is rejected with a write's source line. Outputs written in ways this
analysis cannot follow are left alone.
"""

from __future__ import annotations

from .. import ir, op_defs
from ..analysis.affine import Affine as _Affine
from ..analysis.affine import affine_values
from ..errors import kernel_error


def _interval(start: int | ir.Value, size: int, known: dict[int, _Affine],
              grid: tuple[int, ...]) -> tuple[int, int] | None:
    """The indices ``[lo, hi)`` that one write's blocks cover without gaps, or None if the
    write cannot be followed (or leaves gaps, which another write might fill)."""
    if isinstance(start, int):
        return start, start + size
    aff = known.get(start.id)
    if aff is None:
        return None
    axis, scale, offset = aff
    if axis == -1:
        return offset, offset + size
    if scale < 0 or scale > size:
        return None
    return offset, scale * (grid[axis] - 1) + offset + size


def _first_gap(intervals: list[tuple[int, int]], dim: int) -> int | None:
    """The first index in ``[0, dim)`` that no interval covers, or None."""
    reach = 0
    for lo, hi in sorted(intervals):
        if lo > reach:
            break
        reach = max(reach, hi)
    return reach if reach < dim else None


def check_output_coverage(kernel: ir.Kernel) -> ir.Kernel:
    """Reject kernels whose grid provably leaves part of an output unwritten; see the
    module docstring. Returns the kernel unchanged."""
    known = affine_values(kernel)
    outputs = {b.name: b for b in kernel.buffers if b.role == "output"}
    top_writes: dict[str, list[tuple[ir.Op, tuple[ir.Index, ...]]]] = {}
    nested = set()
    for stmt in kernel.body:
        for sub in ir.walk([stmt]):
            if not isinstance(sub, ir.Op):
                continue
            for region in op_defs.writes(sub):
                if sub is stmt:
                    top_writes.setdefault(region.buffer, []).append((sub, region.index))
                else:
                    nested.add(region.buffer)
    for name, writes in top_writes.items():
        buf = outputs.get(name)
        if buf is None or name in nested:
            continue
        for d, dim in enumerate(buf.shape):
            intervals = []
            for _, index in writes:
                size = 1 if index[d].size is None else index[d].size
                intervals.append(_interval(index[d].start, size, known, kernel.grid))
            if None in intervals:
                continue
            gap = _first_gap(intervals, dim)
            if gap is None:
                continue
            raise kernel_error(
                kernel.name, f"the grid {list(kernel.grid)} and tile sizes leave part of output "
                f"'{name}' unwritten: in dimension {d} ({dim} elements) no write reaches index "
                f"{gap} (size the grid with jt.cdiv)", writes[-1][0].line)
    return kernel
