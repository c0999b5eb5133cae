"""Elementwise addition of two vectors."""

from __future__ import annotations

import jaxtile as jt

from . import _checks


@jt.kernel(threads=128, sharding=jt.ShardRule("n, n -> n", parallel="n"))
def add(x, y, *, block=1024):
    """``x + y`` for 1-D arrays of one shape and dtype; any length (the tail is masked).

    >>> jt.ops.add(jnp.ones(5), jnp.ones(5))          # doctest: +SKIP
    """
    _checks.rank("add", "x", x, 1)
    _checks.same_shape("add", x=x, y=y)
    _checks.same_dtype("add", x=x, y=y)
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, block))
    xs = jt.fragment((block,), x.dtype)
    ys = jt.fragment((block,), y.dtype)
    jt.copy(x.at[i * block], xs)
    jt.copy(y.at[i * block], ys)
    xs[...] = xs[...] + ys[...]
    jt.copy(xs, out.at[i * block])
    return out
