"""What the per-op lowerings (``gemm``, ``copies``, ``reductions``) use of the kernel
lowering in ``lower.py``: its builder, buffers and values, and a few helpers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from tvm import tirx
from tvm.ir import Expr

from .. import ir
from ..target import Target
from . import tir_emit

if TYPE_CHECKING:
    from .copy_reuse import Relayout

FALLBACK_LANES = 8
"""Vector lanes tried when the target's width does not divide a loop."""


def extent(n: Expr) -> int | Expr:
    """A TIR buffer dimension as a Python int when static, else the expression (a dimension
    of a kernel with dynamic sizes)."""
    return int(n) if isinstance(n, tirx.IntImm) else n


class Lowering(Protocol):
    kernel: ir.Kernel
    kb: tir_emit.KernelBuilder
    target: Target
    bufs: dict[str, tirx.Buffer]
    """TIR buffer of each Tile IR buffer name (and of temporaries made while lowering)."""
    scopes: dict[str, str]
    scalars: dict[int, Expr]
    """Scalar Tile IR values by id."""
    arrays: dict[int, tirx.Buffer]
    """Materialised tile values by id."""
    gemm_sources: dict[str, Any]
    """Gemm operands read from the global region they would be copied from
    (:class:`.forwarding.GemmOperand`)."""
    panel_strips: dict[str, int]
    """On-chip B operands held strip-major: name -> strip width (:func:`.gemm.strip_panels`)."""
    edges: Any
    """The masked edges of the forwarded statements being lowered (a
    :class:`.forwarding.Edges`), or ``None``."""

    def name(self, prefix: str) -> str: ...
    def dtype(self, buf: tirx.Buffer) -> str: ...
    def alloc_like(self, name: str, shape: Sequence[int], like: tirx.Buffer) -> tirx.Buffer: ...
    def value_array(self, v: ir.Value) -> tirx.Buffer: ...
    def array_index(self, arr: tirx.Buffer, idx: Sequence[Expr]) -> list[Expr]: ...
    def bind(self, value: Expr) -> Expr: ...
    def at(self, v: ir.Value, idx: Sequence[Expr]) -> Expr: ...
    def start(self, index: ir.Index, dim: int | Expr, clamp: bool) -> Expr: ...
    def nest(self, shape: Sequence[int],
             vectorize: bool = True) -> AbstractContextManager[list[Expr]]: ...
    def value_nest(self, shape: Sequence[int],
                   vectorize: bool = True) -> AbstractContextManager[list[Expr]]: ...
    def value_nests(self, shape: Sequence[int], vectorize: bool = True,
                    past: bool = True) -> Iterator[list[Expr]]: ...
    def snapshot(self, region: ir.Region, transpose: bool = False) -> str: ...
    def write_back(self, name: str, region: ir.Region) -> None: ...
    def relayout(self, op: ir.Op, role: str) -> Relayout | None: ...
