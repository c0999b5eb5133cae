"""Every use of JAX's private API in jaxtile, in one place.

jaxtile traces kernel bodies into stateful jaxprs (refs, ``get``/``swap``, ``scan``/``cond``
over refs) and reads them back. The public API covers making refs; reading an indexer out of
``get``/``swap`` params, declaring ref effects on our own primitives, discharging state for the
reference semantics, locating the user's source line and reading the checks a running
``jax.export`` was given need ``jax._src``. Tested with
jax 0.10.x (pinned ``>=0.10.2,<0.11`` in pyproject); ``tests/compiler/test_jax_internals.py``
checks each assumption so that a JAX upgrade fails there first.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
from jax import lax, tree_util
from jax._src import array as _array
from jax._src import core as _core
from jax._src import debugging as _debugging
from jax._src import source_info_util as _source_info
from jax._src.export import _export as _jax_export
from jax._src.export import shape_poly as _shape_poly
from jax._src.state import discharge as _discharge
from jax._src.state import indexing as _indexing
from jax._src.state import types as _state_types
from jaxlib.xla_client import CustomCallTargetTraits as _Traits

AbstractRef = _state_types.AbstractRef
TransformedRef = _state_types.TransformedRef
NDIndexer = _indexing.NDIndexer
Slice = _indexing.Slice
ReadEffect = _state_types.ReadEffect
WriteEffect = _state_types.WriteEffect
ShapedArray = _core.ShapedArray
Literal = _core.Literal
Var = _core.Var
ClosedJaxpr = _core.ClosedJaxpr
Jaxpr = _core.Jaxpr
JaxprEqn = _core.JaxprEqn
# jax.extend.core.Primitive is this class; importing jax.extend also imports Pallas
# (about 0.06 s of CPU time), which ``import jaxtile`` need not pay.
Primitive = _core.Primitive
# The type of a concrete jax.Array (never a tracer, which ``isinstance(x, jax.Array)`` also
# accepts): an exact type check picks an eager call's arguments in a few nanoseconds.
ArrayImpl = _array.ArrayImpl

discharge_state = _discharge.discharge_state
register_discharge_rule = _discharge.register_discharge_rule
debug_effect = _debugging.debug_effect
"""The effect of ``jax.debug.callback``: allowed in loops and conditionals, never dropped."""


def ref_aval(shape: tuple[int, ...], dtype: Any) -> AbstractRef:
    """The abstract value of a mutable ref of ``shape`` and ``dtype``, for tracing."""
    return AbstractRef(ShapedArray(tuple(shape), dtype))


def is_symbolic_dim(x: Any) -> bool:
    """Whether ``x`` is a JAX symbolic dimension (a dynamic size while tracing)."""
    return _core.is_symbolic_dim(x)


def is_ref(x: Any) -> bool:
    """Whether ``x`` is a traced ref (plain or transformed)."""
    if isinstance(x, TransformedRef):
        return True
    return isinstance(getattr(x, "aval", None), AbstractRef)


def ref_indexers(eqn: JaxprEqn) -> tuple[Any, list[Any]]:
    """The ref operand of a ``get``/``swap``/``addupdate`` eqn and its indexer transforms.

    The transforms are unflattened from ``eqn.params["tree"]``; their leaves are jaxpr atoms
    (``Var`` or ``Literal``). Returns ``(ref_var, [NDIndexer, ...])``.
    """
    ref = eqn.invars[0]
    n_value = 1 if eqn.primitive.name in ("swap", "addupdate") else 0
    leaves = eqn.invars[1 + n_value:]
    transforms = tree_util.tree_unflatten(eqn.params["tree"], leaves)
    return ref, list(transforms)


def value_operand(eqn: JaxprEqn) -> Any:
    """The stored value operand of a ``swap``/``addupdate`` eqn."""
    return eqn.invars[1]


def flatten_ref(x: Any) -> tuple[Any, tuple[Any, ...]]:
    """Split a ref or transformed ref into ``(base_ref, transforms)``."""
    if isinstance(x, TransformedRef):
        return x.ref, tuple(x.transforms)
    return x, ()


def user_source_line(source_info: Any) -> str | None:
    """``"file:line"`` of the innermost user frame of an eqn's source info, or None."""
    frame = _source_info.user_frame(source_info.traceback)
    if frame is None:
        return None
    return f"{frame.file_name}:{frame.start_line}"


def exclude_from_source_lines(path: str) -> None:
    """Treat frames in ``path`` (a file, or a folder and all below it) like JAX's own when
    locating the user's source line."""
    folder = os.path.isdir(path) and not path.endswith(os.sep)
    _source_info.register_exclusion(path + os.sep if folder else path)


def effectful_abstract_eval(prim: Primitive, rule: Any) -> None:
    """Define an abstract eval that returns ``(avals, effects)`` for ``prim``."""
    prim.def_effectful_abstract_eval(rule)


def literal_value(atom: Any) -> Any:
    """The Python value of a jaxpr Literal, or None for a Var."""
    return atom.val if isinstance(atom, Literal) else None


def eval_jaxpr(closed: ClosedJaxpr, *args: Any) -> list[Any]:
    """Evaluate a closed jaxpr on ``args`` (tracers or arrays) with JAX's own interpreter."""
    return _core.eval_jaxpr(closed.jaxpr, closed.consts, *args)


def concrete_int(x: Any) -> int | None:
    """The value of an integer that is known at trace time (a Python int, or a tracer of a
    constant such as the ``12`` in ``ref.at[12]``), else None."""
    if isinstance(x, int):
        return x
    # A tracer of a Python constant keeps it as a Literal in ``.val`` (jax 0.10).
    lit = getattr(x, "val", None)
    if isinstance(lit, Literal):
        return int(lit.val)
    try:
        value = _core.to_concrete_value(x)
    except Exception:  # noqa: BLE001 - anything not concretisable is simply not static
        return None
    return None if value is None else int(value)


def failed_in_ref_indexing(tb: Any) -> bool:
    """Whether a traceback passes through JAX's indexing of refs (``x[a:b]``,
    ``x.at[a:b]``), whose only Python decisions are on slice bounds: a bool conversion
    error there means a slice bound is traced."""
    return any(frame.filename == _indexing.__file__ for frame in traceback.extract_tb(tb))


def lowering_for_export(ctx: Any) -> bool:
    """Whether an MLIR lowering rule runs for ``jax.export`` (JAX has no public way to ask)."""
    return bool(getattr(ctx.module_context.lowering_parameters, "for_export", False))


def zeros(ctx: Any, aval: Any) -> Any:
    """An MLIR value of zeros of ``aval``'s type, inside a lowering rule."""
    from jax._src.interpreters import mlir as _mlir

    return _mlir.full_like_aval(ctx, 0, aval)


def named_op_location(ctx: Any, name: str) -> Any:
    """An MLIR location, inside a lowering rule, that names the op XLA makes of it ``name``.

    JAX locates an op ``NameLoc("prim:", NameLoc("scope/prim", file))``; XLA takes the
    outer name for the HLO instruction's name (what profiler timelines show, sanitised) and
    its ``op_type``, the inner one for ``op_name``. The same shape with ``name`` in place of
    the primitive's name makes a kernel call show as the kernel, not as ``kernel_call``. JAX
    keeps it only for primitives registered with ``cacheable=False``: a cached lowering is
    emitted at the call site's location."""
    from jax._src.interpreters import mlir as _mlir
    from jax._src.lib.mlir import ir

    inner = _mlir.source_info_to_location(ctx.module_context, None,
                                          ctx.name_stack.extend(name), ctx.traceback)
    return ir.Location.name(f"{name}:", childLoc=inner)


def lower_per_platform(ctx: Any, description: str, rules: dict[str, Callable[..., Any]],
                       default: Callable[..., Any], *args: Any, **params: Any) -> Any:
    """Inside the one lowering rule of a primitive without effects registered with
    ``cacheable=False``: each platform's rule (``default`` for the others), in a switch on
    the platform when lowering for several (as JAX does for rules registered per platform).

    JAX's own dispatch of an uncacheable primitive fails when lowering for several platforms
    (it concatenates a list with the tuple ``ctx.avals_out`` of that path), so such a
    primitive registers one rule that calls this with a list."""
    from jax._src.interpreters import mlir as _mlir

    ctx = ctx.replace(avals_out=list(ctx.avals_out))
    return _mlir.lower_per_platform(ctx, description, rules, default, frozenset(), *args,
                                    **params)


def compute_capability(ctx: Any) -> str | None:
    """The compute capability (``"9.0"``) of the first device a lowering is for, where
    JAX says (it lowers with devices only when it must; see below)."""
    devices = getattr(ctx.module_context, "devices", None) or ()
    return getattr(devices[0], "compute_capability", None) if len(devices) else None


def export_disabled_checks() -> tuple[Any, ...] | None:
    """The ``disabled_checks`` of the ``jax.export.export`` call whose lowering is running, or
    None when none is found.

    JAX hands them only to the check that follows lowering, whose error for a custom call it
    does not know prints the whole op (payload included); reading them here lets a lowering
    rule say what to pass instead. They are a local of JAX's ``do_export`` on the stack.
    """
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "do_export" and code.co_filename == _jax_export.__file__:
            checks = frame.f_locals.get("disabled_checks")
            return None if checks is None else tuple(checks)
        frame = frame.f_back
    return None


def lowering_is_partitioned(ctx: Any) -> bool:
    """Whether a lowering rule runs in a computation that XLA will partition over several
    devices (``jit`` with a multi-device sharding), and not inside ``shard_map``, whose body
    is already per device."""
    axis_context = ctx.module_context.axis_context
    if getattr(axis_context, "manual_axes", ()):
        return False
    return getattr(axis_context, "num_devices", 1) > 1


def require_devices_when_lowering(prim: Primitive) -> None:
    """Make JAX lower computations holding ``prim`` with their concrete device assignment,
    which ``custom_partitioning`` (used for sharded kernels) needs."""
    from jax._src import dispatch

    dispatch.prim_requires_devices_during_lowering.add(prim)


COMMAND_BUFFER_COMPATIBLE = _Traits.COMMAND_BUFFER_COMPATIBLE
"""The registration trait (``jax.ffi.register_ffi_target(..., traits=)``) that lets XLA
capture a custom call into a command buffer (a CUDA graph). The handler declares the same
trait itself (XLA reads it from the handler's metadata); this is for registration paths that
take it from the registration instead."""


InconclusiveDimensionOperation = _core.InconclusiveDimensionOperation
"""What JAX raises for a comparison of symbolic dimensions (or ``int()`` of one) that it
cannot decide for every value of the dimensions."""

_DimExpr = _shape_poly._DimExpr
_jax_dim_eq = _DimExpr.__eq__
_dim_hooks = threading.local()
_dim_hooks_installed = threading.Lock()


def _undecided_equality(a: Any, b: Any) -> bool:
    """Whether ``a == b`` (``a`` symbolic) holds for some values of the dimensions and not
    for others: JAX's ``==`` then answers False (its ``__eq__`` must not raise, as hashing
    uses it), which is right for none of the values where they are equal."""
    if not (is_symbolic_dim(b) or _core.is_constant_dim(b)):
        return False
    try:
        diff = a - b
    except Exception:  # noqa: BLE001 - e.g. dimensions of two scopes: never equal
        return False
    if not is_symbolic_dim(diff):
        return False
    for provably_unequal in (lambda: diff >= 1, lambda: diff <= -1):
        try:
            if provably_unequal():
                return False
        except InconclusiveDimensionOperation:
            pass
    return True


def _caller(depth: int) -> str:
    """``file:line`` of the frame that made a comparison, past JAX's own dimension code
    (``!=`` calls ``__eq__``)."""
    frame = sys._getframe(depth + 1)
    while frame is not None and frame.f_code.co_filename == _shape_poly.__file__:
        frame = frame.f_back
    return "" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _report(what: str, caller: str) -> None:
    callback = getattr(_dim_hooks, "callback", None)
    _dim_hooks.callback = None      # the callback may compare dimensions itself
    try:
        callback(what, caller)
    finally:
        _dim_hooks.callback = callback


def _checked_eq(self: Any, other: Any) -> bool:
    equal = _jax_dim_eq(self, other)
    if (not equal and getattr(_dim_hooks, "callback", None) is not None
            and _undecided_equality(self, other)):
        _report(f"{self} == {other}", _caller(1))
    return equal


def _checked_bool(self: Any) -> bool:
    # A symbolic dimension has no __bool__ of its own: it is always true, as any object.
    if getattr(_dim_hooks, "callback", None) is not None and _undecided_equality(self, 0):
        _report(f"bool({self})", _caller(1))
    return True


def _install_dim_hooks() -> None:
    with _dim_hooks_installed:
        if _DimExpr.__eq__ is not _checked_eq:
            _DimExpr.__eq__ = _checked_eq
            _DimExpr.__bool__ = _checked_bool


@contextlib.contextmanager
def on_undecided_dim_comparison(callback: Callable[[str, str], None]) -> Iterator[None]:
    """While active on this thread, ``==``, ``!=`` or a truth test of a symbolic dimension
    whose answer depends on the dimension's value calls ``callback(what, caller)`` first
    (``caller``: ``file:line`` of the code that compared), which may raise.

    JAX answers such an ``==`` "not equal" and such a truth test "true", whatever the
    value, so code that branches on it takes one branch silently. (``<``, ``>=`` and ``int()``
    raise :data:`InconclusiveDimensionOperation` instead.) The hooks are installed on JAX's
    dimension class once; on other threads, and outside this context, they only forward to
    JAX's own behaviour.
    """
    _install_dim_hooks()
    previous = getattr(_dim_hooks, "callback", None)
    _dim_hooks.callback = callback
    try:
        yield
    finally:
        _dim_hooks.callback = previous


def explain_export_check_failures(explain: Callable[[str], Exception | None]) -> None:
    """Have ``jax.export``'s check of custom-call targets ask ``explain(message)`` for a
    clearer error when it rejects a module; ``explain`` returns the error to raise instead,
    or None to keep JAX's.

    A lowering rule can give that error itself, but only when it runs: JAX caches lowerings
    by jaxpr and lowering parameters, which do not hold ``disabled_checks``, so a second
    export of a function without them reuses the first lowering and reaches JAX's check
    (whose message prints every rejected op, payloads included).
    """
    check = _jax_export._check_module

    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        except ValueError as e:
            clearer = explain(str(e))
            if clearer is None:
                raise
            raise clearer from None

    _jax_export._check_module = checked


def _wide_index(atom: Any) -> bool:
    """Whether ``atom`` is a scalar of an integer type with values outside int32's range."""
    dtype = np.dtype(atom.aval.dtype)
    if getattr(atom.aval, "shape", None) != () or not np.issubdtype(dtype, np.integer):
        return False
    info, i32 = np.iinfo(dtype), np.iinfo(np.int32)
    return info.max > i32.max or info.min < i32.min


def _saturating_eqns(index: Any, eqn: JaxprEqn) -> tuple[Any, list[JaxprEqn]]:
    """``index`` (a scalar integer atom of a type wider than int32) clamped into int32's
    range by new min/max eqns, with ``eqn``'s source info."""
    dtype = np.dtype(index.aval.dtype)
    info, i32 = np.iinfo(dtype), np.iinfo(np.int32)
    if isinstance(index, Literal):
        value = min(max(int(index.val), int(i32.min)), int(i32.max))
        return Literal(np.array(value, dtype), index.aval), []
    eqns, atom = [], index
    for prim, bound in ((lax.min_p, i32.max), (lax.max_p, i32.min)):
        if (prim is lax.min_p and info.max > i32.max) or (prim is lax.max_p and
                                                          info.min < i32.min):
            out = Var(index.aval)
            eqns.append(_core.new_jaxpr_eqn([atom, Literal(np.array(bound, dtype), index.aval)],
                                            [out], prim, {}, set(), eqn.source_info))
            atom = out
    return atom, eqns


def _map_eqns(closed: ClosedJaxpr, f: Callable[[JaxprEqn], list[JaxprEqn]]) -> ClosedJaxpr:
    """``closed`` with every eqn, in nested jaxprs too, replaced by the eqns ``f`` gives for
    it (after its nested jaxprs were rewritten)."""

    def rewrite(jaxpr: Jaxpr) -> Jaxpr:
        eqns: list[JaxprEqn] = []
        for eqn in jaxpr.eqns:
            params = {k: _rewrite_param(v) for k, v in eqn.params.items()}
            eqns += f(eqn.replace(params=params))
        return jaxpr.replace(eqns=eqns)

    def _rewrite_param(v: Any) -> Any:
        if isinstance(v, ClosedJaxpr):
            return v.replace(jaxpr=rewrite(v.jaxpr))
        if isinstance(v, Jaxpr):
            return rewrite(v)
        if isinstance(v, tuple) and v and all(isinstance(b, ClosedJaxpr | Jaxpr) for b in v):
            return tuple(_rewrite_param(b) for b in v)
        return v

    return closed.replace(jaxpr=rewrite(closed.jaxpr))


def refs_as_inputs(closed: ClosedJaxpr, count: int,
                   order: list[int]) -> ClosedJaxpr | None:
    """``closed`` with the refs its top level creates (``count`` ``new_ref`` eqns, in the
    order they appear) made inputs instead, appended after its inputs in ``order`` (indices
    into the creation order), and the eqns that only computed their initial values left
    out. ``None`` where the jaxpr is not of that shape (a ref created inside a nested
    jaxpr, a count that differs): the caller then traces with the refs as inputs.

    The eqns that use a ref name it by its variable (so do their read and write effects),
    which stays the same as an input: only the jaxpr's own effects change, from creating
    refs to reading and writing inputs."""
    jaxpr = closed.jaxpr
    created = [e for e in jaxpr.eqns if e.primitive.name == "new_ref"]
    if len(created) != count or len(order) != count or _creates_refs_inside(jaxpr):
        return None
    refs = [e.outvars[0] for e in created]
    dropped = {id(e) for e in created}
    # The initial values (zeros) fed only their new_ref: leave out the eqns that computed
    # them and that nothing left reads.
    inits = {v for e in created for v in e.invars if isinstance(v, Var)}
    while True:
        kept = [e for e in jaxpr.eqns if id(e) not in dropped]
        used = {v for e in kept for v in e.invars if isinstance(v, Var)}
        used.update(v for v in jaxpr.outvars if isinstance(v, Var))
        dead = [e for e in kept if not e.effects and e.outvars
                and all(v in inits and v not in used for v in e.outvars)]
        if not dead:
            break
        for e in dead:
            dropped.add(id(e))
            inits.update(v for v in e.invars if isinstance(v, Var))
    eqns = [e for e in jaxpr.eqns if id(e) not in dropped]
    invars = [*jaxpr.invars, *(refs[k] for k in order)]
    effects = _core.join_effects(*(e.effects for e in eqns))
    info = jaxpr.debug_info
    if info is not None:
        info = info._replace(arg_names=(*info.arg_names, *([""] * count)))
    return closed.replace(jaxpr=jaxpr.replace(invars=invars, eqns=eqns, effects=effects,
                                              debug_info=info))


def _creates_refs_inside(jaxpr: Jaxpr) -> bool:
    """Whether a jaxpr nested in ``jaxpr``'s eqns creates a ref."""
    def inner(v: Any) -> list[Jaxpr]:
        if isinstance(v, ClosedJaxpr):
            return [v.jaxpr]
        if isinstance(v, Jaxpr):
            return [v]
        if isinstance(v, tuple):
            return [j for b in v for j in inner(b)]
        return []

    pending = [j for e in jaxpr.eqns for v in e.params.values() for j in inner(v)]
    while pending:
        sub = pending.pop()
        for eqn in sub.eqns:
            if eqn.primitive.name == "new_ref":
                return True
            pending += [j for v in eqn.params.values() for j in inner(v)]
    return False


def saturate_ref_indices(closed: ClosedJaxpr) -> ClosedJaxpr:
    """``closed`` with every scalar index of a ``get``/``swap``/``addupdate`` (``x[i]``,
    ``x[ds(i, n)]``) of an integer type wider than int32 first clamped into int32's range,
    in nested jaxprs too.

    JAX's state discharge casts such indices to int32, so under x64 ``x[2**32 + 1]`` would
    read row 1; clamped first, it stays past the end and is clamped back into range as
    ``lax.dynamic_slice`` clamps, as the compiled kernels index."""

    def saturate(eqn: JaxprEqn) -> list[JaxprEqn]:
        if eqn.primitive.name not in ("get", "swap", "addupdate"):
            return [eqn]
        eqns, invars = [], list(eqn.invars)
        for n in range(1 if eqn.primitive.name == "get" else 2, len(invars)):
            if _wide_index(invars[n]):
                invars[n], extra = _saturating_eqns(invars[n], eqn)
                eqns += extra
        return [*eqns, eqn.replace(invars=invars)]

    return _map_eqns(closed, saturate)


_NARROW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_ACCUMULATING = ("cumsum", "cumprod", "cumlogsumexp", "reduce_sum", "reduce_prod")


def _converted(atom: Any, dtype: np.dtype, eqn: JaxprEqn) -> tuple[Var, JaxprEqn]:
    """A new var holding ``atom`` converted to ``dtype``, and the eqn that computes it."""
    out = Var(atom.aval.update(dtype=dtype, weak_type=False))
    return out, _core.new_jaxpr_eqn(
        [atom], [out], lax.convert_element_type_p,
        {"new_dtype": dtype, "weak_type": False, "sharding": None}, set(), eqn.source_info)


def widen_narrow_accumulation(closed: ClosedJaxpr) -> ClosedJaxpr:
    """``closed`` with every float16/bfloat16 sum and product (``reduce_sum``,
    ``reduce_prod``, ``cumsum``, ``cumprod``, ``cumlogsumexp``) computed in float32 and
    rounded once, in nested jaxprs too.

    XLA:CPU runs these in the 16-bit type, rounding every partial sum (``jnp.cumsum`` of
    512 bfloat16 ones is not exact), while jaxtile's rule, which the compiled kernels follow
    (``passes/wide_accumulation``), is that 16-bit sums, scans and products accumulate in
    float32 and are rounded once when stored: the reference semantics follow the rule too."""
    f32 = np.dtype(np.float32)

    def widen(eqn: JaxprEqn) -> list[JaxprEqn]:
        if (eqn.primitive.name not in _ACCUMULATING
                or np.dtype(eqn.outvars[0].aval.dtype) not in _NARROW_FLOATS):
            return [eqn]
        wide_in, to_wide = _converted(eqn.invars[0], f32, eqn)
        wide_out = Var(eqn.outvars[0].aval.update(dtype=f32, weak_type=False))
        narrow = np.dtype(eqn.outvars[0].aval.dtype)
        back = _core.new_jaxpr_eqn(
            [wide_out], [eqn.outvars[0]], lax.convert_element_type_p,
            {"new_dtype": narrow, "weak_type": False, "sharding": None}, set(),
            eqn.source_info)
        return [to_wide, eqn.replace(invars=[wide_in], outvars=[wide_out]), back]

    return _map_eqns(closed, widen)


def register_profiler_plugin(pjrt_api: Any) -> bool:
    """Have ``jax.profiler`` traces call a profiler plugin: ``pjrt_api`` is a ``pjrt_c_api``
    capsule whose extension chain holds a profiler extension (what PJRT plugins such as
    libtpu register theirs with). False, doing nothing, where this jaxlib lacks the hook."""
    from jax._src.lib import _profiler

    register = getattr(_profiler, "register_plugin_profiler", None)
    if register is None:
        return False
    register(pjrt_api)
    return True
