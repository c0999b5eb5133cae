"""Issue 19, point 18: every operation docs/operations.md lists has a description of its
semantics, dtypes and limits (compiler/operations_text.py), and no description is stale."""

from jaxtile.compiler import from_jaxpr as fj
from jaxtile.compiler import op_defs, operations_text

_FUNCTIONS = {"elementwise": op_defs.UNARY | op_defs.BINARY, "reduce": op_defs.REDUCTIONS,
              "scan": op_defs.SCANS, "argreduce": op_defs.ARG_REDUCTIONS,
              "atomic": op_defs.ATOMICS}
"""The op kinds that take a function: the page names them ``kind.fn``."""


def test_every_operation_has_a_description():
    names = {f"{kind}.{fn}" for kind in op_defs.OPS if kind in _FUNCTIONS
             for fn in _FUNCTIONS[kind]}
    names |= {kind for kind in op_defs.OPS if kind not in _FUNCTIONS}
    described = set(operations_text.DESCRIPTIONS)
    assert not names - described, f"no description: {sorted(names - described)}"
    assert not described - names, f"not an operation: {sorted(described - names)}"


def test_primitive_notes_name_primitives_the_converter_knows():
    # The notes cover primitives that are not one operation each: control flow, calls,
    # rewrites, dot_general (a gemm through tiles); each must be a primitive the converter handles.
    assert not set(operations_text.PRIMITIVES) - set(fj.CONVERTERS)
    for name in ("while", "scan", "cond", "integer_pow", "clamp", "dot_general"):
        assert name in operations_text.PRIMITIVES, name


def test_descriptions_are_not_empty():
    for name, text in {**operations_text.DESCRIPTIONS, **operations_text.PRIMITIVES}.items():
        assert text.strip(), name
    assert "**Dtypes.**" in operations_text.RULES
