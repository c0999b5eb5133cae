"""One specialisation of a kernel: its trace, Tile IR, compiled handle, reference semantics,
batched variants and differentiation rule.

A specialisation is what ``kernel_call`` carries (as ``KernelHandle.spec``) so that the
primitive's rules can ask for a batched kernel or for the rule the user gave with
``Kernel.defvjp``, without the primitives layer importing the frontend.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxtile.compiler import build, cache, compile_log
from jaxtile.compiler import ir as tile_ir
from jaxtile.compiler import jax_internals as ji
from jaxtile.compiler.errors import KernelError, kernel_error
from jaxtile.compiler.target import HIP_ARCHS, ISA_LEVELS, Target, parse_target
from jaxtile.primitives import kernel_call, reference
from jaxtile.primitives.sharding import ShardRule, infer_rule

from . import _config, _trace

_early_builds = True
"""Whether making a handle starts its CPU build (:meth:`Specialisation._start_build`)."""


@contextlib.contextmanager
def no_early_builds() -> Iterator[None]:
    """Trace kernel calls without starting their builds for this host: for ``jaxtile
    prebuild --library``, which traces the library's calls to find their kernels and
    compiles them for other targets (ISA levels) only."""
    global _early_builds
    before, _early_builds = _early_builds, False
    try:
        yield
    finally:
        _early_builds = before


class Tiles(NamedTuple):
    """How a kernel with a tile rule got its parameters."""

    fixed: frozenset[str]
    """The names the call set itself."""
    chosen: frozenset[str]
    """The names the tile rule chose values for."""
    target: Target
    """The target it chose them for."""


class Specialisation:
    """A kernel traced for fixed argument shapes/dtypes, parameters and batch levels."""

    def __init__(self, owner: Any, specs: tuple[jax.ShapeDtypeStruct, ...],
                 params: dict[str, Any], batch: tuple[_trace.BatchLevel, ...],
                 backend: str = "cpu", tiles: Tiles | None = None):
        self.owner = owner
        self.specs = specs
        self.params = params
        self.batch = batch
        self.backend = backend
        """What runs the kernel on JAX's CPU platform (see ``jaxtile.set_backend``)."""
        self.tiles = tiles
        """For a kernel with a tile rule: what the call fixed and the target the rest was
        chosen for (see :meth:`for_target`); None for a kernel without one."""
        self._retiled: dict[Target, Specialisation] = {}
        self.dynamic = owner.dynamic if not batch else {}
        """The kernel's dynamic axes (argument position -> axes). A vmapped specialisation
        compiles for its sizes: batch views of dynamic dimensions are not supported yet."""
        called = ", ".join(f"{n}: {s.dtype}{list(s.shape)}"
                           for n, s in zip(owner.arg_names, specs))
        try:
            self.traced = _trace.trace(owner.fn, owner.name, owner.arg_names, specs, params,
                                       batch, owner.threads)
        except KernelError as e:
            raise KernelError(f"{e} [called with {called}]") from None
        self._ir: tile_ir.Kernel | None = None
        self._compiled_ir: tile_ir.Kernel | None = None
        self._handle: kernel_call.KernelHandle | None = None
        self._entries: dict[tuple[Target, bool], cache.Entry] = {}
        self._vjp_started = False
        self._started: dict[Target, Future[cache.Entry]] = {}
        """Builds started when the handle was made (:meth:`_start_build`), by target."""

    @property
    def tile_ir(self) -> tile_ir.Kernel:
        if self._ir is None:
            t = self.traced
            self._ir = build.to_tile_ir(t.name, t.jaxpr, t.buffers, t.grid, self.owner.threads,
                                        t.index_axes)
        return self._ir

    @property
    def compiled_ir(self) -> tile_ir.Kernel:
        """The IR that is compiled: :attr:`tile_ir`, or for a kernel with dynamic sizes the
        same body traced with those sizes symbolic, whose key is the same for every size."""
        if not self.dynamic:
            return self.tile_ir
        if self._compiled_ir is None:
            self.tile_ir  # noqa: B018 - the checks that need sizes run on the concrete trace
            for i, axes in self.dynamic.items():
                if axes[-1] >= len(self.specs[i].shape):
                    raise kernel_error(self.owner.name, f"dynamic axis {axes[-1]} of argument "
                                       f"'{self.owner.arg_names[i]}', which has rank "
                                       f"{len(self.specs[i].shape)}", _definition(self.owner))
            t = _trace.trace(self.owner.fn, self.owner.name, self.owner.arg_names, self.specs,
                             self.params, self.batch, self.owner.threads, self.dynamic)
            self._compiled_ir = build.to_tile_ir(t.name, t.jaxpr, t.buffers, t.grid,
                                                 self.owner.threads, t.index_axes)
        return self._compiled_ir

    @property
    def empty(self) -> bool:
        """Whether a buffer has no elements or the grid no blocks. Such a kernel has nothing
        to compile: its calls run the reference semantics, which handle it exactly."""
        t = self.traced
        return 0 in t.grid or any(0 in b.shape for b in t.buffers)

    def handle(self) -> kernel_call.KernelHandle:
        """The target-neutral description of the kernel that kernel_call carries; each
        platform's lowering compiles it with :meth:`build`."""
        if self._handle is None:
            if self.empty:
                shapes = ", ".join(f"{b.name}{list(b.shape)}" for b in self.traced.buffers)
                raise kernel_error(self.owner.name, "has a zero-size buffer or grid (buffers "
                                   f"{shapes}, grid {list(self.traced.grid)}), which only a "
                                   "direct call of the kernel supports", _definition(self.owner))
            avals = tuple(ji.ShapedArray(b.shape, b.dtype) for b in self.traced.outputs)
            self._handle = kernel_call.KernelHandle(build.ir_key(self.compiled_ir),
                                                    self.owner.name, avals, self,
                                                    label=self.label)
            self._start_build()
        return self._handle

    def _start_build(self) -> None:
        """A handle is made when the kernel enters a program, which is lowered soon after:
        start compiling it for the CPU platform now, on the compile threads, so that the
        kernels of one program (or one gradient) compile side by side; the lowering's
        :meth:`build` then waits for that build. Only where JAX runs on the CPU and the
        kernel runs natively there (the emulator's builds stay in the lowering), and not
        for a kernel with a sharding rule on several devices, whose lowering may run
        per-shard kernels instead."""
        if not _early_builds or jax.default_backend() != "cpu" or (
                jax.device_count() > 1 and self.shard_rule is not None):
            return
        target = self.cpu_platform_target
        if target.kind == "cpu":
            prebuilt = self._level_prebuilt(target)
            if prebuilt is not None:
                self._started[target] = done = Future()
                done.set_result(prebuilt)
            else:
                self._started[target] = build.submit(self.compiled_ir, target)

    def _level_prebuilt(self, target: Target) -> cache.Entry | None:
        """For the host CPU target: the prebuilt entry of this kernel compiled for the
        highest x86-64 level (:data:`ISA_LEVELS`) whose extensions the host has, when no
        entry for the host itself is cached. A host's own key holds its CPU model and every
        ISA flag, so code shipped for many machines (``jaxtile prebuild --library``) is
        built per level instead; a level's code runs on every CPU with its extensions, and
        only levels the host's flags cover are looked up, so code for an ISA the host lacks
        is never loaded. None where the host's entry is cached (it is as fast or faster:
        e.g. AVX512-BF16's ``vdpbf16ps``), where nothing was prebuilt, or for any other
        target (a level target's own key already is a level's)."""
        caps = target.caps
        if target.kind != "cpu" or caps.level != "host" or caps.arch not in ("x86_64", "AMD64"):
            return None
        # Without any prebuilt directory, a compile pays no keys for levels.
        if not any(root.is_dir() for root in cache.prebuilt_dirs()):
            return None
        kernel = self.compiled_ir
        if cache.cached(build.kernel_key(kernel, target)):
            return None
        host = set(caps.isa)
        for level in sorted(ISA_LEVELS, key=lambda name: len(ISA_LEVELS[name]), reverse=True):
            if not host.issuperset(ISA_LEVELS[level]):
                continue
            key = build.kernel_key(kernel, parse_target(f"cpu:{level}"))
            entry, where = cache.find_prebuilt(key)
            if entry is not None:
                compile_log.record(kernel.name, where)
                return entry
        return None

    def start_vjp_builds(self, primals: Sequence[Any]) -> None:
        """Start compiling the kernels of the ``defvjp`` rule, once: evaluating ``fwd``
        then ``bwd`` abstractly traces their kernel calls, whose handles start their builds
        (:meth:`_start_build`). Without this, eager reverse mode compiles each backward
        kernel only when the backward pass reaches it, one after the other. ``primals``:
        the call's arguments (anything with a shape and dtype)."""
        if self._vjp_started:
            return
        self._vjp_started = True
        rule = self.vjp
        if rule is None:
            return
        fwd, bwd = rule
        args = [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in primals]
        cts = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self.handle().out_avals]
        try:
            jax.eval_shape(lambda a, c: bwd(fwd(*a)[1], c), args, cts)
        except Exception:  # noqa: BLE001 - the real passes report their errors where they run
            pass

    @property
    def label(self) -> str:
        """The kernel's name and this specialisation, for profiler traces:
        ``softmax(f32[1000,1000], rows=4)``."""
        args = [ji.ShapedArray(s.shape, s.dtype).str_short(short_dtypes=True)
                for s in self.specs]
        params = [f"{k}={_short(v)}" for k, v in sorted(self.params.items())]
        return f"{self.owner.name}({', '.join(args + params)})"

    @property
    def cpu_platform_target(self) -> Target:
        """The target the kernel compiles for when JAX runs it on the CPU platform: the host
        CPU (narrowed by ``JAXTILE_CPU_ISA``), or CUDA for the SIMT emulator (the
        ``cuda-emulator`` backend)."""
        name = _config.BACKENDS[self.backend]
        return parse_target(_config.cpu_target_name() if name == "cpu" else name)

    @property
    def rocm_export_targets(self) -> tuple[Target, ...]:
        """The targets a ROCm lowering compiles for when it has no device to ask or is an
        export, which must run on whatever AMD GPU it meets: ``JAXTILE_ROCM_ARCHS``'s, by
        default every architecture jaxtile supports."""
        archs = _config.get("JAXTILE_ROCM_ARCHS") or HIP_ARCHS
        return tuple(parse_target(f"hip:{arch}") for arch in archs)

    def for_target(self, target: Target) -> Specialisation:
        """The specialisation to compile for ``target``: this one, unless its tiles were
        chosen for another target and ``target``'s tile rule (its table) chooses others;
        then the same call with those. A trace does not know the platforms it will be
        lowered for (``jax.export`` for CUDA on a CPU host traces with the CPU's tiles,
        which may need more shared memory than a GPU has), so each platform's lowering asks
        for its own target's choice here."""
        if self.tiles is None or self.tiles.target == target:
            return self
        spec = self._retiled.get(target)
        if spec is None:
            fixed = self.tiles.fixed
            own = {k: v for k, v in self.params.items() if k in fixed}
            chosen = self.owner.tile_rule(self.specs, own, target)
            if all(self.params[k] == v for k, v in chosen.items()):
                spec = self
            else:
                spec = self.owner.specialisation(self.specs, {**self.params, **chosen},
                                                 self.batch, self.backend,
                                                 tiles=Tiles(fixed, frozenset(chosen),
                                                             target))
                if _output_types(spec) != _output_types(self):
                    raise kernel_error(self.owner.name, f"the tiles chosen for {target.name} "
                                       f"({chosen}) change the kernel's outputs; a tile rule "
                                       "may only change how it is tiled",
                                       _definition(self.owner))
            self._retiled[target] = spec
        return spec

    def build(self, target: Target, load: Callable[[cache.Entry], None], *,
              emulated: bool = False) -> cache.Entry:
        """The kernel compiled for ``target`` (or fetched from the cache) and loaded with
        the platform's ``load``; ``emulated``: CUDA code built for the SIMT emulator. An
        entry that passes its checksums yet cannot be loaded is a cache miss: it is
        discarded and rebuilt, once."""
        entry = self._entries.get((target, emulated))
        if entry is None:
            self.check_threads(target)
            built = self._build(target, emulated)
            try:
                entry = self._launched(built)
                load(entry)
            except (RuntimeError, ValueError):
                cache.discard(built.key)
                entry = self._launched(self._build(target, emulated))
                load(entry)
            self._entries[(target, emulated)] = entry
        return entry

    def check_threads(self, target: Target) -> None:
        """On a GPU target, the kernel's ``threads`` must be a whole number of warps and at
        most the target's threads per block (a CPU runs any positive count)."""
        warp = getattr(target.caps, "warp_size", None)
        if warp is None:
            return
        threads, most = self.owner.threads, target.caps.max_threads_per_block
        if threads % warp or threads > most:
            raise kernel_error(self.owner.name, f"threads={threads} cannot run on "
                               f"{target.name}: a block there is a whole number of "
                               f"{warp}-thread warps, at most {most} threads",
                               _definition(self.owner))

    def _launched(self, entry: cache.Entry) -> cache.Entry:
        """A kernel with dynamic sizes has one artifact for all of them; this call's grid
        size is set when it is loaded. (A GPU artifact's launch computes its grid from the
        shapes XLA passes: one key, and one loaded module, for every size.)"""
        if not self.dynamic or entry.kind in cache.GPU_KINDS:
            return entry
        return entry.launched_with(self.tile_ir.num_blocks)

    def _build(self, target: Target, emulated: bool = False) -> cache.Entry:
        """``build.build``, with any failure of the compiler below the Tile IR turned into
        a KernelError that names the kernel (a bug or limit of jaxtile, not of the body)."""
        started = None if emulated else self._started.pop(target, None)
        try:
            if started is not None:
                return started.result()
            prebuilt = None if emulated else self._level_prebuilt(target)
            if prebuilt is not None:
                return prebuilt
            return build.build(self.compiled_ir, target, emulated=emulated)
        except KernelError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. TVM's errors, a RecursionError
            raise self.compiler_failure(target, e) from e

    def compiler_failure(self, target: Target, error: Exception) -> KernelError:
        """The KernelError for a failure of the compiler below the Tile IR: a bug or limit
        of jaxtile, not of the body."""
        first = (str(error).strip().splitlines() or [""])[0][:300]
        return kernel_error(self.owner.name, f"the {target.name} compiler failed on this "
                            f"kernel ({type(error).__name__}: {first}); please report it",
                            _definition(self.owner))

    @property
    def rule_params(self) -> dict[str, Any]:
        """The parameters the differentiation rules get: all of them, less those a tile rule
        chose. The kernels the rules call then choose their own tiles, per target (the
        rules run at trace time, before any platform's lowering), where passing this
        call's would fix, on every target, tiles chosen for one."""
        if self.tiles is None:
            return self.params
        return {k: v for k, v in self.params.items() if k not in self.tiles.chosen}

    # --- what kernel_call's rules ask for -----------------------------------
    def reference(self, *args: Any) -> list[Any]:
        """The outputs (flat, in kernel_call order) of the body run as plain JAX ops."""
        t = self.traced
        return reference.run_reference(t.jaxpr, t.grid, t.index_axes, t.buffers,
                                       [jnp.asarray(a) for a in args])

    def batched(self, batched: tuple[bool, ...], size: int) -> kernel_call.KernelHandle:
        """The handle of this kernel with one more (outermost) batch level."""
        level = _trace.BatchLevel(size, tuple(batched))
        return self.owner.specialisation(self.specs, self.params, (level,) + self.batch,
                                         self.backend, tiles=self.tiles).handle()

    def resized(self, arg_shapes: Sequence[tuple[int, ...]]) -> kernel_call.KernelHandle:
        """The handle of this kernel for other (e.g. per-shard) argument shapes, given with
        their batch dimensions in front as kernel_call sees them."""
        specs, sizes = [], [None] * len(self.batch)
        for i, (shape, spec) in enumerate(zip(arg_shapes, self.specs)):
            levels = [k for k, level in enumerate(self.batch) if level.batched[i]]
            for k, n in zip(levels, shape):
                sizes[k] = n
            specs.append(jax.ShapeDtypeStruct(tuple(shape[len(levels):]), spec.dtype))
        batch = tuple(_trace.BatchLevel(n, level.batched) for n, level in zip(sizes, self.batch))
        return self.owner.specialisation(tuple(specs), self.params, batch, self.backend,
                                         tiles=self.tiles).handle()

    @property
    def shard_rule(self) -> ShardRule | None:
        """The kernel's sharding rule, extended by its batch levels; without one, the rule
        inferred from its grid (None: no rule)."""
        rule = self.owner.sharding
        if rule is None:
            return self.inferred_sharding[0]
        return rule.with_batch([level.batched for level in self.batch]) if self.batch else rule

    @functools.cached_property
    def inferred_sharding(self) -> tuple[ShardRule | None, str]:
        """The rule inferred from the Tile IR, and what was inferred or why not."""
        return infer_rule(self.tile_ir)

    @property
    def vjp(self) -> tuple[Callable[..., Any], Callable[..., Any]] | None:
        """``(fwd, bwd)`` on flat outputs and cotangents, or None without a user rule.

        ``fwd(*args) -> (outputs, residuals)``; ``bwd(residuals, cotangents) -> cotangent
        per argument``. For a batched specialisation the user's rule is vmapped level by
        level.
        """
        rule = self.owner.vjp_rule
        if rule is None:
            return None
        if not self.batch:
            return _flat_rule(self, *rule)
        inner = self.owner.specialisation(self.specs, self.params, self.batch[1:],
                                          self.backend, tiles=self.tiles)
        return _vmapped_rule(inner.vjp, self.batch[0])

    @property
    def jvp(self) -> Callable[..., Any] | None:
        """``jvp(primals, outputs, tangents) -> output tangents`` on flat lists (one tangent
        per argument and per output), or None without a user rule; vmapped level by level
        for a batched specialisation."""
        rule = self.owner.jvp_rule
        if rule is None:
            return None
        if not self.batch:
            return _flat_jvp_rule(self, rule)
        inner = self.owner.specialisation(self.specs, self.params, self.batch[1:],
                                          self.backend, tiles=self.tiles)
        return _vmapped_jvp_rule(inner.jvp, self.batch[0])


def _output_types(spec: Specialisation) -> tuple[Any, ...]:
    return spec.traced.out_tree, tuple((b.shape, b.dtype) for b in spec.traced.outputs)


def _definition(kernel: Any) -> str | None:
    """``file:line`` of a kernel's body."""
    code = getattr(kernel.fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else None


def _flat_jvp_rule(spec: Specialisation, jvp: Callable):
    tree, params, name = spec.traced.out_tree, spec.rule_params, spec.owner.name

    def flat_jvp(primals, outs, tangents):
        got = jvp(tuple(primals), jax.tree.unflatten(tree, list(outs)), tuple(tangents),
                  **params)
        leaves, got_tree = jax.tree.flatten(got, is_leaf=lambda x: x is None)
        if got_tree != tree:
            raise kernel_error(name, f"the jvp rule returned tangents shaped {got_tree}, "
                               f"but the kernel returns {tree}")
        return [jnp.zeros(o.shape, o.dtype) if t is None else jnp.asarray(t, o.dtype)
                for t, o in zip(leaves, outs)]

    return flat_jvp


def _vmapped_jvp_rule(jvp: Callable, level: _trace.BatchLevel):
    in_axes = [0 if b else None for b in level.batched]

    def batched_jvp(primals, outs, tangents):
        return jax.vmap(jvp, in_axes=(in_axes, 0, in_axes), out_axes=0)(
            list(primals), list(outs), list(tangents))

    return batched_jvp


def _flat_rule(spec: Specialisation, fwd: Callable, bwd: Callable):
    tree, params, name = spec.traced.out_tree, spec.rule_params, spec.owner.name
    n_args = len(spec.specs)

    def flat_fwd(*args):
        outs, res = fwd(*args, **params)
        leaves, got = jax.tree.flatten(outs)
        if got != tree:
            raise kernel_error(name, f"the vjp fwd rule returned outputs shaped {got}, but the "
                               f"kernel returns {tree}")
        return leaves, res

    def flat_bwd(res, cts):
        grads = bwd(res, jax.tree.unflatten(tree, list(cts)), **params)
        if not isinstance(grads, tuple | list) or len(grads) != n_args:
            raise kernel_error(name, f"the vjp bwd rule must return a tuple of {n_args} "
                               "cotangents, one per array argument")
        return [jnp.zeros(s.shape, s.dtype) if g is None else g
                for g, s in zip(grads, spec.specs)]

    return flat_fwd, flat_bwd


def _vmapped_rule(rule: tuple[Callable, Callable], level: _trace.BatchLevel):
    fwd, bwd = rule
    in_axes = [0 if b else None for b in level.batched]

    def batched_fwd(*args):
        return jax.vmap(fwd, in_axes=in_axes, out_axes=0)(*args)

    def batched_bwd(res, cts):
        grads = jax.vmap(bwd, in_axes=(0, 0), out_axes=0)(res, list(cts))
        # An argument shared by the whole batch gets the sum of the per-element cotangents.
        return [g if b else jnp.sum(g, axis=0) for g, b in zip(grads, level.batched)]

    return batched_fwd, batched_bwd


def flat_outputs(spec: Specialisation, outs: Sequence[Any]) -> Any:
    """Kernel_call's flat outputs in the structure the body returned."""
    return jax.tree.unflatten(spec.traced.out_tree, list(outs))


def _short(value: Any) -> str:
    """A compile-time parameter in a few characters: a type or function by its name."""
    text = getattr(value, "__name__", None) or str(value)
    return text if len(text) <= 24 else text[:21] + "..."
