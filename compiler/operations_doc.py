"""``docs/operations.md``, generated so that it cannot go stale (a test compares the two):
the JAX primitives kernel bodies may use (from the converter's own table), and the Tile IR
operations they become, with the backends that lower each (from the backends' lowering
registries) and the dtypes each takes (from :mod:`.op_defs`).

Run ``python -m jaxtile.compiler.operations_doc`` to rewrite the page."""

from __future__ import annotations

import pathlib

import numpy as np

from . import from_jaxpr as fj
from . import op_defs, operations_text
from . import tile_primitives as tp

_GROUPS = (
    ("Elementwise", lambda n: n in fj._UNARY or n in fj._BINARY or n in (
        "round", "integer_pow", "convert_element_type", "select_n", "clamp")),
    ("Reductions and scans", lambda n: n in fj._REDUCE or n in fj._SCANS or n in (
        "argmax", "argmin", "sort", "top_k")),
    ("Shapes", lambda n: n in ("broadcast_in_dim", "reshape", "squeeze", "expand_dims",
                               "transpose", "iota", "rev", "slice", "concatenate", "stack",
                               "dim_as_value")),
    ("Refs and tile ops", lambda n: n in ("get", "swap", "addupdate", tp.COPY, tp.GEMM,
                                          "dot_general",
                                          tp.ATOMIC, tp.LOAD_ACQUIRE, tp.STORE_RELEASE,
                                          tp.FENCE, tp.PRINT)),
    ("Control flow and calls", lambda n: n in ("scan", "while", "cond") or n in fj._INLINE
     or n in fj._IDENTITY),
)
_FUNCTIONS = {"elementwise": sorted(op_defs.UNARY | op_defs.BINARY),
              "reduce": sorted(op_defs.REDUCTIONS), "scan": sorted(op_defs.SCANS),
              "argreduce": sorted(op_defs.ARG_REDUCTIONS), "atomic": sorted(op_defs.ATOMICS)}
"""The op kinds that take a function (``fn``): one row per function."""
_DTYPE_GROUPS = (("all", op_defs.DTYPES), ("floats", op_defs.FLOATS),
                 ("integers", op_defs.INTEGERS), ("signed integers", op_defs.SIGNED),
                 ("8-bit floats", op_defs.FLOAT8))
_ORDER = sorted(op_defs.DTYPES, key=lambda d: (d.kind != "f", d.kind != "i", d.kind != "u",
                                                d.itemsize, d.name))


def lowered() -> dict[str, frozenset[str]]:
    """The op kinds each backend lowers (its lowering registries), by the name the page
    uses. The CUDA emulator runs the CUDA backend's code, so it lowers what ``cuda`` does."""
    # Imported here: this page is the one place that looks at every backend.
    from .cpu import lower as cpu
    from .gpu.codegen import lower as cuda

    return {"cpu": cpu.STATEMENTS.kinds() | cpu.ELEMENTS.kinds(),
            "cuda": cuda.LOWERINGS.kinds()}


def operations() -> list[tuple[str, str, str | None]]:
    """(name in the page, op kind, function or None) for every Tile IR operation."""
    out = []
    for kind in op_defs.OPS:
        for fn in _FUNCTIONS.get(kind, [None]):
            out.append((kind if fn is None else f"{kind}.{fn}", kind, fn))
    return out


def dtype_text(dtypes: frozenset[np.dtype]) -> str:
    """``dtypes`` in words: whole groups by name, then the rest."""
    parts, left = [], set(dtypes)
    for name, group in _DTYPE_GROUPS:
        if group <= left:
            parts.append(name)
            left -= group
    parts += [d.name for d in _ORDER if d in left]
    return ", ".join(parts)


def _primitives() -> list[str]:
    lines = ["| group | primitives |", "| --- | --- |"]
    seen: set[str] = set()
    for title, member in _GROUPS:
        names = sorted(n for n in fj.CONVERTERS if member(n) and n not in seen)
        seen.update(names)
        lines.append(f"| {title} | {', '.join(f'`{n}`' for n in names)} |")
    rest = sorted(set(fj.CONVERTERS) - seen)
    if rest:
        lines.append(f"| Other | {', '.join(f'`{n}`' for n in rest)} |")
    return lines


def _matrix() -> list[str]:
    regs = lowered()
    names = {name for name, _, _ in operations()}
    stale = sorted(set(operations_text.DESCRIPTIONS) - names)
    if stale:
        raise ValueError(f"operations_text.DESCRIPTIONS names no operation: {stale}")
    lines = [f"| operation | {' | '.join(regs)} | dtypes |",
             f"| --- | {' | '.join('---' for _ in regs)} | --- |"]
    for name, kind, fn in operations():
        cells = ["yes" if kind in kinds else "not lowered" for kinds in regs.values()]
        dtypes = dtype_text(op_defs.get(kind).accepts(fn))
        lines.append(f"| `{name}` | {' | '.join(cells)} | {dtypes} |")
    described = [(name, operations_text.DESCRIPTIONS[name]) for name, _, _ in operations()
                 if name in operations_text.DESCRIPTIONS]
    if described:
        lines += ["", "### What each operation computes", ""]
        for name, text in described:
            lines += [f"#### `{name}`", "", text.strip(), ""]
        lines.pop()
    return lines


def operations_markdown() -> str:
    """The text of ``docs/operations.md``."""
    lines = ["# Operations kernel bodies may use", "",
             "Generated from the converter's table (`compiler/from_jaxpr.py`; "
             "`compiler/operations_doc.py` writes this page): the JAX primitives that "
             "`jnp`/`lax` calls in a kernel body may produce. `while` is a counted loop "
             "(`jt.loop`/`jt.pipelined` with traced bounds) or a `jt.while_` loop; "
             "`dot_general` (`jnp.dot`, `@`) of 2-D tiles is a gemm through on-chip "
             "tiles. `sort` is `jnp.sort`, "
             "`jnp.argsort` and `lax.sort` of several operands (stable, XLA's order); "
             "`top_k` is `lax.top_k` (values and indices, ties to the lower index). "
             "Anything else is a `KernelError` at the line that uses it.", "",
             *_primitives(), "",
             "## Tile IR operations by backend", "",
             "The operations those primitives become (`compiler/op_defs.py`), whether each "
             "backend lowers it (its lowering registry: `cpu/lower.py`, `gpu/codegen/lower.py`; "
             "the CUDA emulator runs the CUDA backend's code) and the dtypes it takes. An "
             "operation a backend does not lower is a `KernelError` there. `relayout` and "
             "`barrier` are inserted by the GPU passes, never written by a kernel. "
             "`tests/compiler/test_operation_matrix.py` runs every operation with every "
             "dtype on every backend.", "",
             *_matrix()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    path = pathlib.Path(__file__).resolve().parents[1] / "docs" / "operations.md"
    path.write_text(operations_markdown())
