"""Symbolic scalars (compiler/analysis/symbolic.py): the expression of every integer scalar
evaluates, at each block index, to what the op's definition gives, and its interval holds
that value."""

import textwrap

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
