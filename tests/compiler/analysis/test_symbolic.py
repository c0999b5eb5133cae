"""Symbolic scalars (compiler/analysis/symbolic.py): the expression of every integer scalar
evaluates, at each block index, to what the op's definition gives, and its interval holds
that value."""

import textwrap

import numpy as np

from jaxtile.compiler import ir, op_defs, parser
from jaxtile.compiler.analysis import symbolic

_KERNEL = textwrap.dedent("""
    kernel k(grid=[7], threads=128) blocks(%0):
      input x: global float32[64]
      output y: global float32[64]
      %1: int32[] = const() {value=-3}
      %2: int32[] = elementwise(%0, %1) {fn='mul'}
      %3: int32[] = const() {value=4}
      %4: int32[] = elementwise(%2, %3) {fn='div'}
      %5: int32[] = elementwise(%2, %3) {fn='rem'}
      %6: int32[] = elementwise(%4, %5) {fn='max'}
      %7: int32[] = elementwise(%6, %0) {fn='min'}
      %8: int32[] = elementwise(%7) {fn='neg'}
      %9: int64[] = convert(%8)
      %10: int32[] = elementwise(%0, %3) {fn='sub'}
      %11: bool[] = elementwise(%10, %2) {fn='ge'}
      %12: float32[4] = load() {src=x[0:+4]}
      store(%12) {dst=y[%0:+4]}
""").strip()


def _evaluate(op: ir.Op, args: list[int]) -> int:
    if op.attrs.get("fn") == "ge":           # a comparison: op_defs evaluates integers only
        return int(args[0] >= args[1])
    return op_defs.evaluate(op, args)


def test_expressions_evaluate_to_the_ops_values_within_their_intervals():
    kernel = parser.parse_kernel(_KERNEL)
    (b,) = kernel.block_indices
    facts = symbolic.Facts(exprs={b.id: ("sym", "b")}, conds=[], syms=set(),
                           ranges={"b": (0, 6)})
    ops = [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op)]
    for op in ops:
        symbolic.define(op, facts)
    scalars = [op for op in ops if op.result is not None and op.result.shape == ()]
    assert {op.result.id for op in scalars} <= set(facts.exprs)
    for block in range(7):
        values = {b.id: block}
        for op in scalars:
            values[op.result.id] = _evaluate(op, [values[v.id] for v in op.operands])
            e = facts.exprs[op.result.id]
            assert symbolic.value(e, {"b": block}) == values[op.result.id], op
            bounds = symbolic.interval(e, facts.ranges)
            if bounds is not None:
                assert bounds[0] <= values[op.result.id] <= bounds[1], op
    assert symbolic.symbols(facts.exprs[scalars[-1].result.id]) == {"b"}


def _random_expr(rng, names, depth):
    if depth == 0 or rng.random() < 0.25:
        return ("int", int(rng.integers(-5, 6))) if rng.random() < 0.3 else \
            ("sym", str(rng.choice(names)))
    op = str(rng.choice(["+", "-", "*", "max", "min", "floordiv", "neg"]))
    if op == "neg":
        return ("neg", _random_expr(rng, names, depth - 1))
    if op == "floordiv":
        return (op, _random_expr(rng, names, depth - 1), ("int", int(rng.integers(1, 5))))
    return (op, _random_expr(rng, names, depth - 1), _random_expr(rng, names, depth - 1))


def test_half_intervals_hold_every_value_within_the_symbols_bounds():
    """Random expressions over symbols bounded on both, one or no side: every value at
    symbol values within the bounds lies within the expression's bounds (sound), and where
    :func:`interval` bounds it too, the bounds are its."""
    rng = np.random.default_rng(0)
    bounds = {"a": (0, None), "b": (-3, 4), "c": (None, 2), "d": (None, None)}
    for _ in range(400):
        e = _random_expr(rng, list(bounds), 3)
        lo, hi = symbolic.half_interval(e, bounds)
        for _ in range(20):
            env = {n: int(rng.integers(-40 if low is None else low, 41 if h is None else h + 1))
                   for n, (low, h) in bounds.items()}
            v = symbolic.value(e, env)
            assert (lo is None or lo <= v) and (hi is None or v <= hi), (e, env, lo, hi)
        both = symbolic.interval(e, {"b": (-3, 4)})     # None where it cannot bound e
        if both is not None:
            assert (lo, hi) == both


def test_conditions_bound_the_symbols_they_compare():
    b, i, n, u = (("sym", s) for s in "binu")
    conds = [("<=", ("int", 0), b), ("<=", b, i), ("<", i, ("+", b, ("int", 4))),
             ("<", i, n), ("==", u, ("int", 3))]
    known = symbolic.known_bounds(conds, {"b": (0, 6)})
    # i >= b >= 0 and i < b + 4 <= 10; n > i >= 0; equalities are left to the provers.
    assert known["b"] == (0, 6) and known["i"] == (0, 9) and known["n"] == (1, None)
    assert "u" not in known
    assert symbolic.half_interval(("*", i, ("int", 32)), known) == (0, 288)
