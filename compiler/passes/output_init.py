"""Outputs updated atomically start as zeros: give each an ``init`` buffer.

Compiled outputs are otherwise uninitialised, and no block may clear an output that other
blocks update at the same time. So the initial contents come from the caller: for every
output that an ``atomic`` op updates, the pass adds a global ``init`` buffer aliasing it
(``Buffer.aliases``); the platform's lowering passes zeros there, in the output's own
memory (XLA's operand-output aliasing), so the kernel starts from zeros, as the reference
semantics do.
"""

from __future__ import annotations

import dataclasses

from .. import ir


def add_output_inits(kernel: ir.Kernel) -> ir.Kernel:
    """Add an ``init`` buffer (named ``<output>_init``) for each output an ``atomic`` op
    writes. Assumes a verified kernel; guarantees ``kernel.params`` lists inputs, inits,
    outputs."""
    targets = {op.attrs["dst"].buffer for op in ir.walk(kernel.body)
               if isinstance(op, ir.Op) and op.kind == "atomic"}
    inits = tuple(ir.Buffer(f"{b.name}_init", b.shape, b.dtype, "global", "init", b.line,
                            aliases=b.name)
                  for b in kernel.buffers if b.role == "output" and b.name in targets)
    return dataclasses.replace(kernel, buffers=kernel.buffers + inits) if inits else kernel
