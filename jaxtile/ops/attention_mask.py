"""What the attention kernels share: operand checks, and which keys a query may see.

A query at position ``i`` of sequence ``b`` sees the key at position ``j`` when ``j`` is
below the sequence's length (``lengths[b]``, the keys of a padded batch), and, with
``causal``, ``j <= i``, and, with a window ``(left, right)``, ``i - left <= j <= i + right``
(the convention of ``jax.nn.dot_product_attention``'s ``local_window_size``). The kernels
visit only the K/V tiles that hold a visible key (:func:`kv_range`) and mask the rest of a
tile (:func:`visible`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

import jaxtile as jt

from . import _checks

FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)


def attention_scale(scale: float | None, head_dim: int) -> float:
    """The score scale: ``scale``, or ``1 / sqrt(head_dim)``."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def window_pair(window: Any) -> tuple[int, int] | None:
    """``window`` as ``(left, right)``: an int ``w`` is ``(w, w)``, None is no window."""
    if window is None:
        return None
    pair = (window, window) if isinstance(window, int) else tuple(window)
    if len(pair) != 2 or not all(isinstance(w, int) and w >= 0 for w in pair):
        raise ValueError(f"attention: window must be a non-negative int or a pair (left, "
                         f"right) of them, got {window!r}")
    return pair


def check_qkv(op: str, q: Any, k: Any, v: Any, lengths: Any) -> tuple[int, int]:
    """``q`` (B, H, T, D), ``k`` and ``v`` (B, Hkv, S, D) of one floating dtype with ``H`` a
    multiple of ``Hkv``, ``lengths`` int32 (B,). Returns ``(group, S)``: Q heads per KV
    head and the key count."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _checks.rank(op, name, x, 4)
    _checks.same_shape(op, k=k, v=v)
    _checks.same_dtype(op, q=q, k=k, v=v)
    if q.dtype not in [jnp.dtype(d) for d in FLOATS]:
        raise TypeError(f"{op}: q, k and v must be float32, bfloat16 or float16, got "
                        f"{q.dtype}")
    b, h, _, d = q.shape
    if d == 0:
        raise ValueError(f"{op}: q has shape {tuple(q.shape)}: head_dim is 0 (no features "
                         "to score keys with); attention needs head_dim >= 1")
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"{op}: q has shape {tuple(q.shape)} but k has shape "
                         f"{tuple(k.shape)}; batch and head_dim must agree")
    if k.shape[1] == 0 or h % k.shape[1]:
        raise ValueError(f"{op}: the {h} query heads must be a multiple of the "
                         f"{k.shape[1]} key/value heads")
    _checks.vector(op, "lengths", lengths, b, "one length per sequence")
    if lengths.dtype != jnp.int32:
        raise TypeError(f"{op}: lengths must be int32, got {lengths.dtype}")
    return h // k.shape[1], k.shape[2]


def kv_range(row0: Any, rows: int, n_keys: Any, bn: int, *, causal: bool,
             window: tuple[int, int] | None) -> tuple[Any, Any]:
    """The K/V tiles (of ``bn`` keys) that hold a key visible from the query rows
    ``[row0, row0 + rows)`` when ``n_keys`` keys exist: ``(first, stop)``, traced
    scalars."""
    stop = jt.cdiv(n_keys, bn)
    if causal or window is not None:
        reach = 0 if causal else window[1]      # how far right of its row a query sees
        stop = jnp.minimum(stop, (row0 + rows - 1 + reach) // bn + 1)
    first = jnp.int32(0)
    if window is not None:
        first = jnp.maximum(row0 - window[0], 0) // bn
    return first, stop


def visible(rows: Any, cols: Any, n_keys: Any, *, causal: bool,
            window: tuple[int, int] | None) -> Any:
    """Whether the query at ``rows`` sees the key at ``cols`` (broadcast int32 tiles)."""
    keep = cols < n_keys
    if causal:
        keep = keep & (cols <= rows)
    if window is not None:
        keep = keep & (cols >= rows - window[0]) & (cols <= rows + window[1])
    return keep


def q_range(col0: Any, cols: int, n_queries: int, bm: int, *, causal: bool,
            window: tuple[int, int] | None) -> tuple[Any, Any]:
    """The query tiles (of ``bm`` rows) holding a query that sees one of the keys
    ``[col0, col0 + cols)``: ``(first, stop)``, the transpose of :func:`kv_range`."""
    stop = jnp.int32(jt.cdiv(n_queries, bm))
    if window is not None:
        stop = jnp.minimum(stop, (col0 + cols - 1 + window[0]) // bm + 1)
    first = jnp.int32(0)
    if causal or window is not None:
        reach = 0 if causal else window[1]
        first = jnp.maximum(col0 - reach, 0) // bm
    return first, stop


def positions(row0: Any, col0: Any, shape: tuple[int, int]) -> tuple[Any, Any]:
    """Row and column positions of a (rows, cols) tile at ``(row0, col0)``."""
    rows = row0 + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = col0 + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return rows, cols


def n_keys(lengths: Any, b: Any, seq: int) -> Any:
    """The number of keys of sequence ``b``: ``lengths[b]`` clipped to ``[0, seq]``."""
    return jnp.clip(lengths[b], 0, seq)
