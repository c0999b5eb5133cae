"""Outputs updated atomically, and flags, start as zeros: give each an ``init`` buffer.

Compiled outputs are otherwise uninitialised, and no block may clear an output that other
blocks update at the same time, or a flag other blocks may read before its block sets it.
So the initial contents come from the caller: for every output that an ``atomic`` op
updates, a ``store_release`` publishes or a ``load_acquire`` reads (and, in a kernel with a
``fence``, whose flags are plain accesses, every output the kernel reads), the pass adds a
global ``init`` buffer aliasing it (``Buffer.aliases``); the platform's lowering passes
zeros there, in the output's own memory (XLA's operand-output aliasing), so the kernel
starts from zeros, as the reference semantics do.
"""

from __future__ import annotations

import dataclasses

from .. import ir, op_defs


def add_output_inits(kernel: ir.Kernel) -> ir.Kernel:
    """Add an ``init`` buffer (named ``<output>_init``) for each output an ``atomic`` or
    ``store_release`` op writes or a ``load_acquire`` reads, and if the kernel has a
    ``fence``, for each output it reads. Assumes a verified kernel; guarantees
    ``kernel.params`` lists inputs, inits, outputs."""
    ops = [s for s in ir.walk(kernel.body) if isinstance(s, ir.Op)]
    targets = {op.attrs["src" if op.kind == "load_acquire" else "dst"].buffer for op in ops
               if op.kind in ("atomic", "store_release", "load_acquire")}
    if any(op.kind == "fence" for op in ops):
        targets |= {r.buffer for op in ops for r in op_defs.reads(op)}
    inits = tuple(ir.Buffer(f"{b.name}_init", b.shape, b.dtype, "global", "init", b.line,
                            aliases=b.name)
                  for b in kernel.buffers if b.role == "output" and b.name in targets)
    return dataclasses.replace(kernel, buffers=kernel.buffers + inits) if inits else kernel
