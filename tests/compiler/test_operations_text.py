"""Issue 19, point 18: every operation docs/operations.md lists has a description of its
semantics, dtypes and limits (compiler/operations_text.py), and no description is stale."""

from jaxtile.compiler import from_jaxpr as fj
from jaxtile.compiler import operations_text


def test_every_accepted_primitive_has_a_description():
    accepted = set(fj.CONVERTERS) - set(fj._REJECTED)
    described = set(operations_text.DESCRIPTIONS)
    assert not accepted - described, f"no description: {sorted(accepted - described)}"
    assert not described - accepted, f"not an operation: {sorted(described - accepted)}"


def test_descriptions_are_single_paragraphs_of_markdown():
    # Each sits in one table cell of the generated page: no line breaks, no pipes.
    for name, text in operations_text.DESCRIPTIONS.items():
        assert text.strip() and "\n" not in text and "|" not in text, name
