"""Known factors (compiler/analysis/divisibility.py): each scalar is a multiple of its factor
for every block and loop iteration, checked by evaluating the kernel's scalars."""

import itertools
import re
import textwrap

from jaxtile.compiler import ir, op_defs, parser
from jaxtile.compiler.analysis.divisibility import known_factors

_KERNEL = textwrap.dedent("""
    kernel k(grid=[5], threads=128) blocks(%0):
      input x: global float32[256]
      output y: global float32[256]
      %1: int32[] = const() {value=12}
      %2: int32[] = elementwise(%0, %1) {fn='mul'}
      %3: int32[] = const() {value=-8}
      %4: int32[] = elementwise(%2, %3) {fn='sub'}
      %5: int64[] = convert(%4)
      %6: int32[] = const() {value=0}
      %7: int32[] = elementwise(%6, %0) {fn='mul'}
      %8: int32[] = elementwise(%0, %3) {fn='add'}
      for %9 in serial(0, +3):
        %10: int32[] = const() {value=6}
        %11: int32[] = elementwise(%9, %10) {fn='mul'}
        %12: int32[] = elementwise(%4, %11) {fn='add'}
        %13: int32[] = elementwise(%12, %7) {fn='add'}
        %14: float32[4] = load() {src=x[%13:+4]}
        store(%14) {dst=y[%13:+4]}
""").strip()


def _values(kernel: ir.Kernel, b0: int, i: int) -> dict[int, int]:
    """Every integer scalar of the kernel for block ``b0`` at loop iteration ``i``."""
    env = {kernel.block_indices[0].id: b0}
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.For):
            env[s.var.id] = i
        elif isinstance(s, ir.Op) and s.result is not None and s.result.shape == ():
            env[s.result.id] = op_defs.evaluate(s, [env[v.id] for v in s.operands])
    return env


def test_every_scalar_is_a_multiple_of_its_known_factor():
    kernel = parser.parse_kernel(_KERNEL)
    factors = known_factors(kernel)
    for b0, i in itertools.product(range(5), range(3)):
        for vid, value in _values(kernel, b0, i).items():
            f = factors.get(vid, 1)
            assert (value == 0) if f == 0 else value % f == 0, (vid, b0, i, value, f)


def test_factors_of_products_sums_and_conversions():
    kernel = parser.parse_kernel(_KERNEL)
    ops = [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op) and s.result is not None]
    number = {s.result.id: int(n) for s, n in zip(ops, re.findall(r"^ *%(\d+):", _KERNEL, re.M))}
    factors = {number[v]: f for v, f in known_factors(kernel).items()}
    # b0 * 12 -> 12; minus -8 -> gcd 4; int64 keeps 4; 0 -> 0; 0 * b0 -> 0; b0 + -8 -> 1;
    # i * 6 -> 6; (12 b0 + 8) + 6 i -> 2; + 0 -> 2. Block indices and loop variables: none.
    assert factors == {1: 12, 2: 12, 3: 8, 4: 4, 5: 4, 6: 0, 7: 0, 8: 1, 10: 6, 11: 6,
                       12: 2, 13: 2}
