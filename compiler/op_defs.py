"""One definition per Tile IR op kind.

An :class:`OpDef` says everything passes need to know about an op without looking at its
kind: how many operands it takes, its attributes and their types, the rule its result obeys,
the buffer regions it reads and writes, whether it is pure, whether it works element by
element, its layout rule (:data:`LAYOUT_RULES`) and how its scalar result evaluates on
integers (:func:`evaluate`). The verifier checks every op against its definition; DCE,
fusion, scratch initialisation, coverage, barrier insertion, layout inference and the scalar
analyses ask the definition instead of matching kinds. Its fields are keywords
(``OpDef(kind="fence", arity=(0,), has_result=False, pure=False, per_element=False)``).

Each backend lowers ops through its own :class:`Lowerings` registry (``@lowers("reduce")``);
``docs/operations.md`` shows which kinds each backend lowers and which dtypes they accept
(:data:`DTYPES`, ``operations_doc.py``).

=============  =====================================================================
``const``      ``value``: a Python scalar broadcast to the result shape
``iota``       ``dimension``: the result dimension that counts
``elementwise``  ``fn``: name in :data:`UNARY` or :data:`BINARY`; operands are scalars or
               have the result's rank with each dimension equal to the result's or 1
``convert``    to the result dtype
``broadcast``  ``dims``: operand dim i becomes result dim ``dims[i]``
``reshape``    result shape only (element order preserved)
``transpose``  ``perm``: result dim i is operand dim ``perm[i]``
``reduce``     ``fn`` (:data:`REDUCTIONS`), ``axes``
``select``     operands ``(pred, on_false, on_true)``
``load``       ``src``: region read with JAX ``get`` semantics (dynamic starts clamped)
``store``      ``dst``: region written with JAX ``swap`` semantics; operand: the value
``copy``       ``src``, ``dst``: regions, ``pad``: masked tile copy (reads past a global
               edge give ``pad``, writes past it are dropped), casting to ``dst``'s dtype;
               a region dimension may take its positions from a 1-D integer tile
               (gather, scatter)
``gemm``       ``a``, ``b``, ``c``: 2-D tile regions, ``transpose_a``, ``transpose_b``:
               ``c += op(a) @ op(b)``
``atomic``     ``dst``: region, ``fn`` (add/max/min); operand: the value. Each element is
               updated atomically; writes past a global edge are dropped
``scan``       ``fn`` (sum/prod/max/min), ``axis``, ``reverse``: inclusive running
               reduction along one axis (``jnp.cumsum``, ``lax.cummax``...)
``sort``       ``axis``, ``num_keys``, ``take``, ``descending``, ``total_order``: the
               operands (all of the result's shape) reordered together along ``axis`` by
               their first ``num_keys`` operands, compared in turn, stably (ties keep their
               order); the result is operand ``take`` reordered. Floats compare in XLA's
               order (NaNs last, -0.0 equal to 0.0) or, with ``total_order``, by the IEEE
               total order (-NaN < -inf < -0.0 < 0.0 < inf < NaN: ``lax.top_k``'s)
``rev``        ``dims``: the operand reversed along those dimensions
``slice``      ``start``, ``stride``: the elements ``start + i * stride`` of the operand
``concatenate``  ``dimension``: the operands (one or more) joined along it
``argreduce``  ``fn`` (max/min), ``axis``: index of the first maximum (minimum) along one
               axis, NaN counting as the extreme, as XLA does
``relayout``   the operand in another thread layout (GPU passes insert it where two ops
               demand different layouts of one value; it goes through shared memory)
``barrier``    all threads of a block wait here, and see each other's shared-memory writes
               (GPU passes insert it)
``async_issue``    ``tile``, ``guard``, ``prologue``: issue the staged copies of a pipelined
               loop (their ``issued`` ops) as ``cp.async`` for iteration ``k + tile`` (``k``
               = 0 in the prologue before the loop), skipped past the trip count when
               ``guard`` (the pipelining pass inserts it)
``async_commit``   close the thread's open group of async copies
``async_wait``     ``count``: wait until at most ``count`` of the thread's committed groups
               are in flight
``tma_issue``  ``tile``, ``guard``, ``prologue``, ``bytes``: as ``async_issue``, the staged
               copies made by TMA: one thread announces ``bytes`` on the stage's mbarrier
               and issues the loads, which complete on it
``tma_wait``   wait until the TMA loads of the iteration's stage have landed (its mbarrier's
               phase for this use completed)
``mbarrier_init``  ``stages``, ``count``: declares a TMA ring's ``stages`` mbarriers; one
               thread initialises each to expect ``count`` arrivals, then
               ``fence.mbarrier_init``
``tma_store``  ``src``, ``dst``: a copy from a shared tile to a global output made a TMA
               store: one thread issues it and commits it as a bulk async-group
``tma_store_wait``  ``count``: the issuing thread waits until at most ``count`` of its bulk
               async-groups are in flight (their source reads done)
``tma_release``  a warp-specialised ring's consumers are done with the iteration's stage
               (one arrival per warp on its "empty" mbarrier)
``warp_specialise``  ``consumers``, ``producers``, ``consumer_regs``, ``producer_regs``,
               ``barrier``: the block splits into the kernel's threads (consumers) and a
               producer warpgroup that runs the TMA ring's issues; each role's registers
               per thread (``setmaxnreg``), the consumers' named barrier
``pingpong``   ``warpgroups``, ``barrier``, ``count``: the consumer warpgroups of a split
               kernel take turns at its ring loop's gemms on named barriers ``barrier ..
               barrier + warpgroups - 1`` of ``count`` threads each
``turn_wait``  ``warpgroups``, ``barrier``, ``count``, ``first``; operand: the ring loop's
               variable: the warpgroup waits for its turn (warpgroup 0 not in iteration 0
               where ``first``)
``turn_pass``  the same with ``last``; operands: the loop variable and extent: the
               warpgroup hands the turn to the next (the last not in the last iteration
               where ``last``)
``load_acquire``   ``src``: one element of a global buffer, read with acquire ordering
``store_release``  ``dst``: one element of a global output; operand: the scalar, written
               with release ordering (after all the block's earlier writes)
``fence``      orders the block's global accesses before it against those after it
``print``      ``text``: literal pieces, ``tag``: how many block indices; operands: a bool
               condition, the block indices, the scalar values; one line per block where
               the condition holds (:mod:`.print_format`)
=============  =====================================================================
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from . import semantics, sizes
from .ir import Buffer, Op, Region, Value

UNARY = frozenset({
    "neg", "abs", "sign", "floor", "ceil", "round", "round_away", "exp", "exp2", "log",
    "log1p", "expm1", "tanh", "logistic", "sqrt", "rsqrt", "sin", "cos", "tan", "asin",
    "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "square",
    "not", "is_finite",
})
BINARY = frozenset({
    "add", "sub", "mul", "div", "rem", "max", "min", "pow", "atan2",
    "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "xor",
})
COMPARISONS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
BOOL_RESULTS = COMPARISONS | {"is_finite"}
"""Elementwise functions whose result is bool whatever the operands."""
EXPENSIVE = frozenset({"div", "rem", "pow", "exp", "exp2", "log", "log1p", "expm1", "tanh",
                       "logistic", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos",
                       "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "erf",
                       "erfc"})
"""Elementwise functions worth computing once rather than per use."""
REDUCTIONS = frozenset({"sum", "max", "min", "prod", "and", "or"})
SCANS = frozenset({"sum", "prod", "max", "min"})
ATOMICS = frozenset({"add", "max", "min"})
ATOMIC_DTYPES = frozenset(np.dtype(d) for d in (np.float32, np.float64, np.int32, np.int64))
ARG_REDUCTIONS = frozenset({"max", "min"})

FLOATS = frozenset(np.dtype(d) for d in (np.float16, ml_dtypes.bfloat16, np.float32,
                                          np.float64))
INTEGERS = frozenset(np.dtype(d) for d in (np.int8, np.int16, np.int32, np.int64, np.uint8,
                                            np.uint16, np.uint32, np.uint64))
SIGNED = frozenset(d for d in INTEGERS if np.issubdtype(d, np.signedinteger))
NUMBERS = FLOATS | INTEGERS
BOOL = frozenset({np.dtype(np.bool_)})
COMPUTED = NUMBERS | BOOL
"""The dtypes kernels compute in."""
FLOAT8 = semantics.FLOAT8
"""Storage types: loaded, stored, moved, converted and taken by gemm, never computed in
(arithmetic on them is an error that says to convert first)."""
DTYPES = COMPUTED | FLOAT8
"""Every dtype a kernel's buffers and values may have."""
_FN_DTYPES: dict[str, frozenset[np.dtype]] = {
    **dict.fromkeys(UNARY | BINARY, FLOATS),
    **dict.fromkeys(("add", "sub", "mul", "div", "rem", "neg", "sign", "square"), NUMBERS),
    **dict.fromkeys(COMPARISONS | {"max", "min"}, COMPUTED),
    **dict.fromkeys(("and", "or", "xor", "not"), INTEGERS | BOOL),
    "abs": FLOATS | SIGNED,
}
"""The operand dtypes each elementwise function takes (as ``lax`` defines them)."""

Buffers = Mapping[str, Buffer]
Check = Callable[[Op, Buffers], "str | None"]
Evaluate = Callable[[Op, Sequence[int]], "int | None"]


def _is_scalar(v: Any) -> bool:
    return isinstance(v, bool | int | float) and not isinstance(v, np.generic)


def _is_int_tuple(v: Any) -> bool:
    return isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool)
                                        for x in v)


ATTR_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "scalar": (_is_scalar, "a Python int, float or bool"),
    "pad": (lambda v: v is None or _is_scalar(v), "None or a Python scalar"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an int"),
    "bool": (lambda v: isinstance(v, bool), "a bool"),
    "ints": (_is_int_tuple, "a tuple of ints"),
    "region": (lambda v: isinstance(v, Region), "a buffer region"),
    "elementwise": (lambda v: v in UNARY or v in BINARY, "an elementwise function name"),
    "reduction": (lambda v: v in REDUCTIONS, f"one of {sorted(REDUCTIONS)}"),
    "scan": (lambda v: v in SCANS, f"one of {sorted(SCANS)}"),
    "arg": (lambda v: v in ARG_REDUCTIONS, f"one of {sorted(ARG_REDUCTIONS)}"),
    "atomic": (lambda v: v in ATOMICS, f"one of {sorted(ATOMICS)}"),
    "strs": (lambda v: isinstance(v, tuple) and all(isinstance(x, str) for x in v),
             "a tuple of strs"),
    "size": (lambda v: isinstance(v, int | str) and not isinstance(v, bool)
             and _is_size(v), "an int or a size expression"),
}
"""Attribute types: a test and what it expects, for messages."""


LAYOUT_RULES = frozenset({"same", "broadcast", "transpose", "reduce"})
"""What an op demands of its operands' and result's thread layouts (GPU layout inference):

``same``        every operand that is not uniform takes the result's layout (an operand
                broadcast along some dimensions takes it with those dimensions dropped)
``broadcast``   the operand's layout is the result's with the broadcast dimensions dropped
``transpose``   the operand's layout is the result's permuted by ``perm``
``reduce``      the result's layout is the operand's with the reduced ``axes`` dropped

An op with no rule (``None``) leaves its result's layout to the op's own lowering."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpDef:
    """What an op kind is; see the module docstring. Every field is a keyword."""

    kind: str
    attrs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Attribute name -> type name in :data:`ATTR_TYPES`."""
    arity: tuple[int, ...] | None
    """Allowed numbers of operands (None: one or more)."""
    has_result: bool
    pure: bool
    """No effect besides its result: removable when the result is unused."""
    per_element: bool
    """Result element ``i`` depends only on element ``i`` of each operand (broadcast
    dimensions aside): fusion may recompute it in a consumer that writes where it reads."""
    one_at_a_time: bool = False
    """Each result element can be computed alone from a few operand elements (per-element
    ops and index mappings such as broadcast or transpose, not reductions or scans): what
    fusion may recompute inside a consumer."""
    indexed: bool = False
    """Its regions may have a dimension whose positions are a 1-D index tile (the start is
    a Value of shape ``(size,)``): gather and scatter copies."""
    reads: tuple[str, ...] = ()
    """Region attributes the op reads."""
    writes: tuple[str, ...] = ()
    """Region attributes the op writes (one both read and written is updated in place:
    each element is read and then written by the same thread)."""
    layout: str | None = None
    """Its layout rule, one of :data:`LAYOUT_RULES` (None: none)."""
    evaluate: Evaluate | None = None
    """The integer its scalar result holds, given the integers its operands hold (None
    where the result is not an integer or the op cannot tell): scalar analyses fold
    constants through it instead of knowing each kind."""
    dtypes: frozenset[np.dtype] | Mapping[str, frozenset[np.dtype]] = DTYPES
    """The dtypes of the values and buffer elements it takes (its operands', else its
    regions', else its result's), or per function (the ``fn`` attribute): what
    ``docs/operations.md`` lists and ``tests/compiler/test_operation_matrix.py`` runs."""
    check: Check | None = None
    """Further rules (result shape and dtype, attribute values): returns a message."""

    def accepts(self, fn: str | None = None) -> frozenset[np.dtype]:
        """The dtypes it takes (with function ``fn``, for kinds that have one)."""
        return self.dtypes[fn] if isinstance(self.dtypes, Mapping) else self.dtypes

    def __post_init__(self) -> None:
        if self.layout is not None and self.layout not in LAYOUT_RULES:
            raise ValueError(f"op {self.kind!r}: layout rule {self.layout!r} is not one of "
                             f"{sorted(LAYOUT_RULES)}")
        unknown = set(self.reads + self.writes) - set(self.attrs)
        if unknown:
            raise ValueError(f"op {self.kind!r}: regions {sorted(unknown)} are not attributes")

    def read_regions(self, op: Op) -> list[Region]:
        return [op.attrs[a] for a in self.reads]

    def write_regions(self, op: Op) -> list[Region]:
        return [op.attrs[a] for a in self.writes]


def _broadcastable(v: Value, shape: tuple[int, ...]) -> bool:
    return v.shape == () or (len(v.shape) == len(shape)
                             and all(n in (1, m) for n, m in zip(v.shape, shape)))


def _is_size(v: int | str) -> bool:
    try:
        sizes.symbols(v)
    except ValueError:
        return False
    return True


def _check_print(op: Op, bufs: Buffers) -> str | None:
    """Operands: the condition (a bool), the block's indices (``tag`` int32s), then the values
    (one per gap between the ``text`` pieces); all scalars."""
    when, tag, text = op.operands[0], op.attrs["tag"], op.attrs["text"]
    if any(v.shape != () for v in op.operands):
        return "print: every operand is a scalar"
    if when.dtype != np.bool_:
        return f"print: the condition has dtype {when.dtype}, expected bool"
    if not 0 <= tag <= len(op.operands) - 1 or any(
            v.dtype != np.int32 for v in op.operands[1:1 + tag]):
        return f"print: {tag} block indices (int32) expected after the condition"
    if len(text) != len(op.operands) - tag:
        return (f"print: {len(text)} text pieces for {len(op.operands) - 1 - tag} values "
                "(one more piece than values)")
    return None


def _check_size(op: Op, bufs: Buffers) -> str | None:
    known = set().union(*(sizes.symbols(d) for b in bufs.values() for d in b.shape))
    unknown = sizes.symbols(op.attrs["expr"]) - known
    if unknown:
        return f"size {op.attrs['expr']!r} names no buffer dimension: {sorted(unknown)}"
    if op.result.shape != () or not np.issubdtype(op.result.dtype, np.integer):
        return "a size is an integer scalar"
    return None


def _check_iota(op: Op, bufs: Buffers) -> str | None:
    d = op.attrs["dimension"]
    return None if 0 <= d < len(op.result.shape) else \
        f"iota dimension {d} out of range for rank {len(op.result.shape)}"


def _check_elementwise(op: Op, bufs: Buffers) -> str | None:
    fn, res = op.attrs["fn"], op.result
    want = 1 if fn in UNARY else 2
    if len(op.operands) != want:
        return f"{fn} takes {want} operand(s), got {len(op.operands)}"
    for v in op.operands:
        if not _broadcastable(v, res.shape):
            return f"{fn}: operand shape {v.shape} does not match {res.shape}"
    if len({v.dtype for v in op.operands}) > 1:
        return f"{fn}: operands differ in dtype ({', '.join(str(v.dtype) for v in op.operands)})"
    expected = np.dtype(np.bool_) if fn in BOOL_RESULTS else op.operands[0].dtype
    if res.dtype != expected:
        return f"{fn}: result dtype {res.dtype}, expected {expected}"
    return None


def _check_same_shape(op: Op, bufs: Buffers) -> str | None:
    src = op.operands[0]
    return None if src.shape == op.result.shape else \
        f"{op.kind}: result shape {op.result.shape} differs from operand shape {src.shape}"


def _check_relayout(op: Op, bufs: Buffers) -> str | None:
    src, res = op.operands[0], op.result
    return None if (src.shape, src.dtype) == (res.shape, res.dtype) else \
        "relayout: the result's type differs from the operand's"


def _check_broadcast(op: Op, bufs: Buffers) -> str | None:
    dims, src, res = op.attrs["dims"], op.operands[0], op.result
    if len(dims) != len(src.shape):
        return f"broadcast: {len(dims)} dims for an operand of rank {len(src.shape)}"
    if list(dims) != sorted(set(dims)) or any(not 0 <= d < len(res.shape) for d in dims):
        return f"broadcast: dims {dims} must increase within the result rank {len(res.shape)}"
    if any(n not in (1, res.shape[d]) for n, d in zip(src.shape, dims)):
        return f"broadcast: operand shape {src.shape} does not fit {res.shape} at dims {dims}"
    return None if src.dtype == res.dtype else "broadcast: dtype changes"


def _check_reshape(op: Op, bufs: Buffers) -> str | None:
    src, res = op.operands[0], op.result
    if math.prod(src.shape) != math.prod(res.shape) or src.dtype != res.dtype:
        return f"reshape of {src.dtype}{list(src.shape)} to {res.dtype}{list(res.shape)}"
    return None


def _check_transpose(op: Op, bufs: Buffers) -> str | None:
    perm, src, res = op.attrs["perm"], op.operands[0], op.result
    if sorted(perm) != list(range(len(src.shape))):
        return f"transpose: {perm} is not a permutation of {len(src.shape)} dimensions"
    if res.shape != tuple(src.shape[p] for p in perm):
        return f"transpose: result shape {res.shape} does not match perm {perm}"
    return None


def _check_reduce(op: Op, bufs: Buffers) -> str | None:
    axes, src, res = op.attrs["axes"], op.operands[0], op.result
    rank = len(src.shape)
    if len(set(axes)) != len(axes) or any(not 0 <= a < rank for a in axes):
        return f"reduce over axes {axes} of a rank-{rank} value"
    kept = tuple(n for d, n in enumerate(src.shape) if d not in axes)
    if res.shape != kept or res.dtype != src.dtype:
        return f"reduce: result {res.dtype}{list(res.shape)}, expected {src.dtype}{list(kept)}"
    return None


def _check_along_axis(op: Op, bufs: Buffers) -> str | None:
    """Scans: a result of the operand's type, computed along a valid axis."""
    src, res, axis = op.operands[0], op.result, op.attrs["axis"]
    if not 0 <= axis < len(src.shape):
        return f"{op.kind} along axis {axis} of a rank-{len(src.shape)} value"
    if res.shape != src.shape or res.dtype != src.dtype:
        return f"{op.kind}: the result's type differs from the operand's"
    return None


def _check_sort(op: Op, bufs: Buffers) -> str | None:
    res, axis = op.result, op.attrs["axis"]
    if not 0 <= axis < len(res.shape):
        return f"sort along axis {axis} of a rank-{len(res.shape)} value"
    if any(v.shape != res.shape for v in op.operands):
        return f"sort: operands of shapes {[v.shape for v in op.operands]}, result {res.shape}"
    if not 1 <= op.attrs["num_keys"] <= len(op.operands):
        return f"sort: {op.attrs['num_keys']} keys of {len(op.operands)} operands"
    if not 0 <= op.attrs["take"] < len(op.operands):
        return f"sort: take={op.attrs['take']} of {len(op.operands)} operands"
    if op.operands[op.attrs["take"]].dtype != res.dtype:
        return "sort: the result's type differs from the operand it takes"
    return None


def _check_argreduce(op: Op, bufs: Buffers) -> str | None:
    src, res, axis = op.operands[0], op.result, op.attrs["axis"]
    if not 0 <= axis < len(src.shape) or src.shape[axis] == 0:
        return f"argreduce along axis {axis} of a value of shape {src.shape}"
    kept = tuple(n for d, n in enumerate(src.shape) if d != axis)
    if res.shape != kept or not np.issubdtype(res.dtype, np.integer):
        return f"argreduce: result {res.dtype}{list(res.shape)}, expected an integer {kept}"
    return None


def _check_rev(op: Op, bufs: Buffers) -> str | None:
    dims, src = op.attrs["dims"], op.operands[0]
    if len(set(dims)) != len(dims) or any(not 0 <= d < len(src.shape) for d in dims):
        return f"rev: dims {dims} of a rank-{len(src.shape)} value"
    return _check_same_shape(op, bufs) if op.result.dtype == src.dtype else "rev: dtype changes"


def _check_slice(op: Op, bufs: Buffers) -> str | None:
    start, stride, src, res = op.attrs["start"], op.attrs["stride"], op.operands[0], op.result
    rank = len(src.shape)
    if len(start) != rank or len(stride) != rank or len(res.shape) != rank:
        return f"slice: start {start} and stride {stride} for a rank-{rank} value"
    for s, st, n, m in zip(start, stride, res.shape, src.shape):
        if st < 1 or s < 0 or (n and s + (n - 1) * st >= m):
            return f"slice: {n} elements from {s} by {st} exceed a dimension of {m}"
    return None if res.dtype == src.dtype else "slice: dtype changes"


def _check_concatenate(op: Op, bufs: Buffers) -> str | None:
    d, res = op.attrs["dimension"], op.result
    if not 0 <= d < len(res.shape):
        return f"concatenate along dimension {d} of rank {len(res.shape)}"
    for v in op.operands:
        if (len(v.shape) != len(res.shape) or v.dtype != res.dtype
                or any(a != b for i, (a, b) in enumerate(zip(v.shape, res.shape)) if i != d)):
            return f"concatenate: operand {v.dtype}{list(v.shape)} does not fit {res.shape}"
    if sum(v.shape[d] for v in op.operands) != res.shape[d]:
        return "concatenate: operand sizes do not add up to the result's"
    return None


def _check_select(op: Op, bufs: Buffers) -> str | None:
    pred, on_false, on_true = op.operands
    res = op.result
    if pred.dtype != np.bool_:
        return f"select: predicate of dtype {pred.dtype}"
    if not all(_broadcastable(v, res.shape) for v in op.operands):
        return "select: operand shapes do not match the result"
    if on_false.dtype != res.dtype or on_true.dtype != res.dtype:
        return "select: case dtypes differ from the result"
    return None


def _check_load(op: Op, bufs: Buffers) -> str | None:
    src, res = op.attrs["src"], op.result
    if res.shape != src.shape:
        return (f"load of '{src.buffer}': value shape {res.shape} does not match the indexed "
                f"tile {src.shape}")
    if res.dtype != bufs[src.buffer].dtype:
        return f"load of '{src.buffer}': value dtype {res.dtype} differs from the buffer's"
    return None


def _check_store(op: Op, bufs: Buffers) -> str | None:
    dst, val = op.attrs["dst"], op.operands[0]
    if val.shape != dst.shape:
        return (f"store of '{dst.buffer}': value shape {val.shape} does not match the indexed "
                f"tile {dst.shape}")
    return None


def _check_copy(op: Op, bufs: Buffers) -> str | None:
    if op.attrs["src"].shape != op.attrs["dst"].shape:
        return "jt.copy: source and destination tiles differ in shape"
    return None


def _check_atomic(op: Op, bufs: Buffers) -> str | None:
    dst, val = op.attrs["dst"], op.operands[0]
    dtype = bufs[dst.buffer].dtype
    if dtype not in ATOMIC_DTYPES:
        return f"atomic {op.attrs['fn']} on {dtype}, which has no atomic support"
    if val.shape != dst.shape:
        return f"atomic of '{dst.buffer}': value shape {val.shape} differs from {dst.shape}"
    return None


def _check_flag(op: Op, bufs: Buffers) -> str | None:
    region = op.attrs["src" if op.kind == "load_acquire" else "dst"]
    buf = bufs[region.buffer]
    if buf.scope != "global" or region.shape != ():
        return f"{op.kind} of '{region.buffer}': one element of a global buffer, got {region}"
    if buf.dtype not in ATOMIC_DTYPES:
        return f"{op.kind} of '{region.buffer}': {buf.dtype} has no atomic support"
    value = op.result if op.kind == "load_acquire" else op.operands[0]
    if value.shape != () or value.dtype != buf.dtype:
        return f"{op.kind} of '{region.buffer}': the value must be a {buf.dtype} scalar"
    return None


def _check_gemm(op: Op, bufs: Buffers) -> str | None:
    a, b, c = (op.attrs[r] for r in ("a", "b", "c"))
    for role, r in (("a", a), ("b", b), ("c", c)):
        if bufs[r.buffer].scope == "global":
            return f"jt.gemm: operand {role} must be an on-chip tile"
        if len(r.shape) != 2:
            return f"jt.gemm: operand {role} must be a 2-D tile, got shape {r.shape}"
    (m, k) = a.shape[::-1] if op.attrs["transpose_a"] else a.shape
    (k2, n) = b.shape[::-1] if op.attrs["transpose_b"] else b.shape
    if k != k2 or c.shape != (m, n):
        return (f"jt.gemm: shapes {a.shape} @ {b.shape} -> {c.shape} do not agree "
                f"(transpose_a={op.attrs['transpose_a']}, "
                f"transpose_b={op.attrs['transpose_b']})")
    dtypes = [bufs[r.buffer].dtype for r in (a, b, c)]
    if any(d in FLOAT8 for d in dtypes) and dtypes[2] != np.float32:
        # The stated FP8 semantics: exact products summed in float32, per-tensor scales
        # applied by the user to that float32 result.
        return (f"jt.gemm: {dtypes[0]} x {dtypes[1]} accumulates in float32, not in "
                f"{dtypes[2]}: make c a float32 tile (convert it when storing)")
    return None


def _as_int(value: int, dtype: np.dtype) -> int | None:
    """``value`` as integer ``dtype`` holds it (wrapping around), or None for a dtype that
    is not an integer."""
    if not np.issubdtype(dtype, np.integer):
        return None
    info = np.iinfo(dtype)
    return (value - int(info.min)) % (int(info.max) - int(info.min) + 1) + int(info.min)


def _int_operands(op: Op) -> bool:
    return all(np.issubdtype(v.dtype, np.integer) for v in op.operands)


def _evaluate_const(op: Op, values: Sequence[int]) -> int | None:
    value = op.attrs["value"]
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return _as_int(value, op.result.dtype)


def _evaluate_convert(op: Op, values: Sequence[int]) -> int | None:
    return _as_int(values[0], op.result.dtype) if _int_operands(op) else None


def _quotient(a: int, b: int, dtype: np.dtype) -> int:
    """XLA's integer ``a / b``: truncated toward zero; ``x / 0`` as
    :func:`.semantics.int_div_by_zero` says (``INT_MIN / -1`` wraps to ``INT_MIN``)."""
    if b == 0:
        return semantics.int_div_by_zero(dtype)
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


_INT_FUNCTIONS: dict[str, Callable[..., int]] = {
    "add": lambda a, b, t: a + b, "sub": lambda a, b, t: a - b, "mul": lambda a, b, t: a * b,
    "div": _quotient, "rem": lambda a, b, t: a if b == 0 else a - b * _quotient(a, b, t),
    "max": lambda a, b, t: max(a, b), "min": lambda a, b, t: min(a, b),
    "and": lambda a, b, t: a & b, "or": lambda a, b, t: a | b, "xor": lambda a, b, t: a ^ b,
    "neg": lambda a, t: -a, "abs": lambda a, t: abs(a), "not": lambda a, t: ~a,
    "sign": lambda a, t: (a > 0) - (a < 0), "square": lambda a, t: a * a,
}
"""Integer elementwise functions by name, on Python ints (then wrapped to the dtype)."""


def _evaluate_elementwise(op: Op, values: Sequence[int]) -> int | None:
    fn = _INT_FUNCTIONS.get(op.attrs["fn"])
    if fn is None or not _int_operands(op):
        return None
    return _as_int(fn(*values, op.result.dtype), op.result.dtype)


_DEFS = (
    OpDef(kind="const", attrs={"value": "scalar"}, arity=(0,), has_result=True, pure=True,
          per_element=True, one_at_a_time=True, evaluate=_evaluate_const),
    OpDef(kind="iota", attrs={"dimension": "int"}, arity=(0,), has_result=True, pure=True,
          per_element=False, one_at_a_time=True, check=_check_iota,
          dtypes=NUMBERS),
    OpDef(kind="size", attrs={"expr": "size"}, arity=(0,), has_result=True, pure=True,
          per_element=True, one_at_a_time=True, check=_check_size,
          dtypes=INTEGERS),
    OpDef(kind="elementwise", attrs={"fn": "elementwise"}, arity=(1, 2), has_result=True,
          pure=True, per_element=True, one_at_a_time=True, layout="same",
          evaluate=_evaluate_elementwise, check=_check_elementwise,
          dtypes=_FN_DTYPES),
    OpDef(kind="convert", arity=(1,), has_result=True, pure=True, per_element=True,
          one_at_a_time=True, layout="same", evaluate=_evaluate_convert,
          check=_check_same_shape),
    OpDef(kind="broadcast", attrs={"dims": "ints"}, arity=(1,), has_result=True, pure=True,
          per_element=False, one_at_a_time=True, layout="broadcast", check=_check_broadcast),
    OpDef(kind="reshape", arity=(1,), has_result=True, pure=True, per_element=False,
          one_at_a_time=True, check=_check_reshape),
    OpDef(kind="rev", attrs={"dims": "ints"}, arity=(1,), has_result=True, pure=True,
          per_element=False, one_at_a_time=True, check=_check_rev),
    OpDef(kind="slice", attrs={"start": "ints", "stride": "ints"}, arity=(1,),
          has_result=True, pure=True, per_element=False, one_at_a_time=True,
          check=_check_slice),
    OpDef(kind="concatenate", attrs={"dimension": "int"}, arity=None, has_result=True,
          pure=True, per_element=False, one_at_a_time=True, check=_check_concatenate),
    OpDef(kind="transpose", attrs={"perm": "ints"}, arity=(1,), has_result=True, pure=True,
          per_element=False, one_at_a_time=True, layout="transpose", check=_check_transpose),
    OpDef(kind="reduce", attrs={"fn": "reduction", "axes": "ints"}, arity=(1,),
          has_result=True, pure=True, per_element=False, layout="reduce",
          check=_check_reduce,
          dtypes={"sum": NUMBERS, "prod": NUMBERS, "max": COMPUTED, "min": COMPUTED,
                  "and": INTEGERS | BOOL, "or": INTEGERS | BOOL}),
    OpDef(kind="scan", attrs={"fn": "scan", "axis": "int", "reverse": "bool"}, arity=(1,),
          has_result=True, pure=True, per_element=False, check=_check_along_axis,
          dtypes=dict.fromkeys(SCANS, NUMBERS)),
    OpDef(kind="argreduce", attrs={"fn": "arg", "axis": "int"}, arity=(1,), has_result=True,
          pure=True, per_element=False, check=_check_argreduce,
          dtypes=dict.fromkeys(ARG_REDUCTIONS, COMPUTED)),
    OpDef(kind="sort", attrs={"axis": "int", "num_keys": "int", "take": "int",
                              "descending": "bool", "total_order": "bool"},
          arity=None, has_result=True, pure=True, per_element=False, dtypes=COMPUTED,
          check=_check_sort),
    OpDef(kind="select", arity=(3,), has_result=True, pure=True, per_element=True,
          one_at_a_time=True, layout="same", check=_check_select),
    OpDef(kind="load", attrs={"src": "region"}, arity=(0,), has_result=True, pure=True,
          per_element=True, one_at_a_time=True, reads=("src",), check=_check_load),
    OpDef(kind="store", attrs={"dst": "region"}, arity=(1,), has_result=False, pure=False,
          per_element=False, writes=("dst",), check=_check_store),
    OpDef(kind="copy", attrs={"src": "region", "dst": "region", "pad": "pad"}, arity=(0,),
          has_result=False, pure=False, per_element=False, indexed=True, reads=("src",),
          writes=("dst",), check=_check_copy),
    OpDef(kind="atomic", attrs={"dst": "region", "fn": "atomic"}, arity=(1,),
          has_result=False, pure=False, per_element=False, reads=("dst",), writes=("dst",),
          check=_check_atomic,
          dtypes=dict.fromkeys(ATOMICS, ATOMIC_DTYPES)),
    OpDef(kind="relayout", arity=(1,), has_result=True, pure=True, per_element=False,
          check=_check_relayout),
    # Memory ordering between blocks: never removed, never merged into other ops.
    OpDef(kind="load_acquire", attrs={"src": "region"}, arity=(0,), has_result=True,
          pure=False, per_element=False, reads=("src",), check=_check_flag,
          dtypes=ATOMIC_DTYPES),
    OpDef(kind="store_release", attrs={"dst": "region"}, arity=(1,), has_result=False,
          pure=False, per_element=False, writes=("dst",), check=_check_flag,
          dtypes=ATOMIC_DTYPES),
    OpDef(kind="fence", arity=(0,), has_result=False, pure=False, per_element=False),
    # Printing: never removed, and kept in its place (its line is the program's output).
    OpDef(kind="print", attrs={"text": "strs", "tag": "int"}, arity=None, has_result=False,
          pure=False, per_element=False, dtypes=COMPUTED, check=_check_print),
    OpDef(kind="barrier", arity=(0,), has_result=False, pure=False, per_element=False),
    # The cp.async schedule of a pipelined loop (GPU only): never removed or moved.
    OpDef(kind="async_issue", attrs={"tile": "int", "guard": "bool", "prologue": "bool"},
          arity=(0,), has_result=False, pure=False, per_element=False),
    OpDef(kind="async_commit", arity=(0,), has_result=False, pure=False, per_element=False),
    OpDef(kind="async_wait", attrs={"count": "int"}, arity=(0,), has_result=False, pure=False,
          per_element=False),
    # The same schedule over a ring of mbarriers, where TMA makes the staged copies.
    OpDef(kind="tma_issue", attrs={"tile": "int", "guard": "bool", "prologue": "bool",
                                   "bytes": "int"},
          arity=(0,), has_result=False, pure=False, per_element=False),
    OpDef(kind="tma_wait", arity=(0,), has_result=False, pure=False, per_element=False),
    # A TMA ring's mbarriers, initialised by one thread and fenced (the pipelining pass).
    OpDef(kind="mbarrier_init", attrs={"stages": "int", "count": "int"}, arity=(0,),
          has_result=False, pure=False, per_element=False),
    # TMA stores and their wait (the TMA-store pass makes them from copies).
    OpDef(kind="tma_store", attrs={"src": "region", "dst": "region", "pad": "pad"},
          arity=(0,), has_result=False, pure=False, per_element=False, indexed=True,
          reads=("src",), writes=("dst",), check=_check_copy),
    OpDef(kind="tma_store_wait", attrs={"count": "int"}, arity=(0,), has_result=False,
          pure=False, per_element=False),
    # Warp specialisation of a TMA ring (sm_90a; GPU only): never removed or moved.
    OpDef(kind="tma_release", arity=(0,), has_result=False, pure=False, per_element=False),
    OpDef(kind="warp_specialise", attrs={"consumers": "int", "producers": "int",
                                         "consumer_regs": "int", "producer_regs": "int",
                                         "barrier": "int"},
          arity=(0,), has_result=False, pure=False, per_element=False),
    # Ping-pong scheduling of a split kernel's consumer warpgroups (sm_90a; GPU only).
    OpDef(kind="pingpong", attrs={"warpgroups": "int", "barrier": "int", "count": "int"},
          arity=(0,), has_result=False, pure=False, per_element=False),
    OpDef(kind="turn_wait", attrs={"warpgroups": "int", "barrier": "int", "count": "int",
                                   "first": "bool"},
          arity=(1,), has_result=False, pure=False, per_element=False),
    OpDef(kind="turn_pass", attrs={"warpgroups": "int", "barrier": "int", "count": "int",
                                   "last": "bool"},
          arity=(2,), has_result=False, pure=False, per_element=False),
    OpDef(kind="gemm", attrs={"a": "region", "b": "region", "c": "region",
                              "transpose_a": "bool", "transpose_b": "bool"},
          arity=(0,), has_result=False, pure=False, per_element=False,
          reads=("a", "b", "c"), writes=("c",), check=_check_gemm,
          dtypes=NUMBERS | FLOAT8),
)
OPS: Mapping[str, OpDef] = {d.kind: d for d in _DEFS}


def get(kind: str) -> OpDef:
    """The definition of op kind ``kind`` (KeyError if there is none)."""
    return OPS[kind]


def reads(op: Op) -> list[Region]:
    """The buffer regions ``op`` reads."""
    return OPS[op.kind].read_regions(op)


def writes(op: Op) -> list[Region]:
    """The buffer regions ``op`` writes."""
    return OPS[op.kind].write_regions(op)


def is_pure(op: Op) -> bool:
    return OPS[op.kind].pure


def evaluate(op: Op, values: Sequence[int]) -> int | None:
    """The integer ``op``'s scalar result holds when its operands hold ``values``, or None
    where that is not an integer or the op's definition cannot tell (see
    :attr:`OpDef.evaluate`)."""
    d = OPS[op.kind]
    if d.evaluate is None or op.result is None or op.result.shape != ():
        return None
    return d.evaluate(op, values)


class Lowerings:
    """One backend's lowering functions, by op kind. A backend makes one and registers
    with it as a decorator, ``@lowers("reduce")`` (several kinds may share a function), or
    from a table; a kind with no entry is one the backend does not lower, which
    ``docs/operations.md`` lists (``operations_doc.py`` reads :meth:`kinds`)."""

    def __init__(self, backend: str, table: Mapping[str, Callable[..., Any]] | None = None):
        self.backend = backend
        self._by_kind: dict[str, Callable[..., Any]] = {}
        for kind, fn in (table or {}).items():
            self(kind)(fn)

    def __call__(self, *kinds: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            for kind in kinds:
                if kind not in OPS:
                    raise ValueError(f"{self.backend}: lowering for unknown op kind {kind!r}")
                if kind in self._by_kind:
                    raise ValueError(f"{self.backend}: op kind {kind!r} is lowered twice")
                self._by_kind[kind] = fn
            return fn
        return register

    def get(self, kind: str) -> Callable[..., Any] | None:
        """The function lowering ``kind``, or None if this backend does not lower it."""
        return self._by_kind.get(kind)

    def kinds(self) -> frozenset[str]:
        return frozenset(self._by_kind)
