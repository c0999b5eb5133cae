"""The library calls that ``jaxtile prebuild --library`` compiles ahead of time.

Each entry is a call of a ``jt.ops`` function (or its ``jax.value_and_grad``) on example
operand types. Tracing it yields the specialisations of every kernel it runs, backward
kernels included; those are what get compiled. The kernels with dynamic sizes (``softmax``,
the norms: rows) compile once for every row count of a width, tile choice and dtype; the
others (``matmul_relu``, whose dynamic variant measured 7-20% slower, ``attention``, whose
checks compare sizes of several arguments) compile for exactly the shapes listed. A call
outside the list still compiles on first use, as without prebuilt code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

F32, BF16 = jnp.float32, jnp.bfloat16
_WIDTHS = (1000, 1024, 2048, 4096)


def _calls() -> list[tuple[str, Callable[..., Any], tuple[tuple[tuple[int, ...], Any], ...]]]:
    import jaxtile as jt

    ops = jt.ops

    def attention_grad(q, k, v):
        return jax.value_and_grad(lambda *a: jnp.sum(ops.attention(*a, causal=True)),
                                  argnums=(0, 1, 2))(q, k, v)

    calls: list[tuple[str, Callable[..., Any], tuple[tuple[tuple[int, ...], Any], ...]]] = []
    for dt in (F32, BF16):
        for n in _WIDTHS:
            calls.append(("softmax", ops.softmax, (((512, n), dt),)))
            calls.append(("rms_norm", ops.rms_norm, (((512, n), dt), ((n,), dt))))
            calls.append(("layer_norm", ops.layer_norm,
                          (((512, n), dt), ((n,), dt), ((n,), dt))))
    for n in (256, 1024):
        calls.append(("matmul_relu", ops.matmul_relu, (((n, n), F32), ((n, n), F32))))
        calls.append(("matmul", ops.matmul, (((n, n), F32), ((n, n), F32))))
    calls.append(("add", ops.add, (((1 << 16,), F32), ((1 << 16,), F32))))
    qkv = ((1, 2, 128, 64), F32)
    calls.append(("attention", ops.attention, (qkv, qkv, qkv)))
    calls.append(("attention_grad", attention_grad, (qkv, qkv, qkv)))
    return calls


def names() -> list[str]:
    """The names of the library's prebuilt calls (``--library`` may pick some)."""
    return sorted({name for name, _, _ in _calls()})


def specialisations(only: Sequence[str] = ()) -> list[Any]:
    """The specialisations (``jaxtile._specialisation.Specialisation``) of every kernel the
    listed calls run (those named in ``only``, else all), each once, traced without
    compiling anything."""
    from jaxtile import _specialisation

    unknown = set(only) - set(names())
    if unknown:
        raise ValueError(f"no library call named {', '.join(sorted(unknown))}; the calls "
                         f"are {', '.join(names())}")
    found: dict[int, Any] = {}
    with _specialisation.no_early_builds():
        for name, fn, types in _calls():
            if only and name not in only:
                continue
            specs = [jax.ShapeDtypeStruct(shape, dt) for shape, dt in types]
            closed = jax.make_jaxpr(fn)(*specs)
            for spec in _kernel_specs(closed.jaxpr):
                found.setdefault(id(spec), spec)
    return list(found.values())


def _kernel_specs(jaxpr: Any) -> Iterator[Any]:
    """The specialisations of the kernel calls in ``jaxpr`` and its inner jaxprs."""
    from jaxtile.primitives import kernel_call

    for eqn in jaxpr.eqns:
        if eqn.primitive is kernel_call.kernel_call_p:
            yield eqn.params["kernel"].spec
        for value in eqn.params.values():
            for inner in value if isinstance(value, tuple | list) else (value,):
                sub = getattr(inner, "jaxpr", inner)
                if hasattr(sub, "eqns"):
                    yield from _kernel_specs(sub)
