"""Running a kernel per shard under ``jax.jit`` with sharded inputs.

An FFI custom call is opaque to XLA's partitioner, which would gather every operand onto
each device. A kernel that declares a :class:`ShardRule` is instead wrapped in
``jax.experimental.custom_partitioning``: the rule (einsum-like, e.g. ``"m k, k n -> m n"``)
names each dimension, and the *parallel* factors are those along which the kernel's blocks
are independent (rows of a softmax, ``m`` and ``n`` of a matmul, every vmap axis). Those may
stay sharded; every other factor is replicated. Each device then runs the kernel specialised
for its local shapes, with no collective in between.

A kernel declared without a rule gets one inferred from how its grid indexes its arguments
and outputs (:func:`infer_rule`, from ``compiler/passes/shard_inference.py``); an explicit
rule wins.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from jaxtile.compiler import ir
from jaxtile.compiler.passes.shard_inference import infer_parallel_dims

from .kernel_call import KernelHandle, kernel_call_p


@dataclasses.dataclass(frozen=True)
class ShardRule:
    """How a kernel may be split across devices.

    ``rule`` maps each dimension of each argument and output to a factor name, einsum-like:
    ``"r c -> r c"``; ``parallel`` lists the factors along which the kernel's blocks are
    independent, so that a shard of the inputs gives exactly the matching shard of the
    outputs.

    ``multiple_of`` gives, for some parallel factors, a number each device's shard of them
    must be a multiple of (the kernel's block size along it, where its blocks depend on
    each other's elements); a factor whose shards would not be stays replicated.

    >>> jt.kernel(sharding=jt.ShardRule("r c -> r c", parallel="r"))   # doctest: +SKIP
    """

    rule: str
    parallel: tuple[str, ...] | str = ()
    multiple_of: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.parallel, str):
            object.__setattr__(self, "parallel", tuple(self.parallel.split()))
        operands, results = self.mappings()
        factors = {f for m in operands + results for f in m}
        unknown = set(self.parallel) - factors
        if unknown:
            raise ValueError(f"ShardRule: parallel factors {sorted(unknown)} do not appear in "
                             f"{self.rule!r}")
        stray = {f for f, _ in self.multiple_of} - set(self.parallel)
        if stray:
            raise ValueError(f"ShardRule: multiple_of names {sorted(stray)}, which are not "
                             "parallel factors")

    def mappings(self) -> tuple[list[list[str]], list[list[str]]]:
        """The factor names of each operand's and each result's dimensions."""
        if "->" not in self.rule:
            raise ValueError(f"ShardRule: {self.rule!r} needs '->' between arguments and "
                             "outputs")
        lhs, rhs = self.rule.split("->")
        split = lambda side: [part.split() for part in side.split(",")]  # noqa: E731
        return split(lhs), split(rhs)

    def with_batch(self, batched_levels: Sequence[Sequence[bool]]) -> ShardRule:
        """The rule of a vmapped kernel: one parallel factor per batch level, in front of
        the batched arguments and of every output (outermost level first)."""
        operands, results = self.mappings()
        names = [f"jtbatch{i}" for i in range(len(batched_levels))]
        operands = [[n for n, level in zip(names, batched_levels) if level[i]] + dims
                    for i, dims in enumerate(operands)]
        results = [names + dims for dims in results]
        text = (", ".join(" ".join(d) for d in operands) + " -> "
                + ", ".join(" ".join(d) for d in results))
        return ShardRule(text, tuple(self.parallel) + tuple(names), self.multiple_of)

    @property
    def replicated(self) -> tuple[str, ...]:
        operands, results = self.mappings()
        seen: list[str] = []
        for dims in operands + results:
            seen += [f for f in dims if f not in seen and f not in self.parallel]
        return tuple(seen)


def _mesh_axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple | list) else (entry,)


def _parallel_axes(rule: ShardRule, mesh: Any, arg_shapes: Sequence[Any]) -> dict[str, tuple]:
    """Mesh axes for each parallel factor, taken from the operands' shardings, kept only
    where they divide the dimension."""
    operands, _ = rule.mappings()
    multiple = dict(rule.multiple_of)
    axes: dict[str, tuple] = {}
    for dims, arg in zip(operands, arg_shapes):
        sharding = getattr(arg, "sharding", None)
        if not isinstance(sharding, NamedSharding):
            continue
        spec = tuple(sharding.spec) + (None,) * (len(dims) - len(sharding.spec))
        for factor, entry, size in zip(dims, spec, arg.shape):
            names = _mesh_axes(entry)
            if not names or factor not in rule.parallel or factor in axes:
                continue
            shards = math.prod(mesh.shape[n] for n in names)
            if size % shards == 0 and (size // shards) % multiple.get(factor, 1) == 0:
                axes[factor] = names
    return axes


def _sharding(mesh: Any, dims: Sequence[str], axes: dict[str, tuple]) -> NamedSharding:
    entries = []
    for f in dims:
        names = axes.get(f, ())
        entries.append(None if not names else names[0] if len(names) == 1 else names)
    return NamedSharding(mesh, PartitionSpec(*entries))


def _local_shape(shape: Sequence[int], dims: Sequence[str], axes: dict[str, tuple],
                 mesh: Any) -> tuple[int, ...]:
    return tuple(n // math.prod(mesh.shape[a] for a in axes.get(f, ())) for n, f in
                 zip(shape, dims))


def sharded_call(*args: Any, kernel: KernelHandle, rule: ShardRule) -> list[Any]:
    """``kernel_call`` wrapped so that XLA's partitioner runs it per shard (see module doc).

    Used by the lowering, after batching and differentiation are done (custom_partitioning
    has no batching or AD rules of its own). ``kernel.spec.resized(shapes)`` gives the
    handle specialised for local argument shapes.
    """
    operands, results = rule.mappings()

    @custom_partitioning
    def call(*xs):
        return tuple(kernel_call_p.bind(*xs, kernel=kernel))

    def infer(mesh, arg_shapes, result_shape):
        axes = _parallel_axes(rule, mesh, arg_shapes)
        return tuple(_sharding(mesh, dims, axes) for dims in results)

    def partition(mesh, arg_shapes, result_shape):
        axes = _parallel_axes(rule, mesh, arg_shapes)
        local = dataclasses.replace(
            kernel.spec.resized([_local_shape(a.shape, dims, axes, mesh)
                                 for a, dims in zip(arg_shapes, operands)]), per_shard=True)

        def lower_fn(*xs):
            return tuple(kernel_call_p.bind(*xs, kernel=local))

        return (mesh, lower_fn, tuple(_sharding(mesh, dims, axes) for dims in results),
                tuple(_sharding(mesh, dims, axes) for dims in operands))

    call.def_partition(partition=partition, infer_sharding_from_operands=infer,
                       sharding_rule=rule.rule, need_replication_factors=rule.replicated)
    return list(call(*args))


def infer_rule(kernel: ir.Kernel) -> tuple[ShardRule | None, str]:
    """The rule the kernel's grid implies (see ``compiler/passes/shard_inference.py``), and a
    sentence saying what was inferred or, with None, why nothing was.

    Each grid axis found parallel becomes a factor ``gridN`` whose shards must be multiples
    of the block size; every other dimension gets a factor of its own and is replicated.
    """
    if not any(b.role == "input" for b in kernel.params):
        return None, "not inferred, the kernel runs unsharded: it has no inputs"
    found = infer_parallel_dims(kernel)
    if not found.parallel:
        return None, "not inferred, the kernel runs unsharded: " + "; ".join(found.declined)
    params = [b for b in kernel.params if b.role != "init"]
    names = [[f"grid{a}" if a is not None else f"d_{buf.name}_{d}" for d, a in enumerate(row)]
             for buf, row in zip(params, found.dims)]
    sides = [", ".join(" ".join(n) for n, b in zip(names, params) if b.role == role)
             for role in ("input", "output")]
    rule = ShardRule(" -> ".join(sides), tuple(f"grid{a}" for a in found.parallel),
                     tuple((f"grid{a}", size) for a, size in found.parallel.items()))
    notes = f"; not split: {'; '.join(found.declined)}" if found.declined else ""
    return rule, f"inferred {rule}{notes}"
