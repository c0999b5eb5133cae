"""Tile IR: the fused tile dataflow of one kernel specialisation.

A :class:`Kernel` holds buffers (global inputs/outputs and on-chip scratch with a scope), the
launch grid and a body of statements. Statements are :class:`Op` (tile ops and elementwise
math on SSA :class:`Value` s, scalars being 0-d tiles), :class:`For` (structured loops: serial,
unrolled or software-pipelined) and :class:`If`. Values defined in a scope are visible in
nested scopes. The IR is target independent; layouts, thread mapping and synchronisation are
decided by later passes and lowerings.

Op kinds (``Op.kind``) and their attrs:

=============  ==================================================================
``const``      ``value``: a Python scalar broadcast to the result shape
``iota``       ``dimension``
``elementwise``  ``fn``: name in :data:`ELEMENTWISE`; operands are scalars or have the
               result's rank with each dimension equal to the result's or 1 (broadcast)
``convert``    result dtype is the target dtype
``broadcast``  ``dims``: operand dim i becomes result dim ``dims[i]``
``reshape``    result shape only (element order preserved)
``transpose``  ``perm``
``reduce``     ``fn`` (sum/max/min/prod/and/or), ``axes``
``select``     operands ``(pred, on_false, on_true)``
``load``       ``buffer``, ``index`` -> tile read with JAX ``get`` semantics (clamped)
``store``      ``buffer``, ``index``; operand: the value
``copy``       ``src``, ``src_index``, ``dst``, ``dst_index``, ``pad``: masked tile copy
``gemm``       ``a``, ``b``, ``c``, ``transpose_a``, ``transpose_b``: ``c += a @ b``
=============  ==================================================================

An ``index`` is a tuple with one :class:`Index` per buffer dimension.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np

ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "rem", "max", "min", "pow",
    "neg", "abs", "sign", "floor", "ceil", "round", "round_away", "exp", "exp2", "log", "log1p",
    "expm1",
    "tanh", "logistic", "sqrt", "rsqrt", "sin", "cos", "erf", "square",
    "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "xor", "not",
})
REDUCTIONS = frozenset({"sum", "max", "min", "prod", "and", "or"})
SCOPES = ("global", "shared", "fragment", "local")
LOOP_KINDS = ("serial", "unrolled", "pipelined")

_ids = itertools.count()


@dataclasses.dataclass(frozen=True)
class Buffer:
    """A named buffer: a kernel input/output in global memory, or on-chip scratch."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    scope: str
    role: str
    """``input``, ``output`` or ``scratch``."""
    line: str | None = dataclasses.field(default=None, compare=False)


class Value:
    """An SSA value: a tile of ``shape`` and ``dtype`` (``shape == ()`` for a scalar)."""

    __slots__ = ("id", "shape", "dtype")

    def __init__(self, shape: tuple[int, ...], dtype: Any):
        self.id = next(_ids)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)

    def __repr__(self) -> str:
        return f"%{self.id}"


@dataclasses.dataclass(frozen=True)
class Index:
    """One dimension of a buffer access: ``start`` (int or scalar Value) and ``size``
    (None selects the single element at ``start`` and drops the dimension)."""

    start: int | Value
    size: int | None


@dataclasses.dataclass
class Op:
    kind: str
    operands: tuple[Value, ...]
    result: Value | None
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    line: str | None = None


@dataclasses.dataclass
class For:
    var: Value
    start: int | Value
    extent: int
    kind: str
    stages: int
    body: list[Stmt]
    line: str | None = None


@dataclasses.dataclass
class If:
    cond: Value
    then: list[Stmt]
    otherwise: list[Stmt]
    line: str | None = None


Stmt = Op | For | If


@dataclasses.dataclass
class Kernel:
    """One kernel specialisation in Tile IR."""

    name: str
    grid: tuple[int, ...]
    threads: int
    buffers: tuple[Buffer, ...]
    block_indices: tuple[Value, ...]
    body: list[Stmt]

    @property
    def num_blocks(self) -> int:
        return int(np.prod(self.grid))

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    @property
    def params(self) -> tuple[Buffer, ...]:
        """The buffers passed in by the caller: inputs, then outputs."""
        return tuple(b for b in self.buffers if b.role == "input") + tuple(
            b for b in self.buffers if b.role == "output")


def walk(body: list[Stmt]):
    """Yield every statement of ``body``, nested ones included, in program order."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, For):
            yield from walk(stmt.body)
        elif isinstance(stmt, If):
            yield from walk(stmt.then)
            yield from walk(stmt.otherwise)


def index_values(index: tuple[Index, ...]) -> list[Value]:
    """The Values an index refers to (its dynamic starts)."""
    return [i.start for i in index if isinstance(i, Index) and isinstance(i.start, Value)]


def uses(stmt: Stmt) -> list[Value]:
    """Values a statement reads directly (not those of nested statements)."""
    if isinstance(stmt, Op):
        vals = list(stmt.operands)
        for key in ("index", "src_index", "dst_index"):
            if key in stmt.attrs:
                vals += index_values(stmt.attrs[key])
        return vals
    if isinstance(stmt, For):
        return [stmt.start] if isinstance(stmt.start, Value) else []
    return [stmt.cond]


SIDE_EFFECTS = frozenset({"store", "copy", "gemm"})


def tile_shape(index: tuple[Index, ...]) -> tuple[int, ...]:
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
