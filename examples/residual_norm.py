"""Residual add + RMS norm (or layer norm), fused: the step between two blocks of a
pre-norm transformer.

``h = x + residual`` is written out (the next residual) and normalised in the same pass over
the row, so the sum is read from memory once instead of twice.

    python examples/residual_norm.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxtile as jt


@jt.kernel(threads=128)
def add_norm(x, residual, w, *, kind="rms", eps=1e-6, rows=4):
    """``(h, norm(h) * w)`` with ``h = x + residual`` for ``x``, ``residual`` (tokens,
    features) and ``w`` (features,). ``kind="rms"``: ``h / sqrt(mean(h^2) + eps)``;
    ``kind="layer"``: ``(h - mean(h)) / sqrt(var(h) + eps)``. Sums in float32; both results
    in ``x.dtype``. ``rows`` rows per block, each held whole (features up to a few
    thousand)."""
    if kind not in ("rms", "layer"):
        raise ValueError(f"add_norm: kind must be 'rms' or 'layer', got {kind!r}")
    n, d = x.shape
    h_out = jt.empty((n, d), x.dtype)
    y_out = jt.empty((n, d), x.dtype)
    r = jt.grid(jt.cdiv(n, rows))
    a = jt.fragment((rows, d), jnp.float32)
    b = jt.fragment((rows, d), jnp.float32)
    w_t = jt.fragment((d,), jnp.float32)
    jt.copy(x.at[r * rows, 0], a)
    jt.copy(residual.at[r * rows, 0], b)
    jt.copy(w.at[0], w_t)
    h = a[...] + b[...]
    a[...] = h
    jt.copy(a, h_out.at[r * rows, 0])           # rows past the end are dropped
    if kind == "layer":
        h = h - jnp.mean(h, axis=1, keepdims=True)
    b[...] = h * jax.lax.rsqrt(jnp.mean(h * h, axis=1, keepdims=True) + eps) * w_t[...]
    jt.copy(b, y_out.at[r * rows, 0])
    return h_out, y_out


def add_norm_jnp(x, residual, w, kind="rms", eps=1e-6):
    """The same in plain jnp, to check the kernel against."""
    h = x.astype(jnp.float32) + residual.astype(jnp.float32)
    if kind == "rms":
        y = h / jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
    else:
        y = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + eps)
    return h.astype(x.dtype), (y * w).astype(x.dtype)


def main() -> None:
    kx, kr, kw = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (37, 256))
    res = jax.random.normal(kr, (37, 256))
    w = 1 + jax.random.normal(kw, (256,)) / 10
    for kind in ("rms", "layer"):
        h, y = jax.jit(lambda x, r, w, kind=kind: add_norm(x, r, w, kind=kind))(x, res, w)
        h_ref, y_ref = add_norm_jnp(x, res, w, kind)
        err = max(float(jnp.max(jnp.abs(h - h_ref))), float(jnp.max(jnp.abs(y - y_ref))))
        print(f"residual add + {kind} norm: max |jaxtile - jnp| = {err:.2e}")
        if not err < 1e-5:
            raise SystemExit(f"FAILED: add + {kind} norm differs from jnp by {err}")
    print("OK")


if __name__ == "__main__":
    main()
