"""How a compiled GPU kernel is launched: grid, block, dynamic shared memory, parameters.

A :class:`Launch` travels with the cubin (CUDA) or code object (HIP), in the build cache's
record and in the custom call's payload, as one line of text (:meth:`Launch.encode`) that
the C++ handlers parse (``ffi/common/launch_spec.cc``: CUDA's ``cuLaunchKernel`` and HIP's
``hipModuleLaunchKernel`` take the same grid, block, shared bytes and parameter array)::

    grid=4,4,1;block=128,1,1;smem=49152;params=b0,b1,b2,i32:512,f32:0.5

Parameters are the kernel's, in order: ``b<i>`` is the device address of XLA buffer ``i``
(operands, then results), ``i32:``/``i64:``/``u32:``/``u64:``/``f32:``/``f64:`` a scalar
constant of that C type, ``dim<i>_<j>`` dimension ``j`` of buffer ``i`` (an int: a dynamic
size), ``tmap<i>:<element bytes>:<dims>:<box>:<swizzle>`` a TMA tensor map of buffer ``i``
that the CUDA handler builds at each launch with ``cuTensorMapEncodeTiled`` from the buffer's
address (dims and box innermost first, ``x``-separated: ``tmap0:2:72x100:32x64:64``).
A grid extent is an int or, for a kernel with dynamic sizes, a size expression
(:mod:`..sizes`) over such dimensions, which the handler evaluates with the shapes XLA
passes::

    grid=floordiv(dim0_0+7,8),1,1;block=128,1,1;smem=0;params=b0,b1,dim0_0
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .. import sizes

SCALAR_TYPES = ("i32", "i64", "u32", "u64", "f32", "f64")
_PARAM = re.compile(r"b\d+|dim\d+_\d+|(?:[iu](?:32|64)):-?\d+|f(?:32|64):[-+0-9.eEinfa]+"
                    r"|tmap\d+:[1248]:\d+(?:x\d+){0,4}:\d+(?:x\d+){0,4}:(?:0|32|64|128)")
_DIM = re.compile(r"dim\d+_\d+")


def buffer(index: int) -> str:
    """The parameter that is the address of XLA buffer ``index`` (operands, then results)."""
    return f"b{index}"


def dimension(index: int, dim: int) -> str:
    """The int parameter (or name in a grid expression) that is dimension ``dim`` of XLA
    buffer ``index``."""
    return f"dim{index}_{dim}"


def tensor_map(index: int, elem_bytes: int, dims: Sequence[int], box: Sequence[int],
               swizzle: int) -> str:
    """A TMA tensor map parameter of XLA buffer ``index`` (row-major, ``dims`` and ``box``
    innermost first)."""
    if len(dims) != len(box):
        raise ValueError(f"tensor map of buffer {index}: dims {dims} and box {box} differ "
                         "in rank")
    return (f"tmap{index}:{elem_bytes}:{'x'.join(map(str, dims))}:"
            f"{'x'.join(map(str, box))}:{swizzle}")


def scalar(ctype: str, value: int | float) -> str:
    """A scalar parameter of C type ``ctype`` (one of :data:`SCALAR_TYPES`)."""
    if ctype not in SCALAR_TYPES:
        raise ValueError(f"scalar type {ctype!r} is not one of {SCALAR_TYPES}")
    # repr() of a float round-trips through strtod exactly.
    return f"{ctype}:{int(value) if ctype[0] in 'iu' else repr(float(value))}"


@dataclass(frozen=True)
class Launch:
    """A GPU launch configuration, as CUDA and HIP state it (x, y, z extents)."""

    grid: tuple[int | str, int | str, int | str]
    """Extents: ints, or size expressions over ``dim<i>_<j>`` (see the module docstring)."""
    block: tuple[int, int, int]
    dynamic_smem: int = 0
    params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("grid", "block"):
            dims = getattr(self, name)
            if name == "grid" and len(dims) == 3 and not sizes.is_static(dims):
                _check_grid_expressions(dims)
                continue
            if len(dims) != 3 or any(type(d) is not int or d < 1 for d in dims):
                raise ValueError(f"launch {name} {dims!r} must be three positive ints")
        if type(self.dynamic_smem) is not int or self.dynamic_smem < 0:
            raise ValueError(f"dynamic shared memory {self.dynamic_smem!r} must be >= 0")
        for p in self.params:
            if not _PARAM.fullmatch(p):
                raise ValueError(f"bad kernel parameter {p!r} (expected b<i> or <type>:<value>)")

    @property
    def num_blocks(self) -> int:
        """Blocks in the grid (ValueError for a grid computed from the shapes)."""
        if not sizes.is_static(self.grid):
            raise ValueError(f"the grid {self.grid} is computed from the buffers' shapes")
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def threads(self) -> int:
        """Threads per block."""
        return self.block[0] * self.block[1] * self.block[2]

    def encode(self) -> str:
        """The one-line text form (see the module docstring)."""
        dims = ",".join
        return (f"grid={dims(map(str, self.grid))};block={dims(map(str, self.block))};"
                f"smem={self.dynamic_smem};params={dims(self.params)}")

    @classmethod
    def decode(cls, text: str) -> Launch:
        """Inverse of :meth:`encode`; raises ValueError on text it did not write."""
        fields = dict(part.partition("=")[::2] for part in text.split(";"))
        if set(fields) != {"grid", "block", "smem", "params"}:
            raise ValueError(f"bad launch text {text!r}")
        grid = tuple(sizes.parse_size(d) for d in sizes.split_dims(fields["grid"]))
        block = tuple(int(d) for d in fields["block"].split(","))
        params = tuple(fields["params"].split(",")) if fields["params"] else ()
        return cls(grid, block, int(fields["smem"]), params)  # type: ignore[arg-type]


def _check_grid_expressions(grid: tuple[int | str, ...]) -> None:
    for d in grid:
        if isinstance(d, int):
            if d < 1:
                raise ValueError(f"launch grid {grid!r}: extents must be positive")
            continue
        try:
            names = sizes.symbols(d)
        except ValueError:
            raise ValueError(f"launch grid {grid!r}: {d!r} is no size expression") from None
        bad = sorted(n for n in names if not _DIM.fullmatch(n))
        if bad:
            raise ValueError(f"launch grid {grid!r}: {bad[0]!r} is not a buffer dimension "
                             "(dim<i>_<j>)")


def launch_grid(grid_size: sizes.Size, size_params: Sequence[tuple[str, int, int]]) -> sizes.Size:
    """A dynamic grid's block count (a size expression over the kernel's dynamic sizes) over
    the buffers' dimensions (``dim<i>_<j>``), for the handler to evaluate with the shapes XLA
    passes; ``size_params`` says which buffer dimension each size is (name, buffer, dim)."""
    where = {name: dimension(i, d) for name, i, d in size_params}
    return sizes.canonical(sizes.fold(grid_size, where.__getitem__, _SIZE_TEXT))


_SIZE_TEXT = {
    "+": lambda a, b: f"({a}+{b})", "-": lambda a, b: f"({a}-{b})",
    "*": lambda a, b: f"({a}*{b})", "neg": lambda a: f"(-{a})",
    "floordiv": lambda a, b: f"floordiv({a},{b})", "mod": lambda a, b: f"mod({a},{b})",
    "max": lambda a, b: f"max({a},{b})", "min": lambda a, b: f"min({a},{b})",
}
