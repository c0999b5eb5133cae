"""``pallas_call`` as one jaxtile kernel: grid, BlockSpecs, program ids, loops.

A ``pallas_call`` builds a ``jt.kernel`` whose body declares the outputs, the grid (every
Pallas grid axis is parallel, as in Pallas' Triton semantics, so it is jaxtile's launch
grid; a grid of more than three axes folds its trailing axes into the third), makes one
:class:`~jaxtile.pallas._refs.BlockRef` per operand from its BlockSpec (the index map's block
indices times the block shape give the origin; ``None`` dimensions are squeezed) and runs
the Pallas kernel on them. The kernel then traces like any jaxtile body, so the call's jaxpr
holds jaxtile's kernel primitive, and ``jit``, ``vmap``, ``jax.export`` and every backend
work as for any jaxtile kernel.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

import jaxtile as jt
from jaxtile import _config, _trace
from jaxtile.compiler.errors import kernel_error, user_line
from jaxtile.compiler.target import parse_target

from ._refs import BlockRef, _Dim

_local = threading.local()


def _unsupported(feature: str, hint: str = "") -> jt.KernelError:
    """The error for a Pallas feature jaxtile does not map, at the user's line."""
    state = getattr(_trace._local, "state", None)
    message = f"{feature} is not supported by jaxtile.pallas" + (f"; {hint}" if hint else "")
    if state is not None:
        return state.error(message)
    return kernel_error("pallas_call", message, user_line())


@dataclasses.dataclass(frozen=True)
class _Program:
    """The grid of the ``pallas_call`` being traced and its block indices."""

    grid: tuple[int, ...]
    ids: tuple[Any, ...]
    num_stages: int


def _program(api: str) -> _Program:
    stack = getattr(_local, "programs", None)
    if not stack:
        raise jt.KernelError(f"{api} can only be used inside a kernel run by pallas_call")
    return stack[-1]


def program_id(axis: int) -> jax.Array:
    """The index of the running program (block) along grid axis ``axis``."""
    p = _program("pl.program_id")
    if not 0 <= axis < len(p.grid):
        raise _unsupported(f"pl.program_id({axis}) on a grid of rank {len(p.grid)}")
    return p.ids[axis]


def num_programs(axis: int) -> int:
    """The grid's extent along ``axis`` (a static int)."""
    p = _program("pl.num_programs")
    if not 0 <= axis < len(p.grid):
        raise _unsupported(f"pl.num_programs({axis}) on a grid of rank {len(p.grid)}")
    return p.grid[axis]


def _grid_ids(grid: tuple[int, ...]) -> tuple[Any, ...]:
    """Declare the launch grid and return one block index per Pallas grid axis."""
    if not grid:
        return ()
    if len(grid) <= 3:
        ids = jt.grid(*grid)
        return ids if isinstance(ids, tuple) else (ids,)
    x, y, folded = jt.grid(grid[0], grid[1], math.prod(grid[2:]))
    rest = []
    for n in reversed(grid[2:]):
        rest.append(folded % n)
        folded = folded // n
    return (x, y, *reversed(rest))


# -- BlockSpec ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """The block of an operand each program sees: ``block_shape`` (``None`` or
    ``pl.squeezed`` for a dimension the kernel does not see) and ``index_map``, from the
    program ids to block indices (times the block shape, the block's origin)."""

    block_shape: Sequence[int | None] | None = None
    index_map: Callable[..., Any] | None = None
    memory_space: Any = None
    pipeline_mode: Any = None

    def __post_init__(self) -> None:
        if self.memory_space is not None:
            raise _unsupported(f"BlockSpec(memory_space={self.memory_space!r})",
                               "blocks are copied into on-chip tiles by jaxtile")
        if self.pipeline_mode is not None:
            raise _unsupported("BlockSpec(pipeline_mode=...)",
                               "use CompilerParams(num_stages=) for loop pipelining")


@dataclasses.dataclass(frozen=True)
class GridSpec:
    """The grid and block specs of a ``pallas_call``, as one object."""

    grid: Any = ()
    in_specs: Any = None
    out_specs: Any = None
    scratch_shapes: Any = ()


no_block_spec = BlockSpec()


def _is_squeezed(b: Any) -> bool:
    return b is None or type(b).__name__ == "Squeezed"


def _block_ref(ref: Any, spec: BlockSpec | None, ids: tuple[Any, ...]) -> BlockRef:
    if spec is None or spec.block_shape is None:
        return BlockRef.whole(ref)
    shape = tuple(spec.block_shape)
    if len(shape) != len(ref.shape):
        raise _unsupported(f"a BlockSpec of rank {len(shape)} for an operand of shape "
                           f"{tuple(ref.shape)}", "give one block dimension per operand "
                           "dimension")
    for b in shape:
        if not (_is_squeezed(b) or isinstance(b, int)):
            raise _unsupported(f"the block dimension {b!r}",
                               "block dimensions are ints or None (squeezed)")
    if spec.index_map is None:
        indices: tuple[Any, ...] = (0,) * len(shape)
    else:
        indices = spec.index_map(*ids)
        indices = tuple(indices) if isinstance(indices, tuple | list) else (indices,)
    if len(indices) != len(shape):
        raise _unsupported(f"an index map returning {len(indices)} indices for a block of "
                           f"rank {len(shape)}")
    dims = []
    for b, i in zip(shape, indices):
        i = jnp.asarray(i, jnp.int32) if not isinstance(i, int) else i
        dims.append(_Dim(i, None) if _is_squeezed(b) else _Dim(i * b, b))
    return BlockRef(ref, dims)


def _leaves(tree: Any) -> list[Any]:
    return jax.tree.leaves(tree, is_leaf=lambda x: x is None or isinstance(x, BlockSpec))


def _specs_for(specs: Any, args: tuple[Any, ...], what: str) -> list[BlockSpec | None]:
    """One spec per array leaf of ``args``: a spec given per top-level argument applies to
    all of that argument's leaves (none for an argument that is None); ``no_block_spec``
    (or none given) means whole operands."""
    n = len(jax.tree.leaves(args))
    if specs is None or specs is no_block_spec:
        return [None] * n
    specs = list(specs) if isinstance(specs, list | tuple) else [specs]
    if len(specs) == len(args):
        out = []
        for spec, arg in zip(specs, args):
            out += [None if spec is no_block_spec else spec] * len(jax.tree.leaves(arg))
        return out
    leaves = _leaves(specs)
    if len(leaves) != n:
        raise _unsupported(f"{len(leaves)} {what} for {n} operands",
                           f"give one BlockSpec (or None) per {what[:-6]}")
    return [None if s is no_block_spec else s for s in leaves]


def _warp_size() -> int:
    """The lanes of a warp on the target the active backend compiles for: Triton counts
    ``num_warps`` in 64-lane wavefronts on AMD GPUs and in 32-lane warps on NVIDIA's (on the
    CPU the count only sizes the block)."""
    caps = parse_target(_config.BACKENDS[jt.backend()]).caps
    return int(getattr(caps, "warp_size", 32))


def _threads(compiler_params: Any) -> tuple[int, int]:
    """``(threads, stages)`` from the CompilerParams (Triton's defaults: 4 warps, 3 stages)."""
    if compiler_params is None:
        return 4 * _warp_size(), 3
    if isinstance(compiler_params, dict):
        compiler_params = compiler_params.get("triton", compiler_params)
    if type(compiler_params).__name__ != "CompilerParams" or not hasattr(
            compiler_params, "num_warps"):
        raise _unsupported(f"compiler_params of type {type(compiler_params).__name__}",
                           "give jaxtile.pallas.triton.CompilerParams(num_warps=, "
                           "num_stages=)")
    warps = compiler_params.num_warps or 4
    stages = compiler_params.num_stages or 3
    return _warp_size() * int(warps), int(stages)


def pallas_call(kernel: Callable[..., None], out_shape: Any, *, grid_spec: GridSpec | None = None,
                grid: Any = (), in_specs: Any = no_block_spec, out_specs: Any = no_block_spec,
                scratch_shapes: Any = (), input_output_aliases: dict[int, int] | None = None,
                debug: bool = False, interpret: Any = False, name: str | None = None,
                compiler_params: Any = None, cost_estimate: Any = None,
                backend: Any = None, metadata: Any = None) -> Callable[..., Any]:
    """Compile the Pallas ``kernel`` into one jaxtile kernel; return the function that calls
    it on operands, as ``jax.experimental.pallas.pallas_call`` does.

    ``interpret=True`` runs jaxtile's reference semantics (the body as plain JAX ops)
    instead of compiling; ``debug`` prints nothing extra (``kernel.lower(...)`` shows the
    IR); ``cost_estimate``, ``metadata`` and ``backend`` are accepted and ignored.
    """
    del cost_estimate, metadata, backend, debug
    aliases = dict(input_output_aliases or {})
    if grid_spec is not None:
        if type(grid_spec).__name__ != "GridSpec" or not isinstance(grid_spec, GridSpec):
            raise _unsupported(f"a grid_spec of type {type(grid_spec).__name__} (TPU "
                               "PrefetchScalarGridSpec and the like)")
        grid, in_specs, out_specs = grid_spec.grid, grid_spec.in_specs, grid_spec.out_specs
        scratch_shapes = grid_spec.scratch_shapes
    grid = (grid,) if isinstance(grid, int) else tuple(grid or ())
    if not all(isinstance(g, int) for g in grid):
        raise _unsupported(f"the dynamic grid {grid}", "grid extents are Python ints")
    threads, stages = _threads(compiler_params)
    outs, out_tree = jax.tree.flatten(out_shape)
    scratch = list(scratch_shapes or ())
    for s in scratch:
        if not (hasattr(s, "shape") and hasattr(s, "dtype")) or \
                getattr(s, "memory_space", None) is not None:
            raise _unsupported(f"the scratch shape {s!r}",
                               "give jax.ShapeDtypeStruct scratch shapes")
    kernel_name = name or getattr(getattr(kernel, "func", kernel), "__name__", "pallas")

    def call(*args: Any) -> Any:
        flat, _ = jax.tree.flatten(args)
        ins = _specs_for(in_specs, args, "in_specs")
        outspecs = _specs_for(out_specs, tuple(outs), "out_specs")
        _check_aliases(aliases, flat, outs, outspecs, grid)

        def body(*refs: Any) -> tuple[Any, ...]:
            results = [jt.empty(o.shape, o.dtype) for o in outs]
            ids = _grid_ids(grid)
            stack = _local.__dict__.setdefault("programs", [])
            stack.append(_Program(grid, ids, stages))
            try:
                in_refs = [_block_ref(r, s, ids) for r, s in zip(refs, ins)]
                out_refs = [_block_ref(r, s, ids) for r, s in zip(results, outspecs)]
                scratch_refs = [BlockRef.whole(jt.fragment(s.shape, s.dtype))
                                for s in scratch]
                for i, o in aliases.items():
                    # The aliased output starts as the input: each program's block first
                    # takes the input's values there (the blocks tile the output).
                    out_refs[o].store(BlockRef(refs[i], out_refs[o].dims).load())
                kernel(*jax.tree.unflatten(jax.tree.structure(args), in_refs), *out_refs,
                       *scratch_refs)
            finally:
                stack.pop()
            return tuple(results)

        compiled = jt.kernel(_Body(body, kernel, len(flat)), threads=threads, name=kernel_name,
                             interpret=True if interpret is True else None)
        return jax.tree.unflatten(out_tree, list(compiled(*flat)))

    return call


def _check_aliases(aliases: dict[int, int], flat: list[Any], outs: list[Any],
                   outspecs: list[BlockSpec | None], grid: tuple[int, ...]) -> None:
    """``input_output_aliases`` the layer can honour: an output the same shape and dtype as
    its input, written by blocks of a BlockSpec (each program starts its block from the
    input's values) or by the only program of the grid."""
    for i, o in aliases.items():
        if not (0 <= i < len(flat) and 0 <= o < len(outs)):
            raise _unsupported(f"input_output_aliases {{{i}: {o}}} out of range for "
                               f"{len(flat)} inputs and {len(outs)} outputs")
        a, b = flat[i], outs[o]
        if tuple(a.shape) != tuple(b.shape) or jnp.dtype(a.dtype) != jnp.dtype(b.dtype):
            raise _unsupported(f"input_output_aliases {{{i}: {o}}} between an input "
                               f"{a.dtype}{list(a.shape)} and an output "
                               f"{jnp.dtype(b.dtype)}{list(b.shape)}")
        spec = outspecs[o]
        if (spec is None or spec.block_shape is None) and math.prod(grid) > 1:
            raise _unsupported(f"input_output_aliases {{{i}: {o}}} for an output without "
                               "a BlockSpec on a grid of several programs",
                               "give the output a BlockSpec, or return the updated array "
                               "as an ordinary output")


class _Body:
    """The jaxtile kernel body of a ``pallas_call``: ``n`` positional array parameters, and
    the Pallas kernel's code as its own, so that jaxtile reports the kernel's definition
    (not this module) where it names the body (a compiler failure)."""

    def __init__(self, run: Callable[..., Any], kernel: Callable[..., Any], n: int):
        self._run = run
        self.__name__ = run.__name__
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(n)])
        code = getattr(getattr(kernel, "func", kernel), "__code__", None)
        if code is not None:
            self.__code__ = code

    def __call__(self, *refs: Any) -> Any:
        return self._run(*refs)


# -- control flow and helpers ---------------------------------------------------------------
def cdiv(a: Any, b: Any) -> Any:
    """Ceiling division, for ints or traced integer scalars."""
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return (a + b - 1) // b


def next_power_of_2(x: int) -> int:
    """The smallest power of two >= ``x`` (1 for 0)."""
    if x < 0:
        raise ValueError(f"next_power_of_2 of a negative number: {x}")
    return 1 if x == 0 else 1 << (x - 1).bit_length()


def ds(start: Any, size: int | None = None, stride: int = 1) -> Any:
    """A slice ``[start, start + size)`` of a ref dimension (``ds(n)``: ``[0, n)``)."""
    if size is None:
        start, size = 0, start
    if stride != 1:
        raise _unsupported(f"pl.ds(..., stride={stride})")
    return jt.ds(start, size)


dslice = ds


def when(condition: Any) -> Callable[[Callable[[], None]], None]:
    """Run the decorated function where ``condition`` holds (a Python bool decides now)."""
    def deco(f: Callable[[], None]) -> None:
        if isinstance(condition, bool):
            if condition:
                f()
        else:
            jt.when(condition)(f)
    return deco


def loop(lower: Any, upper: Any, *, init_carry: Any = None, step: Any = 1,
         unroll: Any = None) -> Callable[[Callable[..., Any]], Any]:
    """``@pl.loop(lower, upper)``: a device loop over ``range(lower, upper, step)``. With
    ``init_carry`` the body takes and returns a carry (a ``lax.fori_loop``); without it, a
    loop from 0 is jaxtile's pipelined loop, ``num_stages`` deep."""
    del unroll

    def deco(body: Callable[..., Any]) -> Any:
        if init_carry is not None:
            n = cdiv(upper - lower, step)
            return lax.fori_loop(0, n, lambda k, c: body(lower + k * step, c), init_carry)
        n = cdiv(upper - lower, step) if not (isinstance(step, int) and step == 1) \
            else upper - lower
        stages = _program("pl.loop").num_stages
        run = jt.pipelined(n, stages=stages) if stages > 1 else jt.loop(n)
        run(lambda k: body(lower + k * step))
        return None
    return deco
