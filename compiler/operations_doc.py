"""The table of operations kernel bodies may use (``docs/operations.md``), generated from
the converter's own table so that it cannot go stale (a test compares the two)."""

from __future__ import annotations

from . import from_jaxpr as fj
from . import tile_primitives as tp

_GROUPS = (
    ("Elementwise", lambda n: n in fj._UNARY or n in fj._BINARY or n in (
        "round", "integer_pow", "convert_element_type", "select_n", "clamp")),
    ("Reductions and scans", lambda n: n in fj._REDUCE or n in fj._SCANS or n in (
        "argmax", "argmin", "sort", "top_k")),
    ("Shapes", lambda n: n in ("broadcast_in_dim", "reshape", "squeeze", "expand_dims",
                               "transpose", "iota", "rev", "slice", "concatenate",
                               "dim_as_value")),
    ("Refs and tile ops", lambda n: n in ("get", "swap", "addupdate", tp.COPY, tp.GEMM,
                                          tp.ATOMIC, tp.LOAD_ACQUIRE, tp.STORE_RELEASE,
                                          tp.FENCE)),
    ("Control flow and calls", lambda n: n in ("scan", "while", "cond") or n in fj._INLINE
     or n in fj._IDENTITY),
)


def operations_markdown() -> str:
    """The table of JAX primitives kernel bodies may use, generated from
    :data:`.from_jaxpr.CONVERTERS` (``docs/operations.md`` holds it; a test keeps it current)."""
    lines = ["# Operations kernel bodies may use", "",
             "Generated from the converter's table (`compiler/from_jaxpr.py`; "
             "`compiler/operations_doc.py` writes this page): the JAX primitives that "
             "`jnp`/`lax` calls in a kernel body may produce. `while` is a counted loop "
             "(`jt.loop`/`jt.pipelined` with traced bounds) or a `jt.while_` loop; "
             "`dot_general` is rejected with a pointer to `jt.gemm`. `sort` is `jnp.sort`, "
             "`jnp.argsort` and `lax.sort` of several operands (stable, XLA's order); "
             "`top_k` is `lax.top_k` (values and indices, ties to the lower index). "
             "Anything else is a `KernelError` at the line that uses it.", "",
             "| group | primitives |", "| --- | --- |"]
    seen: set[str] = set()
    for title, member in _GROUPS:
        names = sorted(n for n in fj.CONVERTERS if member(n) and n not in seen)
        seen.update(names)
        lines.append(f"| {title} | {', '.join(f'`{n}`' for n in names)} |")
    rest = sorted(set(fj.CONVERTERS) - seen - set(fj._REJECTED))
    if rest:
        lines.append(f"| Other | {', '.join(f'`{n}`' for n in rest)} |")
    return "\n".join(lines) + "\n"
