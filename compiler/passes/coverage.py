"""Check that the grid covers every output: the classic ``N // bn`` instead of ``cdiv`` bug.

For each output, the writes at the kernel's top level (not inside loops or conditionals)
are examined. Where a write's start in a dimension is affine in one block index,
``start = s * block + o``, the blocks together cover ``[o, s * (extent - 1) + o + size)``
without gaps when ``s <= size``. If every write of an output is of that form and none of
them reaches the end of some dimension (or leaves a gap), part of the output would never be
written, and the kernel is rejected with the write's source line. Outputs written in ways this
analysis cannot follow are left alone.
"""

from __future__ import annotations

from .. import ir
from ..errors import kernel_error

_Affine = tuple[int, int, int]  # (block axis or -1, scale, offset)


def _affine_defs(kernel: ir.Kernel) -> dict[int, _Affine]:
    known: dict[int, _Affine] = {v.id: (a, 1, 0) for a, v in enumerate(kernel.block_indices)}
    for stmt in kernel.body:
        if not isinstance(stmt, ir.Op) or stmt.result is None or stmt.result.shape != ():
            continue
        res, ops = stmt.result, [known.get(v.id) for v in stmt.operands]
        if stmt.kind == "const" and isinstance(stmt.attrs["value"], int):
            known[res.id] = (-1, 0, stmt.attrs["value"])
        elif stmt.kind == "convert" and ops[0] is not None:
            known[res.id] = ops[0]
        elif stmt.kind == "elementwise" and None not in ops and len(ops) == 2:
            (a1, s1, o1), (a2, s2, o2) = ops
            fn = stmt.attrs["fn"]
            if fn == "add" and -1 in (a1, a2):
                known[res.id] = (max(a1, a2), s1 + s2, o1 + o2)
            elif fn == "mul" and a2 == -1:
                known[res.id] = (a1, s1 * o2, o1 * o2)
            elif fn == "mul" and a1 == -1:
                known[res.id] = (a2, s2 * o1, o2 * o1)
    return known


def _covered_end(start: int | ir.Value, size: int, known: dict[int, _Affine],
                 grid: tuple[int, ...]) -> int | None:
    """How far from 0 the writes reach without a gap, or None if not analysable."""
    if isinstance(start, int):
        return start + size if start <= 0 else 0
    aff = known.get(start.id)
    if aff is None:
        return None
    axis, scale, offset = aff
    if axis == -1:
        return offset + size if offset <= 0 else 0
    if offset > 0 or scale > size or scale < 0:
        return 0
    return scale * (grid[axis] - 1) + offset + size


def check_output_coverage(kernel: ir.Kernel) -> ir.Kernel:
    """Reject kernels whose grid provably leaves part of an output unwritten; see the
    module docstring. Returns the kernel unchanged."""
    known = _affine_defs(kernel)
    outputs = {b.name: b for b in kernel.buffers if b.role == "output"}
    top_writes: dict[str, list[tuple[ir.Op, tuple[ir.Index, ...]]]] = {}
    nested = set()
    for stmt in kernel.body:
        for sub in ir.walk([stmt]):
            if isinstance(sub, ir.Op) and sub.kind in ("store", "copy"):
                name = sub.attrs["buffer" if sub.kind == "store" else "dst"]
                index = sub.attrs["index" if sub.kind == "store" else "dst_index"]
                if sub is stmt:
                    top_writes.setdefault(name, []).append((sub, index))
                else:
                    nested.add(name)
    for name, writes in top_writes.items():
        buf = outputs.get(name)
        if buf is None or name in nested:
            continue
        for d, dim in enumerate(buf.shape):
            reach = []
            for _, index in writes:
                size = 1 if index[d].size is None else index[d].size
                reach.append(_covered_end(index[d].start, size, known, kernel.grid))
            if None in reach or max(reach) >= dim:
                continue
            op = writes[0][0]
            raise kernel_error(
                kernel.name, f"the grid {list(kernel.grid)} and tile sizes leave part of output "
                f"'{name}' unwritten: dimension {d} has {dim} elements but the writes reach "
                f"only {max(reach)} (size the grid with jt.cdiv)", op.line)
    return kernel
