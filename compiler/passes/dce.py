"""Dead-code elimination on Tile IR."""

from __future__ import annotations

import dataclasses

from .. import ir, op_defs


def _used_values(body: tuple[ir.Stmt, ...]) -> set[int]:
    return {v.id for stmt in ir.walk(body) for v in ir.uses(stmt)}


def _prune(body: tuple[ir.Stmt, ...], live: set[int]) -> tuple[list[ir.Stmt], bool]:
    out, changed = [], False
    for stmt in body:
        if isinstance(stmt, ir.Op):
            if op_defs.is_pure(stmt) and stmt.result.id not in live:
                changed = True
                continue
            out.append(stmt)
        else:
            pruned = [_prune(block, live) for block in ir.blocks(stmt)]
            changed |= any(c for _, c in pruned)
            blocks = [block for block, _ in pruned]
            # A While is kept even when empty: whether it terminates is part of the program.
            if isinstance(stmt, ir.While) or any(blocks):
                out.append(ir.with_blocks(stmt, blocks))
            else:
                changed = True
    return out, changed


def eliminate_dead_code(kernel: ir.Kernel) -> ir.Kernel:
    """Remove pure ops whose results are never used, and loops/conditionals left empty.

    Assumes a verified kernel. Guarantees every remaining pure op's result has a use; ops
    that are not pure by their definition (store, copy, gemm) are kept.
    """
    body, changed = kernel.body, True
    while changed:
        body, changed = _prune(body, _used_values(body))
    return dataclasses.replace(kernel, body=body)
