"""How a compiled CUDA kernel is launched: grid, block, dynamic shared memory, parameters.

A :class:`Launch` travels with the cubin, in the build cache's record and in the custom
call's payload, as one line of text (:meth:`Launch.encode`) that the C++ handler parses
(``ffi/cuda/launch_spec.cc``)::

    grid=4,4,1;block=128,1,1;smem=49152;params=b0,b1,b2,i32:512,f32:0.5

Parameters are the kernel's, in order: ``b<i>`` is the device address of XLA buffer ``i``
(operands, then results), ``i32:``/``i64:``/``u32:``/``u64:``/``f32:``/``f64:`` a scalar
constant of that C type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCALAR_TYPES = ("i32", "i64", "u32", "u64", "f32", "f64")
_PARAM = re.compile(r"b\d+|(?:[iu](?:32|64)):-?\d+|f(?:32|64):[-+0-9.eEinfa]+")


def buffer(index: int) -> str:
    """The parameter that is the address of XLA buffer ``index`` (operands, then results)."""
    return f"b{index}"


def scalar(ctype: str, value: int | float) -> str:
    """A scalar parameter of C type ``ctype`` (one of :data:`SCALAR_TYPES`)."""
    if ctype not in SCALAR_TYPES:
        raise ValueError(f"scalar type {ctype!r} is not one of {SCALAR_TYPES}")
    # repr() of a float round-trips through strtod exactly.
    return f"{ctype}:{int(value) if ctype[0] in 'iu' else repr(float(value))}"


@dataclass(frozen=True)
class Launch:
    """A CUDA launch configuration, as CUDA states it (x, y, z extents)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem: int = 0
    params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("grid", "block"):
            dims = getattr(self, name)
            if len(dims) != 3 or any(type(d) is not int or d < 1 for d in dims):
                raise ValueError(f"launch {name} {dims!r} must be three positive ints")
        if type(self.dynamic_smem) is not int or self.dynamic_smem < 0:
            raise ValueError(f"dynamic shared memory {self.dynamic_smem!r} must be >= 0")
        for p in self.params:
            if not _PARAM.fullmatch(p):
                raise ValueError(f"bad kernel parameter {p!r} (expected b<i> or <type>:<value>)")

    @property
    def num_blocks(self) -> int:
        """Blocks in the grid."""
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
        grid = tuple(int(d) for d in fields["grid"].split(","))
        block = tuple(int(d) for d in fields["block"].split(","))
        params = tuple(fields["params"].split(",")) if fields["params"] else ()
        return cls(grid, block, int(fields["smem"]), params)  # type: ignore[arg-type]
