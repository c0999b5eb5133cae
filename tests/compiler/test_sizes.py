"""Size expressions (``compiler/sizes.py``) agree with JAX's symbolic dimensions."""

import jax
import pytest

from jaxtile.compiler import sizes


@pytest.mark.parametrize("make", [
    lambda a, b: a,
    lambda a, b: (a + 3) // 4,
    lambda a, b: 4 * a - 1,
    lambda a, b: a % 8,
    lambda a, b: (a + 127) // 128 * 128,
    lambda a, b: a * b,
    lambda a, b: (a - b) // 2,
    lambda a, b: 2 * (a + 1) - b,
])
def test_canonical_text_evaluates_like_jax(make):
    a, b = jax.export.symbolic_shape("x_0, y_1")
    expr = make(a, b)
    text = sizes.canonical(expr)
    assert " " not in text
    assert sizes.canonical(text) == text                       # canonical is a fixed point
    for env in ({"x_0": 13, "y_1": 5}, {"x_0": 1, "y_1": 7}, {"x_0": 256, "y_1": 0}):
        want = make(env["x_0"], env["y_1"])
        assert sizes.evaluate(text, env) == want


def test_symbols_and_static_sizes():
    assert sizes.canonical(7) == 7
    assert sizes.symbols("floordiv(x_0+3,4)*y_1") == {"x_0", "y_1"}
    assert sizes.symbols(5) == set()
    assert sizes.is_static((1, 2)) and not sizes.is_static((1, "x_0"))
    assert sizes.split_dims("floordiv(x_0+3,4), 8") == ["floordiv(x_0+3,4)", "8"]
    assert sizes.parse_size(" 12 ") == 12 and sizes.parse_size("x_0") == "x_0"


@pytest.mark.parametrize("bad", ["", "x_0 +", "floordiv(x_0)", "x_0 / 2", "3 x_0"])
def test_malformed_sizes_are_rejected(bad):
    with pytest.raises(ValueError, match="size expression"):
        sizes.parse(bad)
