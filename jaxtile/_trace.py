"""Tracing a kernel body into a stateful jaxpr.

The body runs under ``jax.make_jaxpr``, which discovers what it allocates (``jt.empty``
outputs, ``jt.shared``/``jt.fragment``/``jt.local`` scratch, each a ``new_ref``), the grid and
which refs it returns. The allocations then become input refs of the jaxpr, so its inputs
are ``[block indices, kernel inputs, outputs (in the order the body returns them), scratch]``
and nothing is allocated inside it: the jaxpr is rewritten so where every allocation was made
at the body's top level (``jax_internals.refs_as_inputs``), and otherwise the body is traced
a second time with the allocations passed in. That shape suits
both the compiler (buffers are parameters or hoisted scratch) and the reference semantics
(outputs persist across grid blocks, scratch is fresh per block).

A batched (vmapped) specialisation traces the same body with extra grid axes, one per batch
level: the batched inputs and all outputs carry the batch dimensions in front, and the body
sees ``ref.at[batch indices]`` views of them, so it computes one batch element per block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxtile.compiler import ir, sizes
from jaxtile.compiler import jax_internals as ji
from jaxtile.compiler.errors import KernelError, kernel_error, user_line

MAX_GRID_RANK = 3

_SCOPE_PREFIX = {"global": "out", "shared": "smem", "fragment": "frag", "local": "local"}
_API_NAME = {"global": "empty", "shared": "shared", "fragment": "fragment", "local": "local"}


@dataclasses.dataclass(frozen=True)
class BatchLevel:
    """One level of vmap: its size and which kernel inputs carry it."""

    size: int
    batched: tuple[bool, ...]


@dataclasses.dataclass
class _Allocation:
    scope: str
    shape: tuple[int, ...]
    dtype: np.dtype
    line: str | None


class _TraceState:
    def __init__(self, kernel: str, batch: Sequence[BatchLevel],
                 expected: Sequence[_Allocation] | None, symbolic: bool = False):
        self.kernel = kernel
        self.symbolic = symbolic
        """Whether dynamic sizes are JAX symbolic dimensions in this trace."""
        self.batch_shape = tuple(level.size for level in batch)
        self.expected = expected
        self.allocations: list[_Allocation] = []
        self.grid: tuple[int, ...] | None = None
        self.block_indices: tuple[Any, ...] = ()
        self.batch_indices: tuple[Any, ...] = ()
        self.prepared_refs: Sequence[Any] = ()
        self.slots: Sequence[int] = ()
        self.scopes: dict[int, str] = {}
        self.refs: list[Any] = []
        self.result: Any = None
        self.threads = 128
        self.layouts: dict[int, Any] = {}
        """Allocation index -> the layout ``jt.annotate_layout`` pinned."""

    def error(self, message: str) -> KernelError:
        return kernel_error(self.kernel, message, user_line())

    def annotate(self, ref: Any, text: str) -> None:
        """Record a layout annotation of a fragment (see ``jt.annotate_layout``)."""
        index = next((i for i, r in enumerate(self.refs) if r is ref), None)
        if index is None or self.allocations[index].scope != "fragment":
            raise self.error("jt.annotate_layout: the first argument must be a tile made with "
                             "jt.fragment")
        from jaxtile.compiler.gpu import layout

        alloc = self.allocations[index]
        try:
            parsed = layout.parse(str(text), alloc.shape, self.threads)
        except (ValueError, IndexError, KeyError) as e:
            raise self.error(f"jt.annotate_layout: {text!r} is not a layout of a "
                             f"{list(alloc.shape)} tile over {self.threads} threads ({e})") \
                from None
        self.layouts[index] = parsed

    def allocate(self, scope: str, shape: Any, dtype: Any) -> Any:
        shape = _static_shape(self, shape, f"jt.{_API_NAME[scope]}",
                              allow_zero=scope == "global",
                              dynamic=scope == "global" and self.symbolic)
        dtype = np.dtype(dtype)
        n = len(self.allocations)
        lead = self.batch_shape if scope == "global" else ()
        if _is_static(shape) and math.prod(lead + shape) > MAX_ELEMENTS:
            raise self.error(f"jt.empty: the output of shape {shape} has "
                             f"{math.prod(lead + shape)} elements with its batch levels; at "
                             f"most {MAX_ELEMENTS} (32-bit indexing)")
        if self.expected is None:
            ref = jax.ref.new_ref(jnp.zeros(lead + shape, dtype))
        else:
            if n >= len(self.expected) or self.expected[n].shape != shape:
                raise self.error("the body allocated different buffers on its second trace; "
                                 "kernel bodies must be deterministic")
            ref = self.prepared_refs[self.slots[n]]
        self.allocations.append(_Allocation(scope, shape, dtype, user_line()))
        self.scopes[id(ref)] = scope
        view = ref.at[tuple(self.batch_indices)] if lead else ref
        self.refs.append(view)
        return view

    def scope_of(self, ref: Any) -> str:
        return self.scopes.get(id(ji.flatten_ref(ref)[0]), "global")

    def input_views(self, refs: Sequence[Any], batch: Sequence[BatchLevel]) -> list[Any]:
        views = []
        for i, ref in enumerate(refs):
            self.scopes[id(ref)] = "global"
            idx = tuple(b for b, level in zip(self.batch_indices, batch) if level.batched[i])
            views.append(ref.at[idx] if idx else ref)
        return views


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


MAX_ELEMENTS = 2**31 - 1
"""Elements of one buffer, and blocks of one grid, at most: kernels index with int32."""


def _is_static(shape: Sequence[Any]) -> bool:
    return all(isinstance(d, int) for d in shape)


def _static_shape(state: _TraceState, shape: Any, api: str, allow_zero: bool = False,
                  dynamic: bool = False) -> tuple[Any, ...]:
    """``shape`` as ints; with ``dynamic``, dimensions derived from dynamic sizes stay JAX
    symbolic dimensions (an output's shape in a kernel with dynamic sizes)."""
    if isinstance(shape, int | np.integer) or ji.is_symbolic_dim(shape):
        shape = (shape,)
    try:
        dims = tuple(d if dynamic and ji.is_symbolic_dim(d) else int(d) for d in shape)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise state.error(f"{api}: the shape must be a tuple of Python ints, got {shape!r}") \
            from None
    except Exception:  # noqa: BLE001 - JAX's error for a symbolic dimension made an int
        raise state.error(f"{api}: the shape {shape!r} depends on a dynamic size; "
                          "on-chip tiles have static shapes") from None
    if not _is_static(dims):
        return dims
    if any(d < 0 or (d == 0 and not allow_zero) for d in dims):
        kind = "non-negative" if allow_zero else "positive"
        raise state.error(f"{api}: every dimension must be {kind}, got {dims}")
    if math.prod(dims) > MAX_ELEMENTS:
        raise state.error(f"{api}: a buffer of shape {dims} has {math.prod(dims)} elements; "
                          f"jaxtile indexes with 32-bit integers, so at most {MAX_ELEMENTS}")
    return dims


def checked_grid(state: _TraceState, extents: tuple[int, ...]) -> tuple[int, ...]:
    """``extents`` if a grid of that many blocks (with the batch levels) can be launched
    (checked when the sizes are known: on the trace with concrete shapes)."""
    if not _is_static(extents):
        return extents
    blocks = math.prod(extents) * math.prod(state.batch_shape)
    if blocks > MAX_ELEMENTS:
        raise state.error(f"jt.grid{extents} has {blocks} blocks (batch levels included); "
                          f"jaxtile numbers blocks with 32-bit integers, so at most "
                          f"{MAX_ELEMENTS}: give each block more work")
    return extents


@dataclasses.dataclass(frozen=True)
class Traced:
    """A traced kernel: the stateful jaxpr and what its inputs mean."""

    name: str
    jaxpr: ji.ClosedJaxpr
    grid: tuple[int, ...]
    """The full launch grid: the body's ``jt.grid`` axes, then one axis per batch level
    (innermost level first). Axis 0 varies fastest."""
    index_axes: tuple[int | None, ...]
    """For each block-index input of the jaxpr, the grid axis it reads (None: always 0)."""
    buffers: tuple[ir.Buffer, ...]
    """Inputs, outputs in the order the body returns them, then scratch."""
    num_inputs: int
    out_tree: Any

    @property
    def outputs(self) -> tuple[ir.Buffer, ...]:
        return tuple(b for b in self.buffers if b.role == "output")


def trace(fn: Callable[..., Any], name: str, arg_names: Sequence[str],
          args: Sequence[jax.ShapeDtypeStruct], params: dict[str, Any],
          batch: Sequence[BatchLevel] = (), threads: int = 128,
          dynamic: Mapping[int, tuple[int, ...]] | None = None) -> Traced:
    """Trace ``fn(*refs, **params)`` for inputs shaped like ``args`` (their unbatched shapes),
    under the batch levels ``batch`` (outermost first); see the module doc.

    With ``dynamic`` (argument position -> axes), those dimensions are traced as JAX
    symbolic dimensions named ``<argument>_<axis>`` (``x_0``), so that the jaxpr, grid and
    buffers hold expressions of them instead of the sizes of ``args``."""
    n_idx = MAX_GRID_RANK + len(batch)
    for arg_name, a in zip(arg_names, args):
        size = math.prod(a.shape) * math.prod(level.size for level in batch)
        if size > MAX_ELEMENTS:
            raise kernel_error(name, f"argument '{arg_name}' has {size} elements (batch "
                               f"levels included); jaxtile indexes with 32-bit integers, so "
                               f"at most {MAX_ELEMENTS}", user_line())
    index_avals = [jax.ShapeDtypeStruct((), jnp.int32)] * n_idx
    full_shapes = [tuple(level.size for level in batch if level.batched[i]) + tuple(a.shape)
                   for i, a in enumerate(args)]
    if dynamic:
        full_shapes = _symbolic_shapes(full_shapes, arg_names, args, dynamic)
    in_avals = [ji.ref_aval(s, a.dtype) for s, a in zip(full_shapes, args)]
    n_in = len(args)

    def run(state: _TraceState, operands: Sequence[Any]) -> None:
        state.block_indices = operands[:MAX_GRID_RANK]
        state.batch_indices = operands[MAX_GRID_RANK:n_idx]
        views = state.input_views(operands[n_idx:n_idx + n_in], batch)
        with _active(state):
            state.result = fn(*views, **params)

    first = _TraceState(name, batch, None, symbolic=bool(dynamic))
    first.threads = threads
    created = _run_user(name, lambda: jax.make_jaxpr(lambda *ops: run(first, ops))(
        *index_avals, *in_avals), symbolic=bool(dynamic))
    out_tree, returned = _returned_outputs(first)

    # The allocations become inputs: outputs in returned order, then scratch in creation
    # order. Where every one was made at the body's top level, the first pass's jaxpr is
    # rewritten so; otherwise a second pass runs the body with them as inputs.
    scratch = [k for k, a in enumerate(first.allocations) if a.scope != "global"]
    order = returned + scratch
    jaxpr = ji.refs_as_inputs(created, len(first.allocations), order)
    if jaxpr is None:
        jaxpr = _second_pass(name, first, order, run, batch, index_avals, in_avals,
                             n_idx + n_in, bool(dynamic))
    lead = tuple(level.size for level in batch)

    buffers = [ir.Buffer(n, _sizes(s), np.dtype(a.dtype), "global", "input")
               for n, s, a in zip(arg_names, full_shapes, args)]
    for pos, k in enumerate(order):
        alloc = first.allocations[k]
        same_scope = sum(1 for j in order[:pos] if first.allocations[j].scope == alloc.scope)
        role = "output" if alloc.scope == "global" else "scratch"
        shape = (lead if role == "output" else ()) + alloc.shape
        buffers.append(ir.Buffer(f"{_SCOPE_PREFIX[alloc.scope]}{same_scope}", _sizes(shape),
                                 alloc.dtype, alloc.scope, role, line=alloc.line,
                                 layout=first.layouts.get(k)))
    user_grid = first.grid or (1,)
    index_axes = tuple(a if a < len(user_grid) else None for a in range(MAX_GRID_RANK)) + tuple(
        len(user_grid) + len(batch) - 1 - level for level in range(len(batch)))
    grid = _sizes(tuple(user_grid) + tuple(level.size for level in reversed(batch)))
    return Traced(name, jaxpr, grid, index_axes, tuple(buffers), n_in, out_tree)


def _second_pass(name: str, first: _TraceState, order: list[int],
                 run: Callable[[_TraceState, Sequence[Any]], None],
                 batch: Sequence[BatchLevel], index_avals: list[Any], in_avals: list[Any],
                 n_before: int, symbolic: bool) -> ji.ClosedJaxpr:
    """The body traced again with its allocations (found by ``first``) as inputs, in
    ``order`` after the ``n_before`` index and input refs."""
    second = _TraceState(name, batch, first.allocations, symbolic=symbolic)
    second.threads = first.threads
    second.slots = [order.index(k) for k in range(len(first.allocations))]
    lead = tuple(level.size for level in batch)
    alloc_avals = [ji.ref_aval((lead if first.allocations[k].scope == "global" else ())
                               + first.allocations[k].shape, first.allocations[k].dtype)
                   for k in order]

    def second_pass(*operands):
        second.prepared_refs = operands[n_before:]
        run(second, operands)
        return ()

    return _run_user(name, lambda: jax.make_jaxpr(second_pass)(
        *index_avals, *in_avals, *alloc_avals), symbolic=symbolic)


def _symbolic_shapes(shapes: list[tuple[int, ...]], arg_names: Sequence[str],
                     args: Sequence[jax.ShapeDtypeStruct],
                     dynamic: Mapping[int, tuple[int, ...]]) -> list[tuple[Any, ...]]:
    """``shapes`` with the dynamic axes (counted in the unbatched argument) made symbolic."""
    names = [(i, axis, f"{arg_names[i]}_{axis}") for i, axes in sorted(dynamic.items())
             for axis in axes]
    symbols = jax.export.symbolic_shape(", ".join(n for _, _, n in names))
    out = [list(s) for s in shapes]
    for (i, axis, _), sym in zip(names, symbols):
        out[i][len(shapes[i]) - len(args[i].shape) + axis] = sym
    return [tuple(s) for s in out]


def _sizes(shape: Sequence[Any]) -> tuple[Any, ...]:
    """A shape or grid for the Tile IR: symbolic dimensions become size expressions."""
    return tuple(sizes.canonical(d) for d in shape)


def _returned_outputs(state: _TraceState) -> tuple[Any, list[int]]:
    leaves, tree = jax.tree.flatten(state.result, is_leaf=ji.is_ref)
    index = {id(r): i for i, r in enumerate(state.refs)}
    found = []
    for leaf in leaves:
        i = index.get(id(leaf))
        if i is None or state.allocations[i].scope != "global" or i in found:
            raise kernel_error(state.kernel, "the body must return the output refs it created "
                               f"with jt.empty (a ref or a tuple of refs), got {leaf!r}")
        found.append(i)
    if not found:
        raise kernel_error(state.kernel, "the body returned no outputs; create them with "
                           "jt.empty(shape, dtype) and return them")
    for k, alloc in enumerate(state.allocations):
        if alloc.scope == "global" and k not in found:
            raise kernel_error(state.kernel, "an output created with jt.empty is not returned "
                               "by the body; return every output", alloc.line)
    return tree, found


_SIZE_DECISION = ("a Python decision depends on a dynamic size ({what}); one compiled kernel "
                  "serves every size, so it cannot take the branch of this one. Decide on "
                  "the device (jnp.where, or @jt.when on a condition computed from "
                  "jnp.asarray(size)), or leave that dimension out of dynamic=")


def _refuse_size_decisions(name: str) -> Callable[[str, str], None]:
    """The callback of ``ji.on_undecided_dim_comparison`` for a symbolic trace: a comparison
    made by the body (not by JAX's or jaxtile's own code, which knowingly rely on JAX's
    answer) is an error at the body's line."""
    def refuse(what: str, caller: str) -> None:
        line = user_line()
        if caller == line:
            raise kernel_error(name, _SIZE_DECISION.format(what=what), line)
    return refuse


def _run_user(name: str, thunk: Callable[[], Any], symbolic: bool = False) -> Any:
    """Run a trace, turning any failure inside the user's body into a KernelError; in a
    ``symbolic`` trace (dynamic sizes), a Python decision on a size is one too."""
    try:
        if not symbolic:
            return thunk()
        with ji.on_undecided_dim_comparison(_refuse_size_decisions(name)):
            return thunk()
    except KernelError:
        raise
    except ji.InconclusiveDimensionOperation as e:
        what = (str(e).strip().splitlines() or [""])[0]
        raise kernel_error(name, _SIZE_DECISION.format(what=f"JAX: {what}"),
                           user_line(e.__traceback__)) from None
    except jax.errors.TracerBoolConversionError as e:
        if ji.failed_in_ref_indexing(e.__traceback__):
            raise kernel_error(
                name, "a slice of a ref has a traced start or stop (x[i * n:(i + 1) * n]); "
                "Python slices need static bounds: use jt.ds(start, size) for a dynamic start "
                "(x[jt.ds(i * n, n)], x.at[jt.ds(i * n, n)])", user_line(e.__traceback__)
            ) from None
        raise kernel_error(
            name, "a Python `if`/`while`/`and`/`or` depends on a traced value; use @jt.when "
            "for a device-side condition or jnp.where for a select", user_line(e.__traceback__)
        ) from None
    except Exception as e:  # noqa: BLE001 - any failure in user code is reported with its line
        raise kernel_error(name, f"{type(e).__name__}: {e}", user_line(e.__traceback__)) \
            from None
