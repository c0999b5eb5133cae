"""Bounds proofs (GPU): which dimensions of a global access keep a run-time check.

A read past a global edge gives ``pad`` and a write past it is dropped, which costs a compare
per element (and, for ``cp.async``, a zero-fill form). The check is kept only where the
access cannot be proved in bounds for every block of the grid and every loop iteration.

Every integer scalar of the kernel is turned into a symbolic expression
(:mod:`..analysis.symbolic`) over
- block indices, ``0 <= b < grid`` (a grid extent may be a size expression);
- loop variables, ``start <= v < start + extent`` (bounds may themselves be expressions);
- dynamic sizes (symbols of ``compiler.sizes`` expressions), ``>= 0``;
- values read from memory (and anything else this module does not model): free integers;
combined by the integer ``elementwise`` ops (``add sub mul div rem max min``; ``div`` and
``rem`` truncate, as in XLA), ``const``, ``convert`` and ``size``. Comparisons and their
``and``/``or``/``not`` become conditions, so ``If`` branches add their condition (or its
negation) to what is known. For each region dimension the goals ``0 <= start`` and
``start + size <= extent`` go to TVM's arithmetic analyzer; what it cannot decide goes to
z3 (non-affine terms, correlated variables such as a loop starting at a block index).
Dimensions indexed by a tile of positions (gather/scatter) are never proved.

``check_bounds(kernel)`` writes ``notes["masks"]`` on every op with a global region: a tuple
of ``(region attribute, dims)`` pairs (empty dims: nothing checked), and
``notes["bounds_proofs"]``: which prover settled each proved dimension (for tests and
``kernel.lower``). ``kept_masks(kernel)`` lists the kept checks as readable lines.

Assumes: a verified kernel; int32 index arithmetic does not overflow (buffers and grids are
limited to 2^31 - 1 elements at trace time). Guarantees: a dimension not listed in an op's
``masks`` is in bounds for every block and iteration that executes the op.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from .. import ir
from ..analysis import symbolic
from ..analysis.symbolic import Expr, Facts, define, interval, symbols, value

_PROVERS = ("interval", "tvm", "z3")

Z3_TIMEOUT_MS = 200
"""Per-query budget for z3: an undecided query keeps its mask."""


class _Provers:
    """TVM's analyzer first, z3 for what it leaves undecided; imported on first use."""

    def __init__(self) -> None:
        self._tvm: Any = None
        self._z3: Any = None
        self._settled: dict[tuple, str | None] = {}

    def prove(self, goal: Expr, facts: Facts) -> str | None:
        """``"interval"``, ``"tvm"`` or ``"z3"``, what showed ``goal`` under ``facts``; None
        if nothing did. Interval arithmetic (with the bounds the conditions give symbols)
        and a search for a counterexample go first: they settle the common accesses, and
        the ragged or data-dependent ones, without importing TVM (a cold compile would pay
        about a second for it). A query asked again (the same access of two buffers, as
        attention's K and V) is answered from the first."""
        key = (goal, tuple(facts.conds), tuple(sorted(facts.ranges.items())))
        if key not in self._settled:
            self._settled[key] = self._prove(goal, facts)
        return self._settled[key]

    def _prove(self, goal: Expr, facts: Facts) -> str | None:
        if goal[0] == "<=":
            lo, hi = interval(goal[1], facts.ranges), interval(goal[2], facts.ranges)
            if lo is not None and hi is not None and lo[1] <= hi[0]:
                return "interval"
            known = symbolic.known_bounds(facts.conds, facts.ranges)
            upper = symbolic.half_interval(goal[1], known)[1]
            lower = symbolic.half_interval(goal[2], known)[0]
            if upper is not None and lower is not None and upper <= lower:
                return "interval"
        if _refuted(goal, facts):
            return None
        if self._by_tvm(goal, facts):
            return "tvm"
        if self._by_z3(goal, facts):
            return "z3"
        return None

    def _by_tvm(self, goal: Expr, facts: Facts) -> bool:
        # TVM's simplifier may take a divisor to be non-zero; XLA defines x / 0, so such
        # queries go to z3, which leaves x / 0 open.
        if any(_divides_by_variable(e) for e in [goal, *facts.conds]):
            return False
        if self._tvm is None:
            from ..tvm_import import import_tvm
            self._tvm = import_tvm()
            import tvm.sym  # noqa: F401 - the arithmetic analyzer
        tvm = self._tvm
        tir = tvm.tirx
        names: dict[str, Any] = {}

        def var(name: str) -> Any:
            return names.setdefault(name, tir.Var(name, "int64"))

        ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
               "floordiv": tir.floordiv, "mod": tir.floormod, "div": tir.truncdiv,
               "rem": tir.truncmod, "max": tir.max, "min": tir.min,
               "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
               "==": lambda a, b: tir.EQ(a, b), "!=": lambda a, b: tir.NE(a, b),
               "and": tir.And, "or": tir.Or}

        def conv(e: Expr) -> Any:
            if e[0] == "int":
                return tir.const(e[1], "int64")
            if e[0] == "sym":
                return var(e[1])
            if e[0] == "neg":
                return tir.const(0, "int64") - conv(e[1])
            if e[0] == "not":
                return tir.Not(conv(e[1]))
            return ops[e[0]](conv(e[1]), conv(e[2]))

        analyzer = tvm.sym.Analyzer()
        try:
            with analyzer.constraint_scope(tir.all(*[conv(c) for c in facts.conds])
                                           if facts.conds else tir.const(True, "bool")):
                return bool(analyzer.can_prove(conv(goal)))
        except RuntimeError:   # e.g. a constant division by zero
            return False

    def _by_z3(self, goal: Expr, facts: Facts) -> bool:
        if self._z3 is None:
            import z3
            self._z3 = z3
        z3 = self._z3
        names: dict[str, Any] = {}

        def fdiv(a: Any, b: Any) -> Any:   # z3's division floors for b > 0 and ceils for b < 0
            return z3.If(b > 0, a / b, -(a / -b) - z3.If(a % -b == 0, 0, 1))

        def tdiv(a: Any, b: Any) -> Any:
            q = z3.If(a >= 0, a, -a) / z3.If(b >= 0, b, -b)
            return z3.If((a >= 0) == (b >= 0), q, -q)

        ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
               "floordiv": fdiv, "mod": lambda a, b: a - b * fdiv(a, b), "div": tdiv,
               "rem": lambda a, b: a - b * tdiv(a, b),
               "max": lambda a, b: z3.If(a >= b, a, b), "min": lambda a, b: z3.If(a <= b, a, b),
               "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
               "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
               "and": z3.And, "or": z3.Or}

        def conv(e: Expr) -> Any:
            if e[0] == "int":
                return z3.IntVal(e[1])
            if e[0] == "sym":
                return names.setdefault(e[1], z3.Int(e[1]))
            if e[0] == "neg":
                return -conv(e[1])
            if e[0] == "not":
                return z3.Not(conv(e[1]))
            return ops[e[0]](conv(e[1]), conv(e[2]))

        solver = z3.Solver()
        solver.set("timeout", Z3_TIMEOUT_MS)
        solver.add(*[conv(c) for c in facts.conds])
        # z3 leaves x / 0 unspecified, so a proof holds whatever it is (XLA's -1 included).
        solver.add(z3.Not(conv(goal)))
        return solver.check() == z3.unsat


_CORNERS = 256
"""Most assignments :func:`_refuted` tries."""


def _refuted(goal: Expr, facts: Facts) -> bool:
    """Whether a corner of the variables' ranges satisfies every fact and breaks ``goal``:
    then no prover can succeed (they see the same facts), and the ragged edge of a grid is
    found without importing TVM. Variables without a range try ``0``, ``2**20`` and
    ``2**21`` (two large values, so that a loop variable below an end read from memory can
    still be past a buffer's edge), or only the first two where that would be too many."""
    names = sorted(symbols(goal) | set().union(*map(symbols, facts.conds)))
    if not names:
        return False
    for free in ((0, 2**20, 2**21), (0, 2**20)):
        choices = [sorted(set(facts.ranges.get(n, free))) for n in names]
        if _product_len(choices) <= _CORNERS:
            break
    else:
        return False
    for values in itertools.product(*choices):
        env = dict(zip(names, values))
        try:
            if all(value(c, env) for c in facts.conds) and not value(goal, env):
                return True
        except ZeroDivisionError:
            continue
    return False


def _product_len(choices: list[list[int]]) -> int:
    n = 1
    for c in choices:
        n *= len(c)
    return n


def _divides_by_variable(e: Expr) -> bool:
    if e[0] in ("floordiv", "mod", "div", "rem") and not (e[2][0] == "int" and e[2][1]):
        return True
    return any(_divides_by_variable(x) for x in e[1:] if isinstance(x, tuple))


def _dim_goals(idx: ir.Index, extent: Expr, facts: Facts) -> list[Expr] | None:
    if isinstance(idx.start, ir.Value) and idx.start.shape != ():
        return None        # gather/scatter positions: one per element, checked per element
    start = facts.of(idx.start)
    if start is None:
        return None
    size = 1 if idx.size is None else idx.size
    return [("<=", ("int", 0), start), ("<=", ("+", start, ("int", size)), extent)]


def _check_op(op: ir.Op, facts: Facts, bufs: dict[str, ir.Buffer],
              provers: _Provers) -> ir.Op:
    masks, proofs = [], []
    for attr, region in sorted(op.attrs.items()):
        if not isinstance(region, ir.Region) or bufs[region.buffer].scope != "global":
            continue
        kept = []
        for d, (idx, n) in enumerate(zip(region.index, bufs[region.buffer].shape)):
            goals = _dim_goals(idx, facts.size(n), facts)
            by = None if goals is None else [provers.prove(g, facts) for g in goals]
            if by is None or None in by:
                kept.append(d)
            else:
                proofs.append((attr, d, max(by, key=_PROVERS.index)))   # the strongest needed
        masks.append((attr, tuple(kept)))
    if not masks:
        return op
    return op.with_notes(masks=tuple(masks), bounds_proofs=tuple(proofs))


def _walk(body: Sequence[ir.Stmt], facts: Facts, bufs: dict[str, ir.Buffer],
          provers: _Provers) -> list[ir.Stmt]:
    out: list[ir.Stmt] = []
    for stmt in body:
        if isinstance(stmt, ir.For):
            start, extent = facts.of(stmt.start), facts.of(stmt.extent)
            start = facts.unknown() if start is None else start
            extent = facts.unknown() if extent is None else extent
            v = facts.unknown()
            facts.exprs[stmt.var.id] = v
            lo, n = interval(start, facts.ranges), interval(extent, facts.ranges)
            if lo is not None and n is not None:
                facts.ranges[v[1]] = (lo[0], lo[1] + max(n[1], 1) - 1)
            inner = dataclasses.replace(facts, conds=facts.conds + [
                ("<=", start, v), ("<", v, ("+", start, extent))])
            out.append(dataclasses.replace(stmt, body=_walk(stmt.body, inner, bufs, provers)))
            facts.fresh = inner.fresh
        elif isinstance(stmt, ir.If):
            cond = facts.of(stmt.cond)
            branches = []
            for body_, known in ((stmt.then, cond), (stmt.otherwise, cond and ("not", cond))):
                inner = dataclasses.replace(facts, conds=facts.conds + ([known] if known else []))
                branches.append(_walk(body_, inner, bufs, provers))
                facts.fresh = inner.fresh
            out.append(dataclasses.replace(stmt, then=branches[0], otherwise=branches[1]))
        elif isinstance(stmt, ir.While):
            # Nothing is known of the loop's state: values read in it are unknowns.
            cond = _walk(stmt.cond, facts, bufs, provers)
            out.append(dataclasses.replace(stmt, cond=tuple(cond),
                                           body=tuple(_walk(stmt.body, facts, bufs, provers))))
        else:
            define(stmt, facts)
            out.append(_check_op(stmt, facts, bufs, provers))
    return out


def check_bounds(kernel: ir.Kernel) -> ir.Kernel:
    """The kernel with ``notes["masks"]`` (and ``notes["bounds_proofs"]``) on every op that
    accesses global memory; see the module docstring."""
    facts = Facts(exprs={}, conds=[], syms=set(), ranges={})
    for b in kernel.buffers:
        for n in b.shape:
            facts.size(n)
    for v, n in zip(kernel.block_indices, kernel.grid):
        facts.exprs[v.id] = b = ("sym", f"_b{len(facts.exprs)}")
        facts.conds += [("<=", ("int", 0), b), ("<", b, facts.size(n))]
        if isinstance(n, int):
            facts.ranges[b[1]] = (0, n - 1)
    bufs = {b.name: b for b in kernel.buffers}
    return dataclasses.replace(kernel, body=tuple(_walk(kernel.body, facts, bufs, _Provers())))


def kept_masks(kernel: ir.Kernel) -> list[str]:
    """One line per access that keeps a check after :func:`check_bounds`, e.g.
    ``copy src=x dims (0,)  # user.py:12``."""
    out = []
    for stmt in ir.walk(kernel.body):
        if not isinstance(stmt, ir.Op):
            continue
        for attr, dims in stmt.notes.get("masks", ()):
            if dims:
                line = f"  # {stmt.line}" if stmt.line else ""
                out.append(f"{stmt.kind} {attr}={stmt.attrs[attr].buffer} dims {dims}{line}")
    return out
