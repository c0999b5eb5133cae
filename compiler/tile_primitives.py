"""Names of the tile-language primitives that kernel bodies bind.

The primitives themselves (abstract evaluation, reference semantics) live in
``jaxtile.primitives.tile_ops``; the converter recognises them in traced bodies by these
names. Both import them from here, the lower layer.
"""

COPY = "jt_copy"
"""``jt_copy(src, dst, *starts, src_sizes, dst_sizes, pad)``: a masked tile copy."""
GEMM = "jt_gemm"
"""``jt_gemm(a, b, c, *starts, a_sizes, b_sizes, c_sizes, transpose_a, transpose_b)``:
``c += op(a) @ op(b)`` on regions of on-chip tiles."""
LOOP_INFO = "jt_loop_info"
"""An identity on a loop index that records the loop's kind and pipeline stages."""
ATOMIC = "jt_atomic"
"""``jt_atomic(dst, value, *starts, fn, sizes)``: ``dst[region] = fn(dst[region], value)``
element by element, atomically (``fn``: add, max, min); writes past a global edge are
dropped."""
LOAD_ACQUIRE = "jt_load_acquire"
"""``jt_load_acquire(src, *starts)``: one element of a global buffer, read with acquire
ordering (later reads of this block see what the writer of that value wrote before it)."""
STORE_RELEASE = "jt_store_release"
"""``jt_store_release(dst, value, *starts)``: one element of a global output written with
release ordering (the block's earlier writes are visible before it)."""
FENCE = "jt_fence"
"""``jt_fence(*outputs)``: orders the block's global memory accesses before it against those
after it (the operands, the kernel's outputs, only keep it in the trace)."""
PRINT = "jt_print"
"""``jt_print(when, *tag, *values, text)``: when ``when`` holds, one line: the block's tag
(its indices ``tag``) and ``text`` (literal pieces) interleaved with the scalar ``values``."""
