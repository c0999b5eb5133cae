"""The contiguous_gathers pass: index tiles of the form ``s + iota`` become copy windows
starting at ``s``; other index tiles stay gathers."""

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt
from jaxtile.compiler import ir


@jt.kernel
def _windows(x, idx, *, n=8):
    """Rows of x gathered by positions i * n + arange(n) (consecutive) and by the positions
    read from idx (not), scattered back by consecutive positions."""
    out = jt.empty((2, x.shape[0]), x.dtype)
    i = jt.grid(jt.cdiv(x.shape[0], n))
    near = jt.fragment((n,), x.dtype)
    jt.gather(x, i * n + jnp.arange(n, dtype=jnp.int32), near, pad=-1.0)
    far = jt.fragment((n,), x.dtype)
    jt.gather(x, idx[jt.ds(i * n, n)], far, pad=-1.0)
    jt.scatter(near, i * n + 1 + jnp.arange(n, dtype=jnp.int32) - 1, out.at[0])
    jt.scatter(far, jnp.arange(n, dtype=jnp.int32) + i * n, out.at[1])
    return out


def _index_tiles(kernel_ir):
    return [i for s in ir.walk(kernel_ir.body) if isinstance(s, ir.Op) and s.kind == "copy"
            for r in ir.regions(s) for i in r.index
            if isinstance(i.start, ir.Value) and i.start.shape != ()]


def test_consecutive_positions_become_windows(rng):
    x = jnp.asarray(rng.standard_normal(21), jnp.float32)          # a ragged last block
    idx = jnp.asarray(rng.permutation(24) - 1, jnp.int32)          # -1 and 21, 22 pad
    kernel_ir = _windows._specialise((x, idx), {}).tile_ir
    assert len(_index_tiles(kernel_ir)) == 1      # only the gather of the positions in idx
    safe = np.where((idx >= 0) & (idx < 21), idx, 21)
    want = np.stack([np.asarray(x), np.concatenate([np.asarray(x), [-1.0]])[safe][:21]])
    np.testing.assert_array_equal(jax.jit(_windows)(x, idx), want)
    np.testing.assert_array_equal(_windows.reference(x, idx), want)
