"""Which dimensions of a kernel's arguments and outputs its grid blocks split independently.

A kernel may run per shard, each device computing its own slice of the outputs from its own
slice of the inputs, along a dimension where the blocks of one grid axis work on disjoint,
block-aligned slices and nothing else reads across them. This analysis finds such
dimensions from the Tile IR alone (target-neutral; it changes nothing):

- Every access to a kernel parameter (every region an op reads or writes, by its
  definition in ``op_defs``) is examined, in loops and conditionals too.
- A dimension's access is *block-aligned on grid axis a* when its start is
  ``size * block_index[a]`` (constants folded; no other block index, loop variable or
  loaded value) and its extent is ``size`` (one element for an integer index).
- A dimension is split by axis ``a`` when all its accesses are block-aligned on ``a`` with
  one block size ``s``, and the axis has exactly ``cdiv(length, s)`` blocks.
- An axis is *parallel* when every dimension it splits has the same length and block size,
  and every output has a dimension split by it: otherwise several blocks would write the
  same elements, and only one device may produce them.
- And when its block index is used for nothing but those starts. A shard's kernel numbers
  its blocks from 0, so any other use (a row number in a mask, a condition, a loop bound, a
  start in another dimension, a value written to an output) would see the wrong number. Uses
  are followed through values, on-chip buffers, conditions and loops.

Assumption (the execution model): blocks share nothing but global memory, so a block that
reads and writes only its own slices along ``a`` computes them from those slices alone.
Guarantee: for each parallel axis, sharding every dimension it splits into shards that are
multiples of the block size gives each shard exactly the blocks of the whole-array kernel
that write it. Where the analysis declines, :attr:`ShardAnalysis.declined` says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from .. import ir, op_defs
from ..analysis.affine import Affine as _Affine
from ..analysis.affine import affine_values


@dataclasses.dataclass(frozen=True)
class ShardAnalysis:
    """The result of :func:`infer_parallel_dims`.

    ``dims[p][d]`` is the grid axis that splits dimension ``d`` of parameter ``p`` (in
    ``kernel.params`` order: inputs, then outputs), or None. ``parallel`` maps each parallel
    axis to its block size (the multiple a shard's length must be). ``declined`` lists, for
    the dimensions and axes left out, the reason and the source line of an op at fault.
    """

    dims: tuple[tuple[int | None, ...], ...]
    parallel: dict[int, int]
    declined: tuple[str, ...]


def _accesses(kernel: ir.Kernel, names: set[str]) -> Iterator[tuple[ir.Op, ir.Region]]:
    """``(op, region)`` for every region of a parameter that an op reads or writes."""
    for stmt in ir.walk(kernel.body):
        if isinstance(stmt, ir.Op):
            yield from ((stmt, r) for r in ir.regions(stmt) if r.buffer in names)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def infer_parallel_dims(kernel: ir.Kernel) -> ShardAnalysis:
    """Find the dimensions the kernel's grid splits independently; see the module doc."""
    params = tuple(b for b in kernel.params if b.role != "init")
    if len(params) != len(kernel.params):
        return ShardAnalysis(tuple((None,) * len(b.shape) for b in params), {},
                             ("its outputs are updated atomically, across blocks",))
    names = {b.name for b in params}
    known = affine_values(kernel)
    # Per (parameter, dimension): the (axis, block size) every access agrees on, or a reason.
    split: dict[tuple[str, int], tuple[int, int] | None] = {}
    why: dict[tuple[str, int], str] = {}

    def decline(key: tuple[str, int], reason: str, line: str | None) -> None:
        if split.get(key, ()) is not None:
            split[key] = None
            why[key] = reason + (f" (at {line})" if line else "")

    for op, region in _accesses(kernel, names):
        name = region.buffer
        for d, idx in enumerate(region.index):
            key = (name, d)
            size = 1 if idx.size is None else idx.size
            start = (-1, 0, idx.start) if isinstance(idx.start, int) else known.get(idx.start.id)
            if start is None or start[0] == -1 or start[2] != 0 or start[1] != size:
                decline(key, f"dimension {d} of '{name}' is accessed at a start that is not "
                        "(block size) * (one block index)", op.line)
                continue
            found = (start[0], size)
            if split.setdefault(key, found) not in (found, None):
                decline(key, f"dimension {d} of '{name}' is split two ways", op.line)

    dims: list[tuple[int | None, ...]] = []
    declined = [why[k] for k in sorted(why)]
    axes: dict[int, set[tuple[int, int]]] = {}
    for buf in params:
        row = []
        for d, length in enumerate(buf.shape):
            found = split.get((buf.name, d))
            if found is not None and kernel.grid[found[0]] != _cdiv(length, found[1]):
                declined.append(f"grid axis {found[0]} has {kernel.grid[found[0]]} blocks of "
                                f"{found[1]}, not cdiv({length}, {found[1]}), along dimension "
                                f"{d} of '{buf.name}'")
                found = None
            row.append(None if found is None else found[0])
            if found is not None:
                axes.setdefault(found[0], set()).add((length, found[1]))
        dims.append(tuple(row))

    parallel: dict[int, int] = {}
    outputs = [row for buf, row in zip(params, dims) if buf.role == "output"]
    for axis, shapes in sorted(axes.items()):
        if len(shapes) > 1:
            declined.append(f"grid axis {axis} splits dimensions of different lengths or "
                            f"block sizes {sorted(shapes)}")
        elif any(row.count(axis) > 1 for row in dims):
            declined.append(f"grid axis {axis} splits two dimensions of one buffer")
        elif not all(axis in row for row in outputs):
            declined.append(f"grid axis {axis} does not split every output: its blocks "
                            "write the same elements")
        else:
            parallel[axis] = next(iter(shapes))[1]
    for axis, reason in _other_uses(kernel, known, params, dims).items():
        if parallel.pop(axis, None) is not None:
            declined.append(f"the index of grid axis {axis} {reason}")
    dims = [tuple(a if a in parallel else None for a in row) for row in dims]
    if not parallel and not declined:
        declined.append("no grid axis splits the outputs")
    return ShardAnalysis(tuple(dims), parallel, tuple(declined))


def _other_uses(kernel: ir.Kernel, known: dict[int, _Affine], params: tuple[ir.Buffer, ...],
                dims: list[tuple[int | None, ...]]) -> dict[int, str]:
    """For each grid axis whose block index reaches anything but the start of a dimension it
    splits, the first such use (with its line).

    A forward taint analysis: values carry the axes they depend on; an on-chip buffer carries
    the axes of everything written to it (and under which conditions); loops are walked
    until those stop growing.
    """
    split = {b.name: row for b, row in zip(params, dims)}
    deps: dict[int, frozenset[int]] = {v.id: frozenset({a})
                                       for a, v in enumerate(kernel.block_indices)}
    held: dict[str, frozenset[int]] = {}
    found: dict[int, str] = {}

    def of(v: object) -> frozenset[int]:
        return deps.get(v.id, frozenset()) if isinstance(v, ir.Value) else frozenset()

    def flag(axes: frozenset[int], what: str, line: str | None) -> None:
        for a in axes:
            found.setdefault(a, what + (f" (at {line})" if line else ""))

    def index_deps(name: str, index: tuple, line: str | None) -> frozenset[int]:
        if name not in split:  # on-chip: the position is part of what the buffer holds
            return frozenset().union(*(of(i.start) for i in index))
        for d, i in enumerate(index):
            stray = of(i.start) - {split[name][d]}
            flag(stray, f"is used in a start of dimension {d} of '{name}', which it does not "
                 "split", line)
        return frozenset()

    def visit(body: tuple[ir.Stmt, ...], control: frozenset[int]) -> None:
        for stmt in body:
            if isinstance(stmt, ir.For):
                start = of(stmt.start) | of(stmt.extent)
                flag(start, "is used in a loop bound", stmt.line)
                deps[stmt.var.id] = start
                visit(stmt.body, control | start)
            elif isinstance(stmt, ir.While):
                visit(stmt.cond, control)
                flag(of(stmt.test), "is used in a while condition", stmt.line)
                visit(stmt.body, control | of(stmt.test))
            elif isinstance(stmt, ir.If):
                flag(of(stmt.cond), "is used in a condition", stmt.line)
                visit(stmt.then, control | of(stmt.cond))
                visit(stmt.otherwise, control | of(stmt.cond))
            else:
                visit_op(stmt, control)

    def visit_op(op: ir.Op, control: frozenset[int]) -> None:
        axes = frozenset().union(*(of(v) for v in op.operands))
        for region in ir.regions(op):
            axes |= index_deps(region.buffer, region.index, op.line)
        written = [r.buffer for r in op_defs.writes(op)]
        read = [r.buffer for r in op_defs.reads(op)]
        axes |= frozenset().union(*(held.get(n, frozenset()) for n in read))
        if op.result is not None:
            deps[op.result.id] = axes
        for name in written:
            if name in split:
                flag(axes | control, f"reaches a value written to '{name}'", op.line)
            else:
                held[name] = held.get(name, frozenset()) | axes | control

    while True:
        before = dict(held)
        visit(kernel.body, frozenset())
        if held == before:
            return found
