"""Tile IR: the fused tile dataflow of one kernel specialisation.

A :class:`Kernel` holds buffers (global inputs/outputs and on-chip scratch with a scope), the
launch grid and a body of statements. Statements are :class:`Op` (tile ops and elementwise
math on SSA :class:`Value` s, scalars being 0-d tiles), :class:`For` (structured loops: serial,
unrolled or software-pipelined) and :class:`If`. Values defined in a scope are visible in
nested scopes. The IR is target independent; layouts, thread mapping and synchronisation are
decided by later passes and lowerings. :class:`While` loops on a condition computed on the
device.

Every op kind has one definition in :mod:`.op_defs` (operands, typed attributes, result
rule, the buffer regions it reads and writes, purity, a verify hook); passes ask it rather
than re-deriving what an op does.

The IR is immutable: statements and kernels are frozen, bodies are tuples, attributes are
read-only mappings. A pass returns new IR. ``Op.attrs`` carry meaning (they are part of the
printed text and so of the content key); ``Op.notes`` carry what passes decide for later
ones (fusion, layouts) and are left out of the key.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .sizes import Size, is_static

SCOPES = ("global", "shared", "fragment", "local")
"""Where a buffer lives. ``local`` is a small tile replicated in every thread of a block:
every thread holds the whole tile and sees the same values (so it is written only with
values that are the same in every thread, e.g. computed from block indices and loop
counters); the reference semantics and the CPU keep one copy per block."""
ROLES = ("input", "output", "scratch", "init")
"""``init``: a global input that holds the initial contents of an output (its ``aliases``):
the caller passes zeros in the same memory as the output (outputs updated atomically start
as zeros)."""
LOOP_KINDS = ("serial", "unrolled", "pipelined")

_ids = itertools.count()
_EMPTY: Mapping[str, Any] = types.MappingProxyType({})


def _frozen_map(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not m:
        return _EMPTY
    return m if isinstance(m, types.MappingProxyType) else types.MappingProxyType(dict(m))


@dataclasses.dataclass(frozen=True)
class Buffer:
    """A named buffer: a kernel input/output in global memory, or on-chip scratch."""

    name: str
    shape: tuple[Size, ...]
    """Static ints; a global buffer of a kernel with dynamic sizes may have size expressions
    (:mod:`.sizes`) instead."""
    dtype: np.dtype
    scope: str
    """One of :data:`SCOPES`."""
    role: str
    """One of :data:`ROLES`."""
    line: str | None = dataclasses.field(default=None, compare=False)
    aliases: str | None = None
    """For an ``init`` buffer, the output whose memory it shares."""
    layout: Any = dataclasses.field(default=None, compare=False)
    """For a ``fragment`` buffer, its thread layout: the user's (``jt.annotate_layout``),
    or the one GPU layout inference gave it. Printed, and so part of the content key."""
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    """What GPU passes decide about a shared buffer, printed after its type (``{offset=0,
    stages=3, swizzle=1}``): ``offset``, its byte offset in the block's dynamic shared
    memory, and ``stages``, how many copies a pipelined loop multi-buffers (the shared-memory
    plan); ``swizzle``, the physical order a gemm reads it in (the gemm plan: 0 row-major,
    ``s`` >= 1 16-byte chunks XOR-swizzled with step ``s``), or ``wgmma_swizzle`` (bytes: the
    tile is in wgmma's canonical swizzled layout). Empty before those passes."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", _frozen_map(self.attrs))

    def with_attrs(self, **attrs: Any) -> Buffer:
        """A copy of the buffer with ``attrs`` added."""
        return dataclasses.replace(self, attrs={**self.attrs, **attrs})


class Value:
    """An SSA value: a tile of ``shape`` and ``dtype`` (``shape == ()`` for a scalar)."""

    __slots__ = ("id", "shape", "dtype")

    def __init__(self, shape: Sequence[int], dtype: Any):
        object.__setattr__(self, "id", next(_ids))
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        object.__setattr__(self, "dtype", np.dtype(dtype))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Tile IR values are immutable")

    def __repr__(self) -> str:
        return f"%{self.id}"


@dataclasses.dataclass(frozen=True)
class Index:
    """One dimension of a buffer access: ``start`` (int or scalar Value) and ``size``
    (None selects the single element at ``start`` and drops the dimension)."""

    start: int | Value
    size: int | None


@dataclasses.dataclass(frozen=True)
class Region:
    """A rectangular part of a buffer: one :class:`Index` per buffer dimension. The tile it
    denotes has the sizes of its sized dimensions (:attr:`shape`)."""

    buffer: str
    index: tuple[Index, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tile_shape(self.index)

    def values(self) -> list[Value]:
        """The Values the region's starts refer to."""
        return [i.start for i in self.index if isinstance(i.start, Value)]

    def is_whole(self, shape: Sequence[int]) -> bool:
        """Whether the region is all of a buffer of ``shape``."""
        return all(not isinstance(i.start, Value) and i.start == 0 and i.size == n
                   for i, n in zip(self.index, shape))


def whole(buffer: str, shape: Sequence[int]) -> Region:
    """The region covering all of a buffer of ``shape``."""
    return Region(buffer, tuple(Index(0, int(n)) for n in shape))


@dataclasses.dataclass(frozen=True, eq=False)
class Op:
    """One op: ``kind`` names its definition in :mod:`.op_defs`."""

    kind: str
    operands: tuple[Value, ...]
    result: Value | None
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    line: str | None = None
    notes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Pass annotations (not part of the content key), e.g. ``inline`` from fusion."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "operands", tuple(self.operands))
        object.__setattr__(self, "attrs", _frozen_map(self.attrs))
        object.__setattr__(self, "notes", _frozen_map(self.notes))

    def with_notes(self, **notes: Any) -> Op:
        """A copy of the op with ``notes`` added."""
        return dataclasses.replace(self, notes={**self.notes, **notes})


@dataclasses.dataclass(frozen=True, eq=False)
class For:
    """``for var in range(start, start + extent)``; a Value start or extent is computed on
    the device (block indices, values read from inputs) and an extent below 1 runs no
    iteration."""

    var: Value
    start: int | Value
    extent: int | Value
    kind: str
    stages: int
    body: tuple[Stmt, ...]
    line: str | None = None
    warp_specialize: bool | None = None
    """A pipelined loop's override of warp specialisation (``jt.pipelined``'s flag; None:
    the compiler decides, :mod:`.gpu.warp_specialise`)."""
    pingpong: bool | None = None
    """A pipelined loop's override of ping-pong scheduling between its consumer warpgroups
    (``jt.pipelined``'s flag; None: the compiler decides, :mod:`.gpu.pingpong`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "body", tuple(self.body))


@dataclasses.dataclass(frozen=True, eq=False)
class If:
    cond: Value
    then: tuple[Stmt, ...]
    otherwise: tuple[Stmt, ...]
    line: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "then", tuple(self.then))
        object.__setattr__(self, "otherwise", tuple(self.otherwise))


@dataclasses.dataclass(frozen=True, eq=False)
class While:
    """A device loop on a condition: run ``cond``, which computes the scalar bool ``test``;
    stop when it is false, else run ``body`` and repeat. Both read and write buffers;
    values defined in ``cond`` are not visible in ``body``."""

    cond: tuple[Stmt, ...]
    test: Value
    body: tuple[Stmt, ...]
    line: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cond", tuple(self.cond))
        object.__setattr__(self, "body", tuple(self.body))


Stmt = Op | For | If | While


@dataclasses.dataclass(frozen=True, eq=False)
class Kernel:
    """One kernel specialisation in Tile IR."""

    name: str
    grid: tuple[Size, ...]
    """Blocks per grid axis: ints, or size expressions in a kernel with dynamic sizes."""
    threads: int
    buffers: tuple[Buffer, ...]
    block_indices: tuple[Value, ...]
    body: tuple[Stmt, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid", tuple(self.grid))
        object.__setattr__(self, "buffers", tuple(self.buffers))
        object.__setattr__(self, "block_indices", tuple(self.block_indices))
        object.__setattr__(self, "body", tuple(self.body))

    @property
    def num_blocks(self) -> int:
        """Blocks of the launch grid (ValueError if the grid has dynamic sizes)."""
        if not is_static(self.grid):
            raise ValueError(f"kernel {self.name}: the grid {list(self.grid)} has dynamic "
                             "sizes")
        return int(np.prod(self.grid))

    @property
    def dynamic(self) -> bool:
        """Whether some buffer or grid extent is a size expression (known at run time)."""
        return not is_static(self.grid) or any(not is_static(b.shape) for b in self.buffers)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    @property
    def params(self) -> tuple[Buffer, ...]:
        """The buffers passed in by the caller: inputs, inits, then outputs."""
        return tuple(b for role in ("input", "init", "output") for b in self.buffers
                     if b.role == role)


def walk(body: Sequence[Stmt]) -> Iterator[Stmt]:
    """Yield every statement of ``body``, nested ones included, in program order."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, For):
            yield from walk(stmt.body)
        elif isinstance(stmt, If):
            yield from walk(stmt.then)
            yield from walk(stmt.otherwise)
        elif isinstance(stmt, While):
            yield from walk(stmt.cond)
            yield from walk(stmt.body)


def regions(op: Op) -> list[Region]:
    """Every region among an op's attributes."""
    return [v for v in op.attrs.values() if isinstance(v, Region)]


def uses(stmt: Stmt) -> list[Value]:
    """Values a statement reads directly (not those of nested statements)."""
    if isinstance(stmt, Op):
        vals = list(stmt.operands)
        for r in regions(stmt):
            vals += r.values()
        return vals
    if isinstance(stmt, For):
        return [v for v in (stmt.start, stmt.extent) if isinstance(v, Value)]
    if isinstance(stmt, While):
        return [stmt.test]  # defined by its own condition block
    return [stmt.cond]


def blocks(stmt: Stmt) -> tuple[tuple[Stmt, ...], ...]:
    """The statement lists nested in ``stmt`` (none for an op)."""
    if isinstance(stmt, For):
        return (stmt.body,)
    if isinstance(stmt, If):
        return (stmt.then, stmt.otherwise)
    if isinstance(stmt, While):
        return (stmt.cond, stmt.body)
    return ()


def with_blocks(stmt: Stmt, new: Sequence[Sequence[Stmt]]) -> Stmt:
    """``stmt`` (a loop or a conditional) with its nested statement lists replaced by
    ``new``, given in the order of :func:`blocks`."""
    if isinstance(stmt, For):
        (body,) = new
        return dataclasses.replace(stmt, body=tuple(body))
    if isinstance(stmt, If):
        then, otherwise = new
        return dataclasses.replace(stmt, then=tuple(then), otherwise=tuple(otherwise))
    if isinstance(stmt, While):
        cond, body = new
        return dataclasses.replace(stmt, cond=tuple(cond), body=tuple(body))
    raise TypeError(f"{type(stmt).__name__} has no nested statements")


def map_ops(body: Sequence[Stmt], fn: Callable[[Op], Sequence[Stmt]]) -> tuple[Stmt, ...]:
    """``body`` with every op, nested ones included, replaced by the statements ``fn``
    returns for it (``[op]`` keeps it); loops and conditionals are rebuilt around their
    new blocks, in program order."""
    out: list[Stmt] = []
    for stmt in body:
        if isinstance(stmt, Op):
            out += fn(stmt)
        else:
            out.append(with_blocks(stmt, [map_ops(b, fn) for b in blocks(stmt)]))
    return tuple(out)


def tile_shape(index: Sequence[Index]) -> tuple[int, ...]:
    """The shape of the tile an index selects."""
    return tuple(i.size for i in index if i.size is not None)


def compose_indices(levels: list[list[tuple[Any, int | None]]], shape: tuple[int, ...],
                    add: Any) -> list[tuple[Any, int | None]]:
    """Fold views of views into one index of the base buffer.

    ``levels`` holds, outermost view first, one ``(start, size)`` per dimension *of the view
    it indexes* (``size`` None selects one element and drops the dimension). Returns one
    ``(start, size)`` per base dimension; ``add(a, b)`` adds two starts (ints or the caller's
    scalar values).
    """
    dims: list[tuple[Any, int | None]] = [(0, n) for n in shape]
    open_dims = list(range(len(shape)))
    for level in levels:
        if len(level) != len(open_dims):
            raise ValueError(f"a view with {len(level)} indices of a {len(open_dims)}-d ref")
        still_open = []
        for d, (start, size) in zip(open_dims, level):
            base = dims[d][0]
            dims[d] = (start if isinstance(base, int) and base == 0 else add(base, start), size)
            if size is not None:
                still_open.append(d)
        open_dims = still_open
    return dims
