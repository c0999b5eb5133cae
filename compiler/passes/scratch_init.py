"""Scratch buffers start as zeros in every block, as in the reference semantics.

Zeroing costs a fill per block, so it is inserted only where it can matter: for a scratch
buffer that some statement may read before a store or copy of the whole buffer earlier in
the same statement list (or an enclosing one) has overwritten it. Such a write inside a loop
body covers the reads after it in that body, but not the code after the loop (the loop may
run zero times); one in both branches of a conditional covers the code after it (branch
results are stored so, see ``from_jaxpr``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import ir, op_defs


def _overwritten(stmt: ir.Stmt, scratch: dict[str, ir.Buffer]) -> list[str]:
    if not isinstance(stmt, ir.Op):
        return []
    return [r.buffer for r in op_defs.writes(stmt)
            if r.buffer in scratch and r.is_whole(scratch[r.buffer].shape)]


def _scan(body: tuple[ir.Stmt, ...], defined: set[str], scratch: dict[str, ir.Buffer],
          needed: list[str]) -> None:
    """Record in ``needed`` the scratch buffers read in ``body`` before a whole write in the
    same or an enclosing statement list; a loop body or branch sees the writes before it,
    but its own writes do not leave it, except those that both branches of an If make."""
    for stmt in body:
        if isinstance(stmt, ir.For):
            _scan(stmt.body, set(defined), scratch, needed)
        elif isinstance(stmt, ir.If):
            then, otherwise = set(defined), set(defined)
            _scan(stmt.then, then, scratch, needed)
            _scan(stmt.otherwise, otherwise, scratch, needed)
            defined |= then & otherwise
        elif isinstance(stmt, ir.While):
            for block in ir.blocks(stmt):
                _scan(block, set(defined), scratch, needed)
        else:
            for name in sorted({r.buffer for r in op_defs.reads(stmt)}):
                if name in scratch and name not in defined and name not in needed:
                    needed.append(name)
            defined.update(_overwritten(stmt, scratch))


def zero_uninitialised_scratch(kernel: ir.Kernel) -> ir.Kernel:
    """Insert a zero fill at the start of the body for each scratch buffer that may be read
    before being wholly written (see module doc). Assumes a verified kernel."""
    scratch = {b.name: b for b in kernel.buffers if b.role == "scratch"}
    needed: list[str] = []
    _scan(kernel.body, set(), scratch, needed)
    fills: list[ir.Stmt] = []
    for name in needed:
        buf = scratch[name]
        zero = ir.Value((), buf.dtype)
        tile = ir.Value(buf.shape, buf.dtype)
        fills += [ir.Op("const", (), zero, {"value": np.zeros((), buf.dtype).item()}, buf.line),
                  ir.Op("broadcast", (zero,), tile, {"dims": ()}, buf.line),
                  ir.Op("store", (tile,), None, {"dst": ir.whole(name, buf.shape)}, buf.line)]
    return dataclasses.replace(kernel, body=(*fills, *kernel.body)) if fills else kernel
