"""Flash attention: ``softmax(q @ k.T * scale + mask) @ v`` without the (T, S) scores.

:func:`attention` is the entry point. Its kernel, :func:`attention_fwd`, walks the K/V
tiles a block of queries can see with an online softmax and also returns each row's
log-sum-exp, from which the backward kernels (:mod:`.attention_bwd`) and the forward-mode
rule recompute the probabilities tile by tile. Grouped-query attention indexes the K/V head
``h // (H // Hkv)`` from the query head ``h``: K and V are never repeated in memory. On a
target with TMA, wgmma and ``setmaxnreg`` (``cuda:sm_90a``) :func:`attention` runs the same
body as :func:`attention_fwd_ws`, FlashAttention-3 style (:func:`uses_warp_specialised`).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

import jaxtile as jt

from . import attention_bwd
from .attention_mask import (
    attention_scale,
    check_qkv,
    kv_range,
    n_keys,
    positions,
    visible,
    window_pair,
)


def _forward(q, k, v, lengths, *, causal, scale, window, bm, bn, stages):
    """The body both forward kernels trace (:func:`attention_fwd`, :func:`attention_fwd_ws`):
    ``bm`` queries of one head against the ``bn``-key tiles they can see, with an online
    softmax; ``(out, lse)``."""
    group, seq = check_qkv("attention", q, k, v, lengths)
    window = window_pair(window)
    batch, heads, t_len, d = q.shape
    scale = attention_scale(scale, d)
    out = jt.empty(q.shape, q.dtype)
    lse = jt.empty((batch, heads, t_len), jnp.float32)
    bx, h, b = jt.grid(jt.cdiv(t_len, bm), heads, batch)
    hk = h // group
    q_s = jt.shared((bm, d), q.dtype)
    k_s = jt.shared((bn, d), k.dtype)
    v_s = jt.shared((bn, d), v.dtype)
    s = jt.fragment((bm, bn), jnp.float32)
    p = jt.fragment((bm, bn), v.dtype)
    acc = jt.fragment((bm, d), jnp.float32)
    m_i = jt.fragment((bm,), jnp.float32)
    l_i = jt.fragment((bm,), jnp.float32)
    o = jt.fragment((bm, d), q.dtype)
    jt.copy(q.at[b, h, bx * bm, 0], q_s)
    acc[...] = jnp.zeros((bm, d), jnp.float32)
    m_i[...] = jnp.full((bm,), -jnp.inf, jnp.float32)
    l_i[...] = jnp.zeros((bm,), jnp.float32)
    keys = n_keys(lengths, b, seq)
    first, stop = kv_range(bx * bm, bm, keys, bn, causal=causal, window=window)

    @jt.pipelined(stop - first, stages=stages)
    def _(i):
        j = first + i
        jt.copy(k.at[b, hk, j * bn, 0], k_s)
        jt.copy(v.at[b, hk, j * bn, 0], v_s)
        s[...] = jnp.zeros((bm, bn), jnp.float32)
        jt.gemm(q_s, k_s, s, transpose_b=True)
        rows, cols = positions(bx * bm, j * bn, (bm, bn))
        keep = visible(rows, cols, keys, causal=causal, window=window)
        sv = jnp.where(keep, s[...] * scale, -jnp.inf)
        m_old = m_i[...]
        m_new = jnp.maximum(m_old, jnp.max(sv, axis=1))
        # A row that has seen no key yet keeps m = -inf; subtract 0 instead (its p are 0).
        m_sub = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        pe = jnp.exp(sv - m_sub[:, None])
        alpha = jnp.exp(m_old - m_sub)
        l_i[...] = l_i[...] * alpha + jnp.sum(pe, axis=1)
        acc[...] = acc[...] * alpha[:, None]
        p[...] = pe.astype(v.dtype)
        jt.gemm(p, v_s, acc)
        m_i[...] = m_new

    lv = l_i[...]
    # Only a row that saw no key has l == 0; testing `l > 0` instead would also turn a NaN
    # (from a NaN or inf in q, k or scale) into 0 where jax.nn.dot_product_attention gives NaN.
    o[...] = jnp.where(lv[:, None] == 0, 0.0, acc[...] / lv[:, None]).astype(q.dtype)
    jt.copy(o, out.at[b, h, bx * bm, 0])
    l_i[...] = jnp.where(lv == 0, -jnp.inf, m_i[...] + jnp.log(lv))
    jt.copy(l_i, lse.at[b, h, bx * bm])
    return out, lse


@jt.kernel(threads=128)
def attention_fwd(q, k, v, lengths, *, causal=False, scale=None, window=None, bm=64, bn=64,
                  stages=2):
    """``(out, lse)`` of attention for ``q`` (B, H, T, D), ``k`` and ``v`` (B, Hkv, S, D)
    and the key counts ``lengths`` (B,) int32; ``window`` is None, ``(left, right)`` or an
    int ``w`` for ``(w, w)``.

    ``out`` (B, H, T, D) in ``q.dtype``; ``lse`` (B, H, T) float32, the log-sum-exp of each
    row's scaled scores (``-inf`` for a row that sees no key, whose ``out`` is 0; NaN and
    inf scores propagate to ``out`` and ``lse`` as NaN). A block
    handles ``bm`` queries of one head against tiles of ``bn`` keys; scores and the softmax
    are float32, probabilities are cast to ``v.dtype`` for the product with ``v``. On CUDA
    the K/V tiles come through a ``stages``-deep ``cp.async`` pipeline (a TMA ring where the
    target has TMA and the shapes allow).
    """
    return _forward(q, k, v, lengths, causal=causal, scale=scale, window=window, bm=bm,
                    bn=bn, stages=stages)


@jt.kernel(threads=256)
def attention_fwd_ws(q, k, v, lengths, *, causal=False, scale=None, window=None, bm=128,
                     bn=128, stages=2):
    """:func:`attention_fwd` as FlashAttention-3 runs it on Hopper: the same body over
    256 threads, two consumer warpgroups that each own 64 of the block's 128 query rows
    (the gemm planner splits ``S = Q K^T`` and ``P V`` by rows, so each row's max and sum
    stay inside one warpgroup). Where the target has TMA, wgmma and ``setmaxnreg``
    (``cuda:sm_90a``), K and V come through a TMA ring of their 4-D operands and the
    warp-specialisation pass adds the producer warpgroup that issues it (384 threads);
    shapes TMA cannot take (rows that are not 16-byte multiples) keep the ``cp.async``
    ring. :func:`attention` picks this kernel where :func:`uses_warp_specialised` says so.
    """
    return _forward(q, k, v, lengths, causal=causal, scale=scale, window=window, bm=bm,
                    bn=bn, stages=stages)


WS_HEAD_DIMS = (64, 128)
"""Head dims :func:`attention_fwd_ws` takes with its 128 x 128 tiles: ``P @ V``'s wgmma over
one column of warpgroups has N = D (64, 128 or 256), and Q with two stages of K and V fit
Hopper's 227 KiB of shared memory up to D = 128 (160 KiB there; D = 256 would need 64-key
tiles, left to the 128-thread kernel for now)."""


def uses_warp_specialised(target: Any, dtype: Any, head_dim: int, *, block_k: int = 128,
                          stages: int = 2) -> bool:
    """Whether :func:`attention` runs :func:`attention_fwd_ws` for ``target`` (a compiler
    :class:`~jaxtile.compiler.target.Target`): by capabilities, a CUDA target with TMA,
    wgmma and ``setmaxnreg``, 16-bit operands (float32's ``P @ V`` has no register-A wgmma)
    with ``head_dim`` in :data:`WS_HEAD_DIMS` whose rows TMA can load (16-byte multiples),
    ``block_k`` keys per tile that ``S = Q K^T``'s wgmma takes as its N (64 or 128), and Q
    with ``stages`` K/V tiles within the target's shared memory. Every other target and
    shape keeps :func:`attention_fwd`."""
    caps = target.caps
    size = jnp.dtype(dtype).itemsize
    return (target.kind == "cuda" and bool(getattr(caps, "tma", False))
            and bool(getattr(caps, "wgmma", False)) and bool(getattr(caps, "setmaxnreg", False))
            and size == 2 and head_dim in WS_HEAD_DIMS and head_dim * size % 16 == 0
            and block_k in (64, 128)
            # (1 KiB left for the ring's mbarriers and the tiles' alignment)
            and (128 + 2 * stages * block_k) * head_dim * size <= caps.max_smem_bytes - 1024)


def default_tiles(dtype: Any, head_dim: int, smem_bytes: int | None = None, *,
                  q_tiles: int = 1, kv_tiles: int = 4, score_tiles: int = 0) -> tuple[int, int]:
    """``(block_q, block_k)`` of :func:`attention` for operands of ``dtype`` and ``head_dim``,
    within ``smem_bytes`` of shared memory per block when given (a GPU target's). A kernel
    keeps ``q_tiles`` ``[block_q, head_dim]`` and ``kv_tiles`` ``[block_k, head_dim]`` tiles
    of ``dtype`` and ``score_tiles`` float32 ``[block_q, block_k]`` ones in shared memory:
    the forward kernel Q, and K and V in two pipeline stages; the backward kernels
    (:data:`BACKWARD_TILES`) others.

    Chosen so that the CUDA kernel (128 threads, 255 registers each at most) does not spill:
    float32 operands (tf32 products) need twice the registers of 16-bit ones for the
    probabilities and K/V fragments, and spilled 100 bytes at 64 x 64 (D = 64); 64 x 32
    (D <= 64) and 32 x 32 (D = 128, which also fits the 99 KiB of shared memory of sm_86/89/
    120/121 in two stages) use at most 150 registers
    (``tests/compiler/cuda/test_attention_registers.py``).
    """
    if jnp.dtype(dtype) == jnp.float32:
        bm, bn = (64, 32) if head_dim <= 64 else (32, 32)
    else:
        bm, bn = 64, 64
    if smem_bytes is not None:
        # The tiles must fit the block's shared memory (AMD's 64 KiB of LDS does not hold
        # 64 x 64 at D = 128): fewer keys per tile first, which keeps the queries a block
        # shares its K/V reads between.
        def need(bm: int, bn: int) -> int:
            return ((q_tiles * bm + kv_tiles * bn) * head_dim * jnp.dtype(dtype).itemsize
                    + score_tiles * bm * bn * 4)

        while need(bm, bn) > smem_bytes and bn > 16:
            bn //= 2
        while need(bm, bn) > smem_bytes and bm > 16:
            bm //= 2
    return bm, bn


BACKWARD_TILES = {"attention_dq": (2, 2, 0, 1), "attention_dkdv": (2, 2, 2, 2),
                  "attention_jvp": (2, 4, 0, 2)}
"""The shared tiles each backward kernel keeps (no pipeline): ``[block_q, D]`` and
``[block_k, D]`` ones (``dq`` Q and dO, K and V; ``dkdv`` the same; the JVP Q and its
tangent, K, V and theirs), and the float32 ``[block_q, block_k]`` scratch the GPU lowering
adds for 16-bit and for float32 operands: a score tile a gemm reads transposed (``dkdv``'s
``P^T`` and ``dS^T``) or, at float32, as its register A operand (no matrix instruction takes
a float32 register operand). Measured from the lowered kernels for gfx942
(``tests/compiler/hip/test_hip_attention_tiles.py`` lowers each with the chosen tiles).
:func:`default_tiles` fits them to the target's shared memory (``jaxtile/ops/_tiles.py``'s
rule for these kernels)."""


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None,
              lengths: Any = None, window: int | tuple[int, int] | None = None,
              return_lse: bool = False, block_q: int | None = None,
              block_k: int | None = None, stages: int = 2) -> Any:
    """Multi-head attention ``softmax(q @ k.T * scale + mask) @ v`` as a flash kernel.

    Args:
      q: queries, (batch, heads, T, head_dim), float32, bfloat16 or float16.
      k, v: keys and values, (batch, kv_heads, S, head_dim), q's dtype; ``heads`` must be
        a multiple of ``kv_heads`` (grouped-query attention: query head ``h`` reads K/V head
        ``h // (heads // kv_heads)``, with no copy of K/V).
      causal: query ``i`` sees keys ``j <= i``.
      scale: the score scale; default ``1 / sqrt(head_dim)``.
      lengths: optional int32 (batch,): sequence ``b`` has ``lengths[b]`` valid keys (the
        rest is padding). A query that sees no key gets 0 and a log-sum-exp of ``-inf``:
        its softmax is over no key, so it has no value of its own; 0 is what a split of
        the keys that holds none contributes when partial results are merged by their
        log-sum-exp, and it carries nothing from keys the query must not see
        (``jax.nn.dot_product_attention`` with ``implementation="xla"`` returns the
        average of all of V there instead).
      window: optional sliding window: query ``i`` sees keys ``i - left <= j <= i + right``
        for ``window=(left, right)``; an int ``w`` is ``(w, w)``.
      return_lse: also return the float32 log-sum-exp of each row's scores, (batch, heads,
        T).
      block_q, block_k: the query and key tile sizes (default: the stored tile table's
        for these shapes, else :func:`default_tiles`; passing one passes over the table).
      stages: how many K/V tiles the CUDA kernel keeps in flight (its ``cp.async``
        pipeline or TMA ring; the backward kernels do not use it).

    On ``cuda:sm_90a`` (by capabilities: TMA, wgmma, ``setmaxnreg``) 16-bit operands with
    head_dim 64 or 128 run :func:`attention_fwd_ws` (two consumer warpgroups, K/V through a
    TMA ring a producer warpgroup fills) unless the tiles asked for do not fit it
    (:func:`uses_warp_specialised`); everything else runs :func:`attention_fwd`.

    Returns ``out`` (batch, heads, T, head_dim) in q's dtype, or ``(out, lse)``. A NaN or
    infinite score (from q, k or scale) makes its row NaN, as in
    ``jax.nn.dot_product_attention``; a NaN in v reaches the rows that see its key.
    Differentiable in q, k and v in both modes (``jax.grad``, ``jax.jvp``) by jaxtile
    kernels, and batched by ``jax.vmap`` as one kernel with a larger grid.

    >>> out = jt.ops.attention(q, k, v, causal=True)          # doctest: +SKIP
    """
    if lengths is None:
        lengths = jnp.full((q.shape[0],), k.shape[2] if jnp.ndim(k) == 4 else 0, jnp.int32)
    # q is checked by the kernel (check_qkv), which names what is wrong. Tiles left out
    # come from the stored tile table, else default_tiles (jaxtile/ops/_tiles.py).
    tiles = {name: size for name, size in (("bm", block_q), ("bn", block_k))
             if size is not None}
    kernel = attention_fwd
    if block_q in (None, 128) and jnp.ndim(q) == 4 and hasattr(q, "dtype"):
        from ._tiles import active_target

        # Chosen at trace time for the target the call compiles for (the kernel's threads
        # are fixed: docs/design.md, "FlashAttention-3-style forward").
        if uses_warp_specialised(active_target(), q.dtype, q.shape[-1],
                                 block_k=block_k or 128, stages=stages):
            kernel = attention_fwd_ws
    out, lse = kernel(q, k, v, lengths, causal=bool(causal), scale=scale, window=window,
                      stages=stages, **tiles)
    return (out, lse) if return_lse else out


def _forward_rule(kernel):
    """The reverse-mode rule's forward half for either forward kernel: the outputs, and
    what the backward kernels need."""
    def fwd(q, k, v, lengths, **params):
        out, lse = kernel(q, k, v, lengths, **params)
        return (out, lse), (q, k, v, lengths, out, lse)
    return fwd


def _backward_params(params):
    """The backward kernels' parameters: the call's own tiles only. Tiles the call left out
    are chosen by each backward kernel's rule for the target it compiles for (their shared
    tiles differ from the forward kernel's, and a trace does not know the targets it will
    be lowered for)."""
    params = dict(params)
    params.pop("stages", None)
    return params


def _bwd(res, cts, **params):
    q, k, v, lengths, out, lse = res
    g_out, g_lse = cts
    dq, dk, dv = attention_bwd.attention_grads(q, k, v, lengths, out, lse,
                                               g_out.astype(q.dtype), g_lse,
                                               **_backward_params(params))
    return dq, dk, dv, None


def _jvp(args, outs, tangents, **params):
    q, k, v, lengths = args
    tq, tk, tv, _ = tangents
    out, lse = outs
    return attention_bwd.attention_jvp(q, k, v, lengths, out, lse, tq.astype(q.dtype),
                                       tk.astype(k.dtype), tv.astype(v.dtype),
                                       **_backward_params(params))


attention_fwd.defvjp(_forward_rule(attention_fwd), _bwd)
attention_fwd.defjvp(_jvp)
attention_fwd_ws.defvjp(_forward_rule(attention_fwd_ws), _bwd)
attention_fwd_ws.defjvp(_jvp)
