"""``@jt.kernel``: turn a tile-language body into a JAX-callable kernel."""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import linecache
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

import jax
import jax.numpy as jnp
import numpy as np

from jaxtile.compiler import build, printer
from jaxtile.compiler import jax_internals as ji
from jaxtile.compiler.errors import KernelError, kernel_error, user_line
from jaxtile.compiler.ir import Kernel as TileKernel
from jaxtile.compiler.target import Target, parse_target
from jaxtile.primitives import kernel_call, sharding

from . import _config, _trace
from ._specialisation import Specialisation, Tiles, flat_outputs
from ._typing import KernelArg

if TYPE_CHECKING:
    from .autotune import TunedKernel

SUPPORTED_DTYPES = frozenset(np.dtype(d) for d in (
    jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64, jnp.int8, jnp.int16, jnp.int32,
    jnp.int64, jnp.uint8, jnp.uint16, jnp.uint32, jnp.uint64, jnp.bool_, jnp.float8_e4m3fn,
    jnp.float8_e5m2))


_interpret = _config.get("JAXTILE_INTERPRET")


def interpret_by_default() -> bool:
    """Whether kernels without an explicit ``interpret=`` run their reference semantics
    (``JAXTILE_INTERPRET=1``, ``true``, ``yes`` or ``on`` in the environment, or
    :func:`set_interpret`)."""
    return _interpret


def set_interpret(enabled: bool) -> None:
    """Make every kernel without an explicit ``interpret=`` run as plain JAX ops.

    It applies to calls made from now on: a function JAX traced before (``jax.jit`` of the
    same function on the same argument types) keeps the trace it cached."""
    global _interpret
    _interpret = bool(enabled)


_backend = _config.get("JAXTILE_BACKEND")


def backend() -> str:
    """The name of the active backend: ``"cpu"`` (the default), ``"cuda-emulator"``,
    ``"cuda-emulator:sm_90a"``, ``"hip-emulator"`` or ``"hip-emulator:gfx90a"``
    (``JAXTILE_BACKEND`` in the environment, or :func:`set_backend`)."""
    return _backend


def set_backend(name: str) -> None:
    """Choose what runs kernels on JAX's CPU platform: ``"cpu"`` compiles them for the CPU;
    ``"cuda-emulator"`` compiles them for CUDA (sm_80) and runs that code in the SIMT
    emulator, which checks it for races, out-of-bounds accesses and deadlocks;
    ``"cuda-emulator:sm_90a"`` does the same with Hopper code (sm_90a);
    ``"hip-emulator"`` compiles them for AMD's gfx942 (``"hip-emulator:gfx90a"``: gfx90a)
    and runs that HIP code in the emulator's wave64 mode, with the same checks.

    The choice is read when a kernel is specialised: calls made from now on use it, and
    specialisations made before keep theirs."""
    global _backend
    if name not in _config.BACKENDS:
        raise KernelError(f"unknown backend {name!r}; backends: "
                          f"{', '.join(_config.BACKENDS)}")
    _backend = name


@dataclasses.dataclass(frozen=True)
class Lowered:
    """What a kernel compiles to, for inspection: ``print(kernel.lower(x).tile_ir)``."""

    tile_ir: str
    key: str
    target: str
    kernel: TileKernel
    sharding: str = ""
    """How the kernel runs under ``jax.jit`` with sharded inputs: its explicit ShardRule, the
    rule inferred from its grid, or why none was inferred (it then runs unsharded)."""

    @property
    def source(self) -> str:
        """The source the target's backend generates (TVMScript TIR for the CPU, CUDA for
        ``cuda:*``: the exact text NVRTC / nvcc and the emulator compile)."""
        return build.source(self.kernel, parse_target(self.target))

    @functools.cached_property
    def lowered_ir(self) -> str:
        """The Tile IR after the target's own passes: for CUDA with every register tile's
        layout (``float32[4, 384]#blocked(...)``), the barriers and the kept masks."""
        return printer.format_kernel(build.lowered_ir(self.kernel, parse_target(self.target)))

    @functools.cached_property
    def _gpu_ir(self) -> TileKernel:
        """The IR after the GPU passes (layouts inferred), for a ``cuda:*`` or ``hip:*``
        target."""
        target = parse_target(self.target)
        if target.kind not in ("cuda", "hip"):
            raise KernelError(f"{self.target} has no GPU code: lower for 'cuda:sm_80' or "
                              "'hip:gfx942'")
        return build.lowered_ir(self.kernel, target)

    @functools.cached_property
    def _gpu(self) -> Any:
        from jaxtile.compiler.gpu.codegen.lower import generate

        return generate(self._gpu_ir, parse_target(self.target))

    def plot_layout(self, tile: str, path: str | None = None) -> str:
        """GPU targets: an SVG picture of an on-chip tile's layout, named by the variable the kernel
        assigned it to (``acc = jt.fragment(...)``: ``"acc"``) or by its IR name
        (``"frag0"``). For a ``jt.fragment``, each element's thread and slot in that
        thread's registers; for a ``jt.shared`` tile, each element's bank under the swizzle
        the GEMMs reading it chose. Returns the SVG text; ``path`` also writes the picture
        there: a PNG for a ``.png`` path (which needs matplotlib), else the SVG."""
        from jaxtile.compiler.gpu import gemm_plan, layout_svg

        kernel = self._gpu_ir
        names = _variable_names(kernel)
        buf = next((b for b in kernel.buffers if tile in (b.name, names.get(b.name))), None)
        if buf is None or buf.scope not in ("fragment", "shared"):
            tiles = ", ".join(f"{names[b.name]} ({b.name})" if b.name in names else b.name
                              for b in kernel.buffers if b.scope in ("fragment", "shared"))
            raise KernelError(f"{self.kernel.name}: no on-chip tile named {tile!r} to plot; "
                              f"its fragment and shared tiles: {tiles or 'none'}")
        title = (f"{self.kernel.name} {names.get(buf.name, buf.name)} ({buf.name}): "
                 f"{buf.scope} {buf.dtype}{list(buf.shape)}")
        try:
            if buf.scope == "fragment":
                picture = layout_svg.fragment_picture(buf.layout, f"{title} {buf.layout.text()}")
            else:
                if len(buf.shape) != 2:
                    raise ValueError("only 2-D shared tiles are drawn")
                plan = gemm_plan.swizzles(kernel).get(buf.name)
                shared = plan or gemm_plan.SharedTile(buf.dtype, *buf.shape, swizzled=False)
                picture = layout_svg.shared_picture(
                    shared, f"{title}, {'swizzled' if shared.swizzled else 'row-major'}")
        except ValueError as e:
            raise KernelError(f"{self.kernel.name}: cannot plot {tile!r}: {e}") from None
        svg = picture.svg()
        if path is not None and str(path).lower().endswith(".png"):
            try:
                picture.save_png(str(path))
            except ImportError:
                raise KernelError(f"{self.kernel.name}: writing {path} needs matplotlib (pip "
                                  "install matplotlib); an .svg path needs nothing") from None
        elif path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(svg)
        return svg

    @property
    def masks(self) -> tuple[str, ...]:
        """GPU targets: the global accesses that kept a bounds check (``file:line: op attr=buffer
        dims [...]``); the others were proved in bounds."""
        return self._gpu.masks

    @property
    def conversions(self) -> tuple[str, ...]:
        """GPU targets: the layout conversions (through shared memory) layout inference inserted."""
        return self._gpu.conversions

    @property
    def shared_memory(self) -> str:
        """GPU targets: where each shared array lives in the dynamic shared memory and the size
        the kernel launches with (``shared memory 49152 / 166912 bytes (opt-in above
        49152): smem0@0 smem1@24576``)."""
        return self._gpu.smem_plan

    @functools.cached_property
    def _vendor_figures(self) -> Any:
        """GPU targets: the vendor compiler's figures for the kernel (registers, spills,
        shared memory or LDS): ptxas' report for CUDA (``.ptxas``), clang's resource figures
        for HIP (``.hip_resources``); None when that compiler is not installed."""
        target = parse_target(self.target)
        figures = _VENDOR_FIGURES.get(target.kind)
        if figures is None:
            raise KernelError(f"{self.target} has no GPU code: lower for 'cuda:sm_80' or "
                              "'hip:gfx942'")
        return figures.report(self, target)

    @property
    def ptxas(self) -> Any:
        """CUDA: ptxas' report for the kernel (registers, spills, shared memory), or None
        when nvcc is not installed."""
        return self._figures_of("cuda")

    @property
    def hip_resources(self) -> Any:
        """HIP: the kernel's resource figures from clang's assembly (VGPRs, AGPRs, SGPRs,
        LDS, scratch, spills; ``.waves_per_simd(caps)``), or None when no clang for AMD GPUs
        is installed."""
        return self._figures_of("hip")

    def _figures_of(self, kind: str) -> Any:
        """The vendor figures, asked for by the name of ``kind``'s report."""
        if parse_target(self.target).kind != kind:
            raise KernelError(f"{self.target} {_VENDOR_FIGURES[kind].elsewhere}")
        return self._vendor_figures


@dataclasses.dataclass(frozen=True)
class _Figures:
    """How a GPU target kind reports what its vendor's compiler made of a kernel."""

    report: Callable[[Lowered, Target], Any]
    """The figures, or None when the vendor's compiler is not installed."""
    elsewhere: str
    """What asking another kind's lowering for them says, after its target's name."""


def _ptxas_report(lowered: Lowered, target: Target) -> Any:
    from jaxtile.compiler.cuda import toolchain
    from jaxtile.compiler.cuda.compile import arch_of

    if toolchain.nvcc_path() is None:
        return None
    cubin = toolchain.compile_cubin(lowered.source, arch_of(target),
                                    file=f"{lowered.kernel.name}.cu")
    return cubin.kernels.get(lowered._gpu.symbol)


def _hip_resources(lowered: Lowered, target: Target) -> Any:
    from jaxtile.compiler.hip import lower as hip_lower
    from jaxtile.compiler.hip import toolchain

    if toolchain.clang_path() is None:
        return None
    return hip_lower.resources(lowered._gpu_ir, target)


_VENDOR_FIGURES = {
    "cuda": _Figures(_ptxas_report, "has no CUDA code for ptxas: see hip_resources for an "
                     "AMD target's figures"),
    "hip": _Figures(_hip_resources, "has no HIP code: lower for 'hip:gfx942'"),
}
"""Target kind -> its vendor figures: one hook per kind, behind ``Lowered.ptxas`` and
``Lowered.hip_resources``."""


def _variable_names(kernel: TileKernel) -> dict[str, str]:
    """Buffer name -> the variable the user's source line assigned it to (``acc`` in
    ``acc = jt.fragment(...)``), for the on-chip buffers whose line reads as such an
    assignment; a name two buffers claim (a line the trace could not pin) names neither."""
    found: dict[str, str] = {}
    for b in kernel.buffers:
        where, _, line = (b.line or "").rpartition(":")
        text = linecache.getline(where, int(line)) if line.isdigit() else ""
        match = _ASSIGNED.match(text)
        if match and b.scope in _ALLOCATORS and re.search(_ALLOCATORS[b.scope], text):
            found[b.name] = match.group(1)
    claims = collections.Counter(found.values())
    return {b: v for b, v in found.items() if claims[v] == 1}


_ASSIGNED = re.compile(r"\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=[^=]")
_ALLOCATORS = {"fragment": r"\bfragment\s*\(", "shared": r"\bshared\s*\("}


class Kernel:
    """A tile kernel; call it like a JAX function. Create it with :func:`kernel`."""

    def __init__(self, fn: Callable[..., Any], *, threads: int, interpret: bool | None,
                 name: str | None, sharding: sharding.ShardRule | None = None,
                 dynamic: Mapping[str, int | Sequence[int]] | None = None):
        self.fn = fn
        self.sharding = sharding
        self.name = name or fn.__name__
        if isinstance(threads, bool) or not isinstance(threads, int | np.integer) \
                or threads < 1:
            raise kernel_error(self.name, "threads must be a positive int (threads per "
                               f"block), got {threads!r}", user_line())
        self.threads = int(threads)
        self.interpret = interpret
        sig = inspect.signature(fn)
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.arg_names = [p.name for p in sig.parameters.values() if p.kind in kinds]
        self.dynamic = _dynamic_axes(self.name, self.arg_names, dynamic)
        """Argument position -> its dynamic axes (see :func:`kernel`)."""
        self.param_defaults = {p.name: p.default for p in sig.parameters.values()
                               if p.kind == inspect.Parameter.KEYWORD_ONLY}
        self._specs: dict[Any, Specialisation] = {}
        self._by_call: dict[Any, Specialisation] = {}
        self._eager: dict[Any, Callable[..., Any]] = {}
        self.vjp_rule: tuple[Callable[..., Any], Callable[..., Any]] | None = None
        self.jvp_rule: Callable[..., Any] | None = None
        self.tile_rule: Callable[..., dict[str, Any]] | None = None
        """For the library kernels: ``rule(specs, params, target)`` gives the parameters a
        call leaves out their values for these argument types and the target (None: the
        active backend's), from a stored tile table (``jaxtile/ops/_tiles.py``). The values
        it gives may change how the kernel is tiled, never its outputs' types: a traced call
        is lowered for another target with that target's choice (``Specialisation.for_target``)."""
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<jaxtile kernel {self.name}>"

    # --- specialisation --------------------------------------------------
    def _arg_specs(self, args: tuple[Any, ...]) -> tuple[jax.ShapeDtypeStruct, ...]:
        if len(args) != len(self.arg_names):
            raise kernel_error(self.name, f"takes {len(self.arg_names)} array argument(s) "
                               f"({', '.join(self.arg_names)}), got {len(args)}", user_line())
        specs = []
        for name, a in zip(self.arg_names, args):
            if not hasattr(a, "shape") or not hasattr(a, "dtype"):
                raise kernel_error(self.name, f"argument '{name}' must be an array, got "
                                   f"{type(a).__name__}", user_line())
            # As jnp would: a float64 NumPy array is float32 unless x64 is enabled.
            dtype = np.dtype(jax.dtypes.canonicalize_dtype(a.dtype))
            if dtype not in SUPPORTED_DTYPES:
                raise kernel_error(self.name, f"argument '{name}' has unsupported dtype "
                                   f"{dtype}", user_line())
            if any(not isinstance(d, int | np.integer) for d in a.shape):
                raise kernel_error(self.name, f"argument '{name}' has the symbolic shape "
                                   f"{tuple(a.shape)} (jax.export with shape polymorphism?); "
                                   "jaxtile traces kernels for concrete shapes: export one "
                                   "program per shape (with dynamic=, they share one "
                                   "compiled kernel)", user_line())
            specs.append(jax.ShapeDtypeStruct(tuple(a.shape), dtype))
        return tuple(specs)

    def _params(self, params: dict[str, Any]) -> dict[str, Any]:
        unknown = set(params) - set(self.param_defaults)
        if unknown:
            raise kernel_error(self.name, f"unexpected parameter(s) {sorted(unknown)}; the "
                               f"compile-time parameters are {sorted(self.param_defaults)}",
                               user_line())
        merged = {**self.param_defaults, **params}
        missing = [k for k, v in merged.items() if v is inspect.Parameter.empty]
        if missing:
            raise kernel_error(self.name, f"missing compile-time parameter(s) {missing}",
                               user_line())
        for k, v in merged.items():
            if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(v)):
                raise kernel_error(
                    self.name, f"compile-time parameter '{k}' is a traced value (a JAX "
                    "tracer: under jax.jit, grad or vmap the arguments of the traced function "
                    "are tracers), but keyword parameters are constants the kernel is compiled "
                    f"for. Make it static (jax.jit(f, static_argnames='{k}')) or pass it to "
                    "the kernel as a positional array argument, read on the device",
                    user_line())
        return merged

    def _specialise(self, args: tuple[Any, ...], params: dict[str, Any],
                    target: Target | None = None) -> Specialisation:
        # A call with the same argument types and parameters as an earlier one skips the
        # argument checks (which build ShapeDtypeStructs) and the tile table.
        fast = _call_key(args, params) if target is None else None
        spec = self._by_call.get(fast) if fast is not None else None
        if spec is None:
            specs = self._arg_specs(args)
            tiles = None
            if self.tile_rule is not None:
                # The tiles are chosen for one target; the lowering for another chooses
                # again from the names the call fixed itself (Specialisation.for_target).
                chosen = self.tile_rule(specs, params, target)
                tiles = Tiles(frozenset(params), frozenset(chosen), target or _tile_target())
                params = {**chosen, **params}
            spec = self.specialisation(specs, self._params(params), (), tiles=tiles)
            if fast is not None:
                self._by_call[fast] = spec
        return spec

    def specialisation(self, specs: tuple[jax.ShapeDtypeStruct, ...], params: dict[str, Any],
                       batch: tuple[_trace.BatchLevel, ...],
                       backend_name: str | None = None, *,
                       tiles: Tiles | None = None) -> Specialisation:
        """The (cached) specialisation for argument specs, parameters, batch levels and a
        backend (the active one by default); ``tiles``: the parameter names the call set
        itself and the target the :attr:`tile_rule` chose the others for (None: every
        parameter is the call's own)."""
        backend_name = backend_name or _backend
        try:
            # The names the call fixed are part of the key: two calls that got the same
            # tiles, one from the table and one by passing them, differ on another target.
            cache_key = (specs, _params_key(params), batch, backend_name,
                         tiles.fixed if tiles else None)
            hash(cache_key)
        except TypeError:
            bad = [k for k, v in params.items() if not _hashable(_value_key(v))]
            raise kernel_error(self.name, "compile-time parameters must be hashable (a tuple, "
                               f"not a list); not hashable: {', '.join(bad)}",
                               user_line()) from None
        spec = self._specs.get(cache_key)
        if spec is None:
            spec = self._specs[cache_key] = Specialisation(self, specs, params, batch,
                                                           backend_name, tiles)
        return spec

    # --- calling ---------------------------------------------------------
    def __call__(self, *args: KernelArg, **params: Any) -> Any:
        interpret = self.interpret if self.interpret is not None else _interpret
        if not interpret:
            # The eager hot path: concrete arrays go to the jitted function of the call's
            # parameters, whose own C++ cache tells argument types apart (and the x64 mode);
            # the Python work left is this loop and a small key.
            for a in args:
                if type(a) is not _Array:
                    break
            else:
                key = _eager_key(params)
                if key is not None:
                    run = self._eager.get(key)
                    if run is None:
                        run = self._eager[key] = self._eager_function(params)
                    return run(*args)
        return self._call(args, params, interpret)

    def _eager_function(self, params: dict[str, Any]) -> Callable[..., Any]:
        """The kernel with these parameters as a jitted function of concrete arrays: its
        trace (once per argument types) takes the checked path of a traced call, so bad
        arguments fail with the same errors."""
        params = dict(params)

        def run(*args: Any) -> Any:
            return self._call(args, params, False)

        # The jitted function's name is what profiler traces call the eager call's program
        # (``jit_softmax``, ``PjitFunction(softmax)``).
        run.__name__ = run.__qualname__ = self.name
        return jax.jit(run)

    def _call(self, args: tuple[Any, ...], params: dict[str, Any], interpret: bool) -> Any:
        spec = self._specialise(args, params)
        if interpret or spec.empty:
            return flat_outputs(spec, spec.reference(*args))
        if any(isinstance(a, jax.core.Tracer) for a in args):
            return flat_outputs(spec, kernel_call.kernel_call_p.bind(*args,
                                                                     kernel=spec.handle()))
        # Array-likes the hot path does not take (Python lists are refused above by the
        # argument checks): the cached jitted call of the kernel.
        return kernel_call.eager_function(spec.handle(), spec.traced.out_tree)(*args)

    def reference(self, *args: KernelArg, **params: Any) -> Any:
        """Run the kernel's reference semantics (its body as plain JAX ops)."""
        return self._call(args, params, True)

    def defvjp(self, fwd: Callable[..., Any], bwd: Callable[..., Any]) -> None:
        """Give the kernel a reverse-mode rule, in the spirit of ``jax.custom_vjp``.

        ``fwd(*args, **params) -> (outputs, residuals)`` computes the kernel's outputs (in the
        structure the body returns) and anything the backward pass needs; it may call other
        kernels, e.g. one that also returns a logsumexp. ``bwd(residuals, cotangents,
        **params)`` returns one cotangent per array argument (None for zero). ``jax.grad``,
        ``jax.vjp`` and ``jax.jacrev`` use the rule; ``jax.jvp`` and ``jax.jacfwd`` use the
        rule of :meth:`defjvp`, else the reference semantics. Without a rule the kernel is
        differentiated
        through its reference semantics in both modes: correct, but it runs the body as
        plain JAX ops, which is much slower than the compiled kernel.

        >>> def fwd(x):                                   # doctest: +SKIP
        ...     y = softmax(x)
        ...     return y, y
        >>> def bwd(y, g):                                # doctest: +SKIP
        ...     return (y * (g - jnp.sum(g * y, axis=-1, keepdims=True)),)
        >>> softmax.defvjp(fwd, bwd)                       # doctest: +SKIP
        """
        self.vjp_rule = (fwd, bwd)

    def defjvp(self, jvp: Callable[..., Any]) -> None:
        """Give the kernel a forward-mode rule, for ``jax.jvp``, ``jax.jacfwd`` and
        forward-over-reverse second derivatives.

        ``jvp(args, outputs, tangents, **params)`` gets the array arguments and their
        tangents as tuples (zeros for integer arguments) and the kernel's outputs (in the
        structure the body returns), and returns the output tangents in that structure. It
        must be linear in ``tangents``; it may call kernels. Reverse mode keeps using the
        :meth:`defvjp` rule (or the reference semantics), so the two rules must agree.

        >>> def jvp(args, y, tangents):                   # doctest: +SKIP
        ...     t = tangents[0]
        ...     return y * (t - jnp.sum(t * y, axis=-1, keepdims=True))
        >>> softmax.defjvp(jvp)                            # doctest: +SKIP
        """
        self.jvp_rule = jvp

    def autotune(self, configs: Sequence[Mapping[str, Any]], **options: Any) -> TunedKernel:
        """This kernel with its parameters tuned over ``configs``: see :func:`jaxtile.autotune`
        (a ``TunedKernel``; its ``tuning_report(*args)`` lists every candidate)."""
        from .autotune import autotune

        return autotune(self, configs=configs, **options)

    def lower(self, *args: KernelArg | jax.ShapeDtypeStruct, target: str = "cpu",
              **params: Any) -> Lowered:
        """Trace and lower for ``target`` (``"cpu"``, ``"cuda:sm_80"``, ``"cuda:sm_90"``,
        ``"hip:gfx90a"``...) without running; ``args`` may be ``jax.ShapeDtypeStruct`` s.
        Returns the Tile IR, the content key and (``.source``) the generated source. A
        target that has no backend yet is a KernelError saying so. ``"cpu"`` is the target
        the CPU platform compiles for (``"cpu:x86-64-v3"`` under ``JAXTILE_CPU_ISA=x86-64-v3``);
        ``"cpu:x86-64-v4"`` lowers for AVX-512 also where the host lacks it."""
        tgt = parse_target(_config.cpu_target_name() if target == "cpu" else target)
        build.check_backend(tgt)
        spec = self._specialise(args, params, tgt)
        spec.check_threads(tgt)
        kernel = spec.compiled_ir
        sharded = (f"explicit {spec.shard_rule}" if self.sharding is not None
                   else spec.inferred_sharding[1])
        return Lowered(printer.format_kernel(kernel), build.kernel_key(kernel, tgt), tgt.name,
                       kernel, sharded)



def _tile_target() -> Target:
    """The target a call's tiles are chosen for when it names none: what the active backend
    compiles for on the CPU platform, else the default device's GPU."""
    from .autotune import tuning_target

    return tuning_target()


def _call_key(args: tuple[Any, ...], params: dict[str, Any]) -> Any:
    """Argument shapes and dtypes, the x64 mode (which decides their canonical dtypes), the
    backend and parameters, or None when an argument has no shape or a parameter is unhashable (such
    calls take the checked path and its errors)."""
    try:
        # JAX declares its flags at run time, so its Config type lacks them.
        x64 = jax.config.jax_enable_x64  # type: ignore[attr-defined]
        key = (x64, _backend, tuple([(a.shape, a.dtype) for a in args]),
               _params_key(params) if params else ())
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


# The arguments an eager call takes the hot path for: concrete JAX arrays. Anything else (a
# NumPy array, whose dtype jax.jit might refuse in its own words; a Python scalar, which it
# would make an array; a tracer) takes the checked path and its errors.
_Array = ji.ArrayImpl


def _eager_key(params: dict[str, Any]) -> Any:
    """What an eager call's jitted function is cached under: the backend and the parameters,
    or None (the checked path) when a parameter is not an int, str, bool or None: other
    values need :func:`_value_key` to tell apart values that are equal yet trace
    differently (``0.0`` and ``-0.0``). Each value's type is part of the key (``1`` and
    ``True`` are equal in Python). Parameters are keyed in the order given, so one set of
    parameters may get an entry per order. The argument types and the x64 mode are not in
    it: the jitted function keys its traces by them."""
    if not params:
        return _backend
    key: list[Any] = [_backend]
    for name, v in params.items():
        t = type(v)
        if t not in _PLAIN:
            return None
        key.append(name)
        key.append(t)
        key.append(v)
    return tuple(key)


def _params_key(params: dict[str, Any]) -> tuple[Any, ...]:
    """Parameters as a key that tells apart values Python deems equal but a trace does not
    (``2``, ``2.0``, ``True``; ``0.0`` and ``-0.0``), and in which a NaN equals itself."""
    return tuple([(name, _value_key(v)) for name, v in sorted(params.items())])


# Types whose equal values are interchangeable (once the type is part of the key).
_PLAIN = frozenset({int, str, bool, type(None)})
_FLOATS = (float, np.floating)
_COMPLEX = (complex, np.complexfloating)


def _value_key(v: Any) -> Any:
    t = type(v)
    if t in _PLAIN:
        return t, v
    if isinstance(v, _FLOATS):
        # Nonzero, non-NaN floats are equal exactly when interchangeable; zeros differ by
        # sign and a NaN must equal itself.
        return (t, v) if v == v and v != 0 else (t, float(v).hex())
    if isinstance(v, _COMPLEX):
        return t, _value_key(float(v.real)), _value_key(float(v.imag))
    if isinstance(v, tuple | frozenset):
        items = [_value_key(x) for x in v]
        return t, tuple(items if t is tuple else sorted(items, key=repr))
    return t, v


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _dynamic_axes(name: str, arg_names: Sequence[str],
                  dynamic: Mapping[str, int | Sequence[int]] | None) -> dict[int, tuple[int, ...]]:
    if dynamic is None:
        return {}
    if not isinstance(dynamic, Mapping):
        raise KernelError(f"kernel {name}: dynamic= takes a dict from argument name to axis "
                          f"or axes, e.g. {{'x': 0}}, got {dynamic!r}")
    out = {}
    for arg, axes in dynamic.items():
        if arg not in arg_names:
            raise KernelError(f"kernel {name}: dynamic= names {arg!r}, which is not one of its "
                              f"array arguments ({', '.join(arg_names)})")
        axes = (axes,) if isinstance(axes, int) else tuple(axes)
        if not axes or not all(isinstance(a, int) and not isinstance(a, bool) and a >= 0
                               for a in axes) or len(set(axes)) != len(axes):
            raise KernelError(f"kernel {name}: dynamic={{{arg!r}: {dynamic[arg]!r}}} must give "
                              "distinct non-negative axes")
        out[arg_names.index(arg)] = tuple(sorted(axes))
    return out


@overload
def kernel(fn: Callable[..., Any], /, *, threads: int = 128, interpret: bool | None = None,
           name: str | None = None, sharding: sharding.ShardRule | None = None,
           dynamic: Mapping[str, int | Sequence[int]] | None = None) -> Kernel: ...
@overload
def kernel(fn: None = None, /, *, threads: int = 128, interpret: bool | None = None,
           name: str | None = None, sharding: sharding.ShardRule | None = None,
           dynamic: Mapping[str, int | Sequence[int]] | None = None
           ) -> Callable[[Callable[..., Any]], Kernel]: ...
def kernel(fn: Callable[..., Any] | None = None, *, threads: int = 128,
           interpret: bool | None = None, name: str | None = None,
           sharding: sharding.ShardRule | None = None,
           dynamic: Mapping[str, int | Sequence[int]] | None = None
           ) -> Kernel | Callable[[Callable[..., Any]], Kernel]:
    """Decorator that makes a tile kernel from a Python body.

    Positional parameters are the array inputs; keyword-only parameters are compile-time
    constants (one specialisation per shapes, dtypes and parameter values). The body
    allocates outputs with :func:`jaxtile.empty` and returns them.

    >>> @jt.kernel(threads=128)                      # doctest: +SKIP
    ... def add(x, y, *, block=1024):
    ...     out = jt.empty(x.shape, x.dtype)
    ...     i = jt.grid(jt.cdiv(x.shape[0], block))
    ...     ...
    ...     return out

    ``interpret=True`` runs the body as plain JAX ops (the reference semantics) instead of
    compiling it. ``sharding=jt.ShardRule(...)`` says along which dimensions the kernel's
    blocks are independent, so that under ``jax.jit`` with sharded inputs each device runs it
    on its own shard (see :class:`jaxtile.ShardRule`).

    ``dynamic={"x": 0}`` (or ``{"x": (0, 1)}``) makes those dimensions of an argument
    dynamic: one compiled kernel serves every size of them. In the body, ``x.shape[0]`` is
    then a symbolic size (``x_0``): the grid, output shapes, loop bounds and masks may depend
    on it, tile shapes may not, and neither may a Python decision (``if n % 8 == 0:``):
    that is a KernelError at its line, since one compiled kernel serves every size; decide
    on the device instead (``jnp.where(jnp.asarray(n) % 8 == 0, ...)``). JAX still traces
    once per shape; a call with a new size compiles nothing.
    """
    def wrap(f: Callable[..., Any]) -> Kernel:
        return Kernel(f, threads=threads, interpret=interpret, name=name, sharding=sharding,
                      dynamic=dynamic)

    return wrap(fn) if fn is not None else wrap
