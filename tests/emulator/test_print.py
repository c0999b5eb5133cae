"""``jt.print`` in the SIMT emulator (the generated CUDA compiled by g++ against the
emulator's device header): each block's line once, from its thread 0, with the text the CPU
and the reference print. ``tests/jaxtile/test_language_print.py`` runs the rest of the cases
there under ``-m slow``."""

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt


@jt.kernel(threads=64)
def _col_sums(x):
    out = jt.empty((x.shape[1],), jnp.float32)
    j = jt.grid(x.shape[1] // 8)
    t = jt.fragment((x.shape[0], 8), jnp.float32)
    jt.copy(x.at[:, jt.ds(j * 8, 8)], t)
    s = jnp.sum(t[...], axis=0)
    jt.print("cols {} sum {} first {}", j * 8, jnp.sum(s), s[0] > 0, when=j != 1)
    out[jt.ds(j * 8, 8)] = s
    return out


def test_each_block_prints_once_from_thread_zero(emulator, capfd):
    x = jnp.asarray(np.arange(16 * 32, dtype=np.float32).reshape(16, 32) / 8 - 20.0)
    capfd.readouterr()
    got = jax.block_until_ready(jax.jit(_col_sums)(x))
    lines = sorted(ln for ln in capfd.readouterr().out.splitlines() if ln.startswith("["))
    sums = np.asarray(jnp.sum(x, axis=0))
    want = sorted(f"[block {j}] cols {j * 8} sum {float(sums[j * 8:j * 8 + 8].sum()):g} "
                  f"first {sums[j * 8] > 0}" for j in (0, 2, 3))
    assert lines == want
    np.testing.assert_allclose(got, sums, rtol=1e-6)
    np.testing.assert_allclose(got, _col_sums.reference(x), rtol=1e-6)
