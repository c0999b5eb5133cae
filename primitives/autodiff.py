"""Differentiation of ``kernel_call``: forward and reverse mode from one JVP rule.

The JVP of a kernel call computes the primal outputs (with the compiled kernel, or with the
user's ``fwd`` rule, which may also save residuals) and emits ``kernel_tangent``: a primitive
that is linear in the tangents. Evaluating it runs the user's ``jvp`` rule (``defjvp``), or
forward mode through the kernel's reference semantics (``jax.jvp`` of the body as plain JAX
ops) when there is none; transposing it runs the user's ``bwd`` rule, or reverse mode
through the reference semantics when there is none. So ``jax.grad``/``vjp``/``jacrev`` use
the backward kernels and ``jax.jvp``/``jacfwd`` the forward rule's, and both modes work
for every kernel, which a ``jax.custom_vjp`` would forbid. The linear primitive carries its two
functions, so batching it (``vmap(grad(f))``) and differentiating it again (second order) are
``jax.vmap`` and ``jax.jvp`` of those functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.interpreters import ad, batching, mlir

from jaxtile.compiler.jax_internals import Primitive

from .kernel_call import KernelHandle, kernel_call_p

kernel_tangent_p = Primitive("jaxtile_kernel_tangent")
kernel_tangent_p.multiple_results = True


class _Linear:
    """The two functions of a ``kernel_tangent``, on flat lists.

    ``jvp(primals, residuals, tangents) -> output tangents`` and
    ``vjp(primals, residuals, cotangents) -> tangent cotangents``; ``out_avals`` are the
    output tangents' types. Compared by identity: each JVP makes its own.
    """

    def __init__(self, jvp: Callable, vjp: Callable, out_avals: Sequence[Any]):
        self.jvp, self.vjp, self.out_avals = jvp, vjp, tuple(out_avals)


def _split(args: Sequence[Any], counts: tuple[int, int, int]):
    n_p, n_r, _ = counts
    return list(args[:n_p]), list(args[n_p:n_p + n_r]), list(args[n_p + n_r:])


def _evaluate(*args: Any, linear: _Linear, counts: tuple[int, int, int]) -> list[Any]:
    return list(linear.jvp(*_split(args, counts)))


def _abstract_eval(*avals: Any, linear: _Linear, counts: tuple[int, int, int]):
    del avals, counts
    return linear.out_avals


def _transpose(cts: Sequence[Any], *args: Any, linear: _Linear, counts: tuple[int, int, int]):
    primals, residuals, tangents = _split(args, counts)
    cts = [ad.instantiate_zeros(ct) for ct in cts]
    grads = linear.vjp(primals, residuals, cts)
    return [None] * (counts[0] + counts[1]) + [
        g if ad.is_undefined_primal(t) else None for g, t in zip(grads, tangents)]


def _tangent_jvp(primals: Sequence[Any], tangents: Sequence[Any], *, linear: _Linear,
                 counts: tuple[int, int, int]):
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return jax.jvp(lambda *a: _evaluate(*a, linear=linear, counts=counts), list(primals),
                   tangents)


def _tangent_batch(args: Sequence[Any], dims: Sequence[Any], *, linear: _Linear,
                   counts: tuple[int, int, int]):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    n_p, n_r, _ = counts
    # Tangents all become batched, so the transposed rule returns batched cotangents and
    # JAX sums them for any tangent that was shared across the batch.
    args = list(args)
    dims = list(dims)
    for i in range(n_p + n_r, len(args)):
        if dims[i] is None:
            args[i] = jnp.broadcast_to(args[i], (size, *jnp.shape(args[i])))
            dims[i] = 0
    p_dims, r_dims, t_dims = _split(dims, counts)

    def jvp(primals, residuals, tangents):
        return jax.vmap(linear.jvp, in_axes=(p_dims, r_dims, t_dims))(primals, residuals,
                                                                       tangents)

    def vjp(primals, residuals, cts):
        return jax.vmap(linear.vjp, in_axes=(p_dims, r_dims, 0))(primals, residuals, cts)

    out_avals = [jax.core.ShapedArray((size, *a.shape), a.dtype) for a in linear.out_avals]
    outs = kernel_tangent_p.bind(*args, linear=_Linear(jvp, vjp, out_avals), counts=counts)
    return outs, [0] * len(outs)


kernel_tangent_p.def_impl(_evaluate)
kernel_tangent_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(kernel_tangent_p, mlir.lower_fun(_evaluate, multiple_results=True))
ad.primitive_transposes[kernel_tangent_p] = _transpose
ad.primitive_jvps[kernel_tangent_p] = _tangent_jvp
batching.primitive_batchers[kernel_tangent_p] = _tangent_batch


def _differentiable(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _kernel_call_jvp(primals: Sequence[Any], tangents: Sequence[Any], *,
                     kernel: KernelHandle):
    spec = kernel.spec
    rule = spec.vjp
    if rule is not None:
        if not any(isinstance(p, jax.core.Tracer) for p in primals):
            # Eager reverse mode: the backward kernels would compile one by one when the
            # backward pass runs (under a trace they are all traced before the lowering).
            spec.start_vjp_builds(primals)
        outs, residuals = rule[0](*primals)
        res_leaves, res_tree = jax.tree.flatten(residuals)
    else:
        outs = kernel_call_p.bind(*primals, kernel=kernel)
        res_leaves, res_tree = [], None
    in_diff = [_differentiable(p) for p in primals]
    out_diff = [_differentiable(a) for a in kernel.out_avals]
    jvp_rule = spec.jvp
    n_res = len(res_leaves)
    if jvp_rule is not None:
        res_leaves = [*res_leaves, *outs]   # the rule sees the primal outputs

    def reference_diff(diff_args, primals):
        args = list(primals)
        it = iter(diff_args)
        args = [next(it) if d else a for a, d in zip(args, in_diff)]
        return [o for o, d in zip(spec.reference(*args), out_diff) if d]

    def jvp(primals, residuals, tangents):
        if jvp_rule is not None:
            it = iter(tangents)
            full = [next(it) if d else jnp.zeros(p.shape, p.dtype)
                    for p, d in zip(primals, in_diff)]
            out = jvp_rule(primals, residuals[n_res:], full)
            return [t for t, d in zip(out, out_diff) if d]
        diff = [p for p, d in zip(primals, in_diff) if d]
        _, out = jax.jvp(lambda *x: reference_diff(x, primals), diff, tangents)
        return out

    def vjp(primals, residuals, cts):
        if rule is None:
            diff = [p for p, d in zip(primals, in_diff) if d]
            _, pullback = jax.vjp(lambda *x: reference_diff(x, primals), *diff)
            return list(pullback(list(cts)))
        it = iter(cts)
        full = [next(it) if d else jnp.zeros(a.shape, a.dtype)
                for a, d in zip(kernel.out_avals, out_diff)]
        grads = rule[1](jax.tree.unflatten(res_tree, list(residuals[:n_res])), full)
        return [g for g, d in zip(grads, in_diff) if d]

    diff_tangents = [ad.instantiate_zeros(t) for t, d in zip(tangents, in_diff) if d]
    out_avals = [a for a, d in zip(kernel.out_avals, out_diff) if d]
    diff_out = []
    if diff_tangents and out_avals:
        counts = (len(primals), len(res_leaves), len(diff_tangents))
        diff_out = kernel_tangent_p.bind(*primals, *res_leaves, *diff_tangents,
                                         linear=_Linear(jvp, vjp, out_avals), counts=counts)
    it = iter(diff_out)
    out_tangents = [next(it, None) if d else None for d in out_diff]
    return list(outs), [t if t is not None else ad.Zero(_tangent_aval(a))
                        for t, a in zip(out_tangents, kernel.out_avals)]


def _tangent_aval(aval: Any) -> Any:
    """The tangent type of a kernel output: float0 for integer outputs."""
    if jnp.issubdtype(aval.dtype, jnp.inexact):
        return aval
    return jax.core.ShapedArray(aval.shape, jax.dtypes.float0)


ad.primitive_jvps[kernel_call_p] = _kernel_call_jvp
