"""Tracing a kernel body into a stateful jaxpr.

The body runs twice under ``jax.make_jaxpr``. The first pass discovers what the body
allocates (``jt.empty`` outputs, ``jt.shared``/``jt.fragment``/``jt.local`` scratch), the grid
and which refs it returns. The second pass runs the body with every allocation already an input
ref of the jaxpr, so the jaxpr's inputs are ``[block indices (3), kernel inputs, allocations]``
and nothing is allocated inside it. That shape suits both the compiler (buffers are
parameters or hoisted scratch) and the reference semantics (outputs persist across grid blocks,
scratch is fresh per block).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxtile.compiler import ir
from jaxtile.compiler import jax_internals as ji
from jaxtile.compiler.errors import KernelError, kernel_error, user_line

MAX_GRID_RANK = 3

_SCOPE_PREFIX = {"global": "out", "shared": "smem", "fragment": "frag", "local": "local"}


@dataclasses.dataclass
class _Allocation:
    scope: str
    shape: tuple[int, ...]
    dtype: np.dtype
    line: str | None


class _TraceState:
    def __init__(self, kernel: str, expected: Sequence[_Allocation] | None):
        self.kernel = kernel
        self.expected = expected
        self.allocations: list[_Allocation] = []
        self.grid: tuple[int, ...] | None = None
        self.block_indices: tuple[Any, ...] = ()
        self.prepared_refs: Sequence[Any] = ()
        self.scopes: dict[int, str] = {}
        self.refs: list[Any] = []

    def error(self, message: str) -> KernelError:
        return kernel_error(self.kernel, message, user_line())

    def allocate(self, scope: str, shape: Any, dtype: Any) -> Any:
        shape = _static_shape(self, shape, f"jt.{_API_NAME[scope]}")
        dtype = np.dtype(dtype)
        n = len(self.allocations)
        if self.expected is None:
            ref = jax.ref.new_ref(jnp.zeros(shape, dtype))
        else:
            if n >= len(self.expected) or self.expected[n].shape != shape:
                raise self.error("the body allocated different buffers on its second trace; "
                                 "kernel bodies must be deterministic")
            ref = self.prepared_refs[n]
        self.allocations.append(_Allocation(scope, shape, dtype, user_line()))
        self.scopes[id(ref)] = scope
        self.refs.append(ref)
        return ref

    def scope_of(self, ref: Any) -> str:
        return self.scopes.get(id(ref), "global")


_API_NAME = {"global": "empty", "shared": "shared", "fragment": "fragment", "local": "local"}
_local = threading.local()


def current(api: str) -> _TraceState:
    """The active trace, or an error saying ``api`` is only usable inside a kernel body."""
    state = getattr(_local, "state", None)
    if state is None:
        raise KernelError(f"{api} can only be used inside a @jt.kernel body")
    return state


@contextlib.contextmanager
def _active(state: _TraceState):
    previous = getattr(_local, "state", None)
    _local.state = state
    try:
        yield state
    finally:
        _local.state = previous


def _static_shape(state: _TraceState, shape: Any, api: str) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        shape = (shape,)
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise state.error(f"{api}: the shape must be a tuple of Python ints, got {shape!r}") \
            from None
    if any(d <= 0 for d in dims):
        raise state.error(f"{api}: every dimension must be positive, got {dims}")
    return dims


@dataclasses.dataclass(frozen=True)
class Traced:
    """A traced kernel: the stateful jaxpr and what its inputs mean."""

    name: str
    jaxpr: ji.ClosedJaxpr
    grid: tuple[int, ...]
    buffers: tuple[ir.Buffer, ...]
    num_inputs: int
    out_tree: Any
    out_buffers: tuple[int, ...]
    """Index (into ``buffers``) of each returned output, in the order of ``out_tree``'s leaves."""

    @property
    def outputs(self) -> tuple[ir.Buffer, ...]:
        return tuple(b for b in self.buffers if b.role == "output")


def trace(fn: Callable[..., Any], name: str, arg_names: Sequence[str],
          args: Sequence[jax.ShapeDtypeStruct], params: dict[str, Any]) -> Traced:
    """Trace ``fn(*refs, **params)`` for inputs shaped like ``args``; see the module doc."""
    index_avals = [jax.ShapeDtypeStruct((), jnp.int32)] * MAX_GRID_RANK
    in_avals = [ji.ref_aval(a.shape, a.dtype) for a in args]

    first = _TraceState(name, None)

    def first_pass(*operands):
        first.block_indices = operands[:MAX_GRID_RANK]
        for ref in operands[MAX_GRID_RANK:]:
            first.scopes[id(ref)] = "global"
        with _active(first):
            result = fn(*operands[MAX_GRID_RANK:], **params)
        first.result = result
        return ()

    _run_user(name, lambda: jax.make_jaxpr(first_pass)(*index_avals, *in_avals))
    out_tree, out_allocs = _returned_outputs(first)

    second = _TraceState(name, first.allocations)
    alloc_avals = [ji.ref_aval(a.shape, a.dtype) for a in first.allocations]

    def second_pass(*operands):
        second.block_indices = operands[:MAX_GRID_RANK]
        second.prepared_refs = operands[MAX_GRID_RANK + len(args):]
        with _active(second):
            fn(*operands[MAX_GRID_RANK:MAX_GRID_RANK + len(args)], **params)
        return ()

    jaxpr = _run_user(
        name, lambda: jax.make_jaxpr(second_pass)(*index_avals, *in_avals, *alloc_avals))
    buffers = [ir.Buffer(n, tuple(a.shape), np.dtype(a.dtype), "global", "input")
               for n, a in zip(arg_names, args)]
    counts: dict[str, int] = {}
    for alloc in first.allocations:
        k = counts.get(alloc.scope, 0)
        counts[alloc.scope] = k + 1
        role = "output" if alloc.scope == "global" else "scratch"
        buffers.append(ir.Buffer(f"{_SCOPE_PREFIX[alloc.scope]}{k}", alloc.shape, alloc.dtype,
                                 alloc.scope, role, line=alloc.line))
    return Traced(name, jaxpr, first.grid or (1,), tuple(buffers), len(args), out_tree,
                  tuple(len(args) + i for i in out_allocs))


def _returned_outputs(state: _TraceState) -> tuple[Any, list[int]]:
    leaves, tree = jax.tree.flatten(state.result, is_leaf=ji.is_ref)
    index = {id(r): i for i, r in enumerate(state.refs)}
    found = []
    for leaf in leaves:
        i = index.get(id(leaf))
        if i is None or state.allocations[i].scope != "global":
            raise kernel_error(state.kernel, "the body must return the output refs it created "
                               f"with jt.empty (a ref or a tuple of refs), got {leaf!r}")
        found.append(i)
    if not found:
        raise kernel_error(state.kernel, "the body returned no outputs; create them with "
                           "jt.empty(shape, dtype) and return them")
    return tree, found


def _run_user(name: str, thunk: Callable[[], Any]) -> Any:
    """Run a trace, turning any failure inside the user's body into a KernelError."""
    try:
        return thunk()
    except KernelError:
        raise
    except jax.errors.TracerBoolConversionError as e:
        raise kernel_error(
            name, "a Python `if`/`while`/`and`/`or` depends on a traced value; use @jt.when "
            "for a device-side condition or jnp.where for a select", user_line(e.__traceback__)
        ) from None
    except Exception as e:  # noqa: BLE001 - any failure in user code is reported with its line
        raise kernel_error(name, f"{type(e).__name__}: {e}", user_line(e.__traceback__)) \
            from None
