"""``@jt.autotune``: pick a kernel's compile-time parameters by timing them.

A tuned kernel wraps a :class:`jaxtile.Kernel` with a list of candidate configurations
(dicts of keyword parameters, plus ``threads``). On a call with argument types it has not
tuned for, it

1. specialises every candidate and prunes those that cannot work, keeping the reason: a
   ``KernelError`` from tracing or the verifier, a tile that does not fit the shape (a direct
   index JAX would clamp), the same Tile IR as an earlier candidate, and on a CUDA target
   shared memory over the limit or ptxas register spills;
2. compiles the rest on a thread pool bounded by the CPUs, runs them interleaved inside
   ``jax.jit`` and takes the median of several runs each (under ``jax.jit`` this happens at
   trace time, on inputs of the traced arguments' shapes: random, or from the ``inputs=``
   hook); tuning on the SIMT emulator is refused, its timings mean nothing;
3. stores the best configuration in a JSON record under ``<cache dir>/autotune``.

The record's identity covers everything that may change the answer: the Tile-IR content key
of every candidate (so a changed helper function or closure re-tunes, where the Python source
text would not), the argument shapes and dtypes (or the user's ``key=`` bucket), the target
with its ISA or GPU architecture, and the jaxtile and compiler versions. A record that
matches needs no timing. ``JAXTILE_AUTOTUNE=0`` skips timing and takes the first candidate
that survives pruning.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import jax
import numpy as np

from jaxtile.compiler import build, cache
from jaxtile.compiler.errors import ClampedIndexWarning, KernelError, kernel_error, user_line
from jaxtile.compiler.target import Target, for_platform, parse_target

from . import _config
from . import kernel as _kernel
from ._specialisation import Specialisation

_FORMAT = "jaxtile-autotune-1"

Key = Sequence[str] | Callable[..., Any] | None
"""What a tuning is for: the named arguments' shapes and dtypes, or a bucket function."""
Inputs = Callable[..., Sequence[Any]] | None
"""A function of the arguments' ``jax.ShapeDtypeStruct`` s returning arrays to time on."""

_stats = {"tuned": 0, "memory_hits": 0, "disk_hits": 0, "timed_runs": 0}


def stats() -> dict[str, int]:
    """Counts for this process: tunings done (candidates timed), configurations found in a
    tuned kernel's memory or in a disk record, and timed kernel runs."""
    return dict(_stats)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One configuration's outcome: its median time, or why it was pruned."""

    config: dict[str, Any]
    seconds: float | None = None
    """Median run time; None for a pruned candidate (or when timing was skipped)."""
    pruned: str | None = None
    """Why the candidate cannot work; None for a valid one."""


@dataclasses.dataclass(frozen=True)
class TuningReport:
    """Every candidate of one tuning with its time or the reason it was pruned."""

    kernel: str
    target: str
    candidates: tuple[Candidate, ...]
    best: dict[str, Any]
    from_cache: bool
    """Whether the choice came from a stored record (no timing in this call)."""
    timed: bool
    """False when ``JAXTILE_AUTOTUNE=0`` took the first valid candidate untimed."""

    def __str__(self) -> str:
        how = ("from the cache" if self.from_cache else "timed now" if self.timed
               else "untimed (JAXTILE_AUTOTUNE=0)")
        lines = [f"autotune {self.kernel} on {self.target} ({how}); best {_fmt(self.best)}"]
        for c in self.candidates:
            mark = "*" if c.config == self.best else " "
            what = (f"pruned: {c.pruned}" if c.pruned is not None
                    else f"{c.seconds * 1e6:10.1f} us" if c.seconds is not None else "valid")
            lines.append(f" {mark} {_fmt(c.config):<40} {what}")
        return "\n".join(lines)


def _fmt(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in config.items()) or "(defaults)"


class TunedKernel:
    """A kernel whose compile-time parameters are chosen by timing; call it like the kernel.
    Create it with :func:`autotune` or :meth:`jaxtile.Kernel.autotune`."""

    def __init__(self, kernel: _kernel.Kernel, configs: Sequence[Mapping[str, Any]], *,
                 key: Key = None, inputs: Inputs = None, runs: int = 5, warmup: int = 1,
                 progress: bool | None = None):
        if not isinstance(kernel, _kernel.Kernel):
            raise TypeError(f"autotune wraps a jt.kernel, got {type(kernel).__name__}; put "
                            "@jt.autotune above @jt.kernel")
        self.kernel = kernel
        self.name = kernel.name
        self.configs = _check_configs(kernel, configs)
        self.tuned_names = sorted({k for c in self.configs for k in c})
        if key is not None and not callable(key):
            key = tuple(key)
            bad = [k for k in key if k not in kernel.arg_names]
            if bad:
                raise _error(kernel.name, f"key= names {bad}, which are not its array "
                             f"arguments ({', '.join(kernel.arg_names)})")
        self.key = key
        self.inputs = inputs
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise ValueError(f"autotune {kernel.name}: runs must be a positive int, got {runs!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"autotune {kernel.name}: warmup must be an int >= 0, got "
                             f"{warmup!r}")
        self.runs, self.warmup, self.progress = runs, warmup, progress
        # Kernels of this tuner's own, one per threads value (a Kernel's threads is fixed),
        # made now so that a bad threads value is an error here.
        self._siblings: dict[int, _kernel.Kernel] = {}
        for config in self.configs:
            self._with(config)
        self._reports: dict[Any, TuningReport] = {}
        self._by_call: dict[Any, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"<jaxtile autotuned kernel {self.name}, {len(self.configs)} configs>"

    def __call__(self, *args: Any, **params: Any) -> Any:
        # The hot path: argument types, parameters and backend seen before (the kernel's
        # own call key) go straight to their configuration.
        fast = _kernel._call_key(args, params)
        if fast is not None:
            fast = (fast, _config.get("JAXTILE_AUTOTUNE"))
        config = self._by_call.get(fast) if fast is not None else None
        if config is None:
            config = self.tuning_report(*args, **params).best
            if fast is not None:
                self._by_call[fast] = config
        kernel, tuned = self._with(config)
        return kernel(*args, **params, **tuned)

    def defvjp(self, fwd: Callable[..., Any], bwd: Callable[..., Any]) -> None:
        """The kernel's reverse-mode rule (:meth:`jaxtile.Kernel.defvjp`); ``fwd`` and
        ``bwd`` get the tuned parameters too."""
        self.kernel.defvjp(fwd, bwd)

    def defjvp(self, jvp: Callable[..., Any]) -> None:
        """The kernel's forward-mode rule (:meth:`jaxtile.Kernel.defjvp`)."""
        self.kernel.defjvp(jvp)

    def best_config(self, *args: Any, **params: Any) -> dict[str, Any]:
        """The configuration calls with these arguments use (tuning first if needed)."""
        return dict(self.tuning_report(*args, **params).best)

    def tuning_report(self, *args: Any, **params: Any) -> TuningReport:
        """The tuning for these arguments (arrays, tracers or ``jax.ShapeDtypeStruct`` s) and
        untuned parameters: from memory, from a stored record, or done now."""
        clash = sorted(set(params) & set(self.tuned_names))
        if clash:
            raise _error(self.name, f"{clash} are tuned, so a call cannot also pass them")
        specs = self.kernel._arg_specs(args)
        kernel, tuned = self._with(self.configs[0])
        kernel._params({**params, **tuned})  # unknown, missing or traced parameters
        target = tuning_target()
        params_key = _kernel._params_key(params)
        mem_key = (specs, params_key, target, _config.get("JAXTILE_AUTOTUNE"))
        try:
            report = self._reports.get(mem_key)
        except TypeError:
            raise _error(self.name, "compile-time parameters must be hashable (a tuple, "
                         f"not a list); got {params!r}") from None
        if report is not None:
            _stats["memory_hits"] += 1
            return report
        report = self._tune(args, specs, params, target, self._bucket(specs),
                            repr(params_key))
        self._reports[mem_key] = report
        return report

    # --- the pieces ------------------------------------------------------------
    def _with(self, config: Mapping[str, Any]) -> tuple[_kernel.Kernel, dict[str, Any]]:
        """The kernel for ``config`` (one per ``threads`` value) and its keyword params."""
        params = dict(config)
        k = self.kernel
        threads = params.pop("threads", k.threads)
        sibling = self._siblings.get(threads)
        if sibling is None:
            sibling = _kernel.Kernel(k.fn, threads=threads, interpret=k.interpret, name=k.name,
                                     sharding=k.sharding)
            sibling.dynamic = k.dynamic
            self._siblings[threads] = sibling
        # The wrapped kernel's rules, as they are now (defvjp may come after autotune).
        sibling.vjp_rule, sibling.jvp_rule = k.vjp_rule, k.jvp_rule
        return sibling, params

    def _bucket(self, specs: tuple[jax.ShapeDtypeStruct, ...]) -> str:
        """The argument part of the record's identity: every argument's shape and dtype, the
        named arguments' only (``key=("x",)``) or the user function's value."""
        if self.key is None:
            return repr([(s.shape, str(s.dtype)) for s in specs])
        if callable(self.key):
            return "user:" + repr(self.key(*specs))
        return repr([(n, s.shape, str(s.dtype)) for n, s in zip(self.kernel.arg_names, specs)
                     if n in self.key])

    def _ir_keys(self, specs: tuple[jax.ShapeDtypeStruct, ...], params: dict[str, Any],
                 target: Target) -> list[tuple[str, str | None]]:
        """Per candidate: its Tile-IR content key (or ``error:`` and the message of the
        KernelError that prunes it) and that pruning reason or None."""
        out: list[tuple[str, str | None]] = []
        for config in self.configs:
            kernel, tuned = self._with(config)
            # The kernels are this tuner's own, so the first trace of each specialisation
            # (the only one that warns) happens here.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ClampedIndexWarning)
                try:
                    spec = kernel._specialise(specs, {**params, **tuned})
                    spec.check_threads(target)
                    key = build.ir_key(spec.compiled_ir)
                except KernelError as e:
                    out.append((f"error: {e}", f"KernelError: {e}"))
                    continue
            clamped = [w for w in caught if issubclass(w.category, ClampedIndexWarning)]
            for w in caught:
                if w not in clamped:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            seen = [i for i, (k, _) in enumerate(out) if k == key]
            if clamped:
                # A direct index that JAX clamps reads or writes another block's elements.
                reason = f"the tile does not fit the shape: {clamped[0].message}"
            elif seen:
                reason = f"the same Tile IR as {_fmt(self.configs[seen[0]])}"
            else:
                reason = None
            out.append((key, reason))
        return out

    def _tune(self, args: tuple[Any, ...], specs: tuple[jax.ShapeDtypeStruct, ...],
              params: dict[str, Any], target: Target, bucket: str,
              params_repr: str) -> TuningReport:
        keyed = self._ir_keys(specs, params, target)
        # Without buckets the record's name holds the candidates' IR keys too, so that
        # kernels differing only in their code keep a record each. A bucket's record is
        # for whatever code tuned it last (its IR keys are checked below).
        code = repr([k for k, _ in keyed]) if self.key is None else ""
        path = _record_path(self.kernel, self.configs, bucket + code, params_repr, target)
        tuning = _config.get("JAXTILE_AUTOTUNE")
        # Untuned, the choice is always the first valid config, whatever was stored.
        record = _read_record(path, len(self.configs)) if tuning else None
        if record is not None:
            # A bucket's record was tuned on some shapes of the bucket: its candidates'
            # IR keys are compared at those shapes.
            if record["specs"] == _specs_json(specs):
                then = keyed
            else:
                then = self._ir_keys(_specs_from_json(record["specs"]), params, target)
            if record["ir_keys"] == [k for k, _ in then]:
                _stats["disk_hits"] += 1
                return _report_from_record(self.name, self.configs, target, record)
        if tuning:
            _check_timing_backend(self.name)
        pruned = [reason if reason is not None
                  else _target_limits(*self._with(c), specs, params, target)
                  for c, (_, reason) in zip(self.configs, keyed)]
        valid = [i for i, reason in enumerate(pruned) if reason is None]
        if not valid:
            reasons = "; ".join(f"{_fmt(c)}: {r}" for c, r in zip(self.configs, pruned))
            raise _error(self.name, f"every candidate was pruned ({reasons})")
        if not tuning:
            best = self.configs[valid[0]]
            candidates = tuple(Candidate(c, None, r) for c, r in zip(self.configs, pruned))
            # Not stored: a later run with tuning on must time.
            return TuningReport(self.name, target.name, candidates, best, False, False)
        times = self._time(args, specs, params, valid, pruned)
        candidates = tuple(Candidate(c, times.get(i), pruned[i])
                           for i, c in enumerate(self.configs))
        timed = [i for i in valid if pruned[i] is None]
        if not timed:
            reasons = "; ".join(f"{_fmt(c)}: {r}" for c, r in zip(self.configs, pruned))
            raise _error(self.name, f"every candidate was pruned ({reasons})")
        best = self.configs[min(timed, key=lambda i: times[i])]
        report = TuningReport(self.name, target.name, candidates, best, False, True)
        _stats["tuned"] += 1
        cache.store_record(path, {
            "format": _FORMAT, "kernel": self.name, "target": target.name,
            "configs": [_fmt(c) for c in self.configs],  # for people reading the file
            "specs": _specs_json(specs), "ir_keys": [k for k, _ in keyed],
            "best": self.configs.index(best),
            "candidates": [{"seconds": c.seconds, "pruned": c.pruned} for c in candidates]})
        return report

    def _prebuild(self, i: int, specs: tuple[jax.ShapeDtypeStruct, ...],
                  params: dict[str, Any], target: Target
                  ) -> tuple[Specialisation, concurrent.futures.Future[Any]] | None:
        """Start compiling candidate ``i`` for ``target`` into the build cache, on the
        compile threads (``build.submit``): its specialisation and the build's future, or
        None when it has nothing to compile."""
        kernel, tuned = self._with(self.configs[i])
        spec = kernel._specialise(specs, {**params, **tuned})
        if spec.empty:
            return None  # runs its reference semantics: nothing to compile
        return spec, build.submit(spec.compiled_ir, target)

    def _inputs(self, args: tuple[Any, ...],
                specs: tuple[jax.ShapeDtypeStruct, ...]) -> tuple[Any, ...]:
        """What the candidates run on: the user's hook, the call's own arrays, or random
        arrays of the arguments' shapes and dtypes (under jit the arguments are tracers)."""
        if self.inputs is not None:
            got = tuple(self.inputs(*specs))
            if len(got) != len(specs):
                raise _error(self.name, f"inputs= returned {len(got)} arrays for "
                             f"{len(specs)} arguments")
            return got
        if all(isinstance(a, np.ndarray | np.generic) or
               (isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)) for a in args):
            return args
        rng = np.random.default_rng(0)
        return tuple(_random(rng, s) for s in specs)

    def _time(self, args: tuple[Any, ...], specs: tuple[jax.ShapeDtypeStruct, ...],
              params: dict[str, Any], valid: list[int],
              pruned: list[str | None]) -> dict[int, float]:
        """Compile the valid candidates in parallel (a compile failure prunes), then time
        them interleaved, ``runs`` rounds; the median of each. ``pruned`` is updated."""
        inputs = self._inputs(args, specs)
        bar = _Progress(self.name, len(valid), self.progress)
        calls: dict[int, Any] = {}
        target = tuning_target()
        with bar:
            # The compilers release the GIL (LLVM in TVM, NVRTC, the linker): the artifacts
            # are built on the compile threads into the build cache, where the calls below
            # find them. Tracing stays on this thread.
            builds: dict[concurrent.futures.Future[Any], tuple[int, Specialisation]] = {}
            for i in valid:
                try:
                    started = self._prebuild(i, specs, params, target)
                except KernelError as e:
                    pruned[i] = f"KernelError: {e}"
                    continue
                if started is not None:
                    builds[started[1]] = (i, started[0])
            for done, future in enumerate(concurrent.futures.as_completed(builds)):
                i, spec = builds[future]
                try:
                    future.result()
                except KernelError as e:
                    pruned[i] = f"KernelError: {e}"
                except Exception as e:  # noqa: BLE001 - e.g. TVM's errors
                    pruned[i] = f"KernelError: {spec.compiler_failure(target, e)}"
                bar.update(f"compiled {done + 1}/{len(builds)}", None,
                           (done + 1) / (len(builds) + 1))
            for i in valid:
                if pruned[i] is not None:
                    continue
                kernel, tuned = self._with(self.configs[i])
                fn = jax.jit(_bound(kernel, {**params, **tuned}))
                try:
                    for _ in range(max(self.warmup, 1)):  # the first run traces and loads
                        jax.block_until_ready(fn(*inputs))
                except KernelError as e:
                    pruned[i] = f"KernelError: {e}"
                else:
                    calls[i] = fn
            samples: dict[int, list[float]] = {i: [] for i in calls}
            for r in range(self.runs):
                for i, fn in calls.items():
                    start = time.perf_counter()
                    jax.block_until_ready(fn(*inputs))
                    samples[i].append(time.perf_counter() - start)
                    _stats["timed_runs"] += 1
                best = min(calls, key=lambda i: statistics.median(samples[i]), default=None)
                bar.update(f"timed {r + 1}/{self.runs} rounds of {len(calls)}",
                           None if best is None else
                           (self.configs[best], statistics.median(samples[best])),
                           (len(valid) + (r + 1) / self.runs) / (len(valid) + 1))
        return {i: statistics.median(s) for i, s in samples.items()}


def _bound(kernel: _kernel.Kernel, params: dict[str, Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return kernel(*args, **params)
    return run


def _random(rng: np.random.Generator, spec: jax.ShapeDtypeStruct) -> jax.Array:
    dtype = np.dtype(spec.dtype)
    if dtype == np.bool_:
        data = rng.random(spec.shape) < 0.5
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        data = rng.integers(max(info.min, -100), min(info.max, 100), spec.shape)
    else:
        data = rng.standard_normal(spec.shape)
    return jax.numpy.asarray(data, dtype=dtype)


def _error(name: str, message: str) -> KernelError:
    """An autotuning error naming the kernel and the user's line."""
    return kernel_error(name, f"autotune: {message}", user_line())


def _check_configs(kernel: _kernel.Kernel,
                   configs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(configs, Mapping) or not isinstance(configs, Sequence) or not configs:
        raise _error(kernel.name, "configs must be a non-empty list of dicts (keyword "
                     f"parameters, and threads), got {configs!r}")
    allowed = set(kernel.param_defaults) | {"threads"}
    out = []
    for config in configs:
        if not isinstance(config, Mapping):
            raise _error(kernel.name, f"each config must be a dict, got {config!r}")
        unknown = sorted(set(config) - allowed)
        if unknown:
            raise _error(kernel.name, f"config {_fmt(config)} sets {unknown}, which are "
                         "not its keyword parameters "
                         f"({', '.join(sorted(kernel.param_defaults)) or 'none'}) or threads")
        out.append(dict(config))
    return out


def tuning_target() -> Target:
    """The target timings are measured on: JAX's default device (a GPU's architecture, its
    architecture-specific one such as ``sm_90a`` where jaxtile has it, as a call on that
    device compiles for), or for the CPU platform what the active backend compiles for."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        name = _config.BACKENDS[_kernel.backend()]
        # The CPU backend compiles for the ISA level JAXTILE_CPU_ISA names, if any.
        return parse_target(_config.cpu_target_name() if name == "cpu" else name)
    return for_platform(device.platform, getattr(device, "compute_capability", None),
                        present=True)


def _check_timing_backend(name: str) -> None:
    if jax.devices()[0].platform == "cpu" and _kernel.backend() != "cpu":
        raise _error(
            name, f"the active backend is {_kernel.backend()!r}, a simulator whose "
            "timings say nothing about real hardware; tune on the GPU or with the cpu "
            "backend (or set JAXTILE_AUTOTUNE=0 to take the first valid config)")


def _target_limits(kernel: _kernel.Kernel, tuned: dict[str, Any],
                   specs: tuple[jax.ShapeDtypeStruct, ...], params: dict[str, Any],
                   target: Target) -> str | None:
    """On a GPU target: why the candidate cannot run well (shared memory over the limit,
    from the code generator; register spills, from ptxas when nvcc is installed or from the
    AMD resource report when clang for AMD GPUs is), else None. A CPU has neither limit."""
    if target.kind not in ("cuda", "hip"):
        return None
    lowered = kernel.lower(*specs, target=target.name, **params, **tuned)
    try:
        lowered.shared_memory  # noqa: B018 - generating the code plans its shared memory
        if target.kind == "hip":
            return _hip_spills(lowered.hip_resources)
        report = lowered.ptxas
    except KernelError as e:
        return f"KernelError: {e}"
    if report is not None and (report.spill_stores or report.spill_loads):
        return (f"register spills ({report.registers} registers, {report.spill_stores} bytes "
                f"spill stores, {report.spill_loads} bytes spill loads)")
    return None


def _hip_spills(report: Any) -> str | None:
    """Why an AMD kernel's resource report rules it out (registers spilled to scratch)."""
    if report is None or not (report.vgpr_spills or report.sgpr_spills or report.scratch_bytes):
        return None
    return (f"register spills ({report.vgprs} VGPRs, {report.agprs} AGPRs, {report.vgpr_spills} "
            f"VGPR and {report.sgpr_spills} SGPR spills, {report.scratch_bytes} bytes of "
            "scratch)")


# --- records -----------------------------------------------------------------------
def _record_path(kernel: _kernel.Kernel, configs: list[dict[str, Any]], bucket: str,
                 params_repr: str, target: Target) -> Path:
    import jaxtile

    code = getattr(kernel.fn, "__code__", None)
    where = f"{code.co_filename}:{code.co_qualname}" if code is not None else ""
    key = cache.content_key(_FORMAT, kernel.name, where,
                            repr([_kernel._params_key(c) for c in configs]), bucket,
                            params_repr, target.describe(), jaxtile.__version__,
                            build.compiler_version())
    return cache.cache_dir() / "autotune" / f"{key}.json"


def _read_record(path: Path, count: int) -> dict[str, Any] | None:
    """A stored record for ``count`` candidates, or None if there is none or it cannot be
    read as one (a damaged record is a miss: the kernel is tuned again)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != _FORMAT \
            or not {"specs", "ir_keys", "best", "candidates"} <= set(record) \
            or not isinstance(record["candidates"], list) or len(record["candidates"]) != count \
            or type(record["best"]) is not int or not 0 <= record["best"] < count \
            or not all(_candidate_record(c) for c in record["candidates"]):
        return None
    try:
        _specs_from_json(record["specs"])
    except (TypeError, ValueError):
        return None
    return record


def _candidate_record(c: Any) -> bool:
    return isinstance(c, dict) and isinstance(c.get("seconds"), float | int | type(None)) \
        and isinstance(c.get("pruned"), str | type(None))


def _specs_json(specs: Sequence[jax.ShapeDtypeStruct]) -> list[list[Any]]:
    return [[list(s.shape), str(s.dtype)] for s in specs]


def _specs_from_json(data: list[list[Any]]) -> tuple[jax.ShapeDtypeStruct, ...]:
    return tuple(jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype)) for shape, dtype in data)


def _report_from_record(name: str, configs: list[dict[str, Any]], target: Target,
                        record: dict[str, Any]) -> TuningReport:
    candidates = tuple(Candidate(c, r["seconds"], r["pruned"])
                       for c, r in zip(configs, record["candidates"]))
    return TuningReport(name, target.name, candidates, configs[record["best"]], True, True)


# --- progress ----------------------------------------------------------------------
class _Progress:
    """A one-line progress bar on stderr: shown when asked (``progress=True``) or, by
    default, when stderr is a terminal."""

    def __init__(self, name: str, count: int, enabled: bool | None):
        self.out = sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.out, "isatty", lambda: False)())
        self.enabled = enabled
        self.name, self.count = name, count
        self.start = time.perf_counter()
        self.best: tuple[dict[str, Any], float] | None = None

    def __enter__(self) -> _Progress:
        self.update("compiling", None, 0.0)
        return self

    def update(self, stage: str, best: tuple[dict[str, Any], float] | None,
               fraction: float) -> None:
        if not self.enabled:
            return
        self.best = best or self.best
        elapsed = time.perf_counter() - self.start
        width = 20
        filled = min(width, int(fraction * width))
        left = f"~{elapsed * (1 - fraction) / fraction:.0f}s left" if fraction > 0 else ""
        best_text = (f"best {self.best[1] * 1e6:.1f} us ({_fmt(self.best[0])})"
                     if self.best else "best -")
        self.out.write(f"\rautotune {self.name}: [{'#' * filled}{'.' * (width - filled)}] "
                       f"{self.count} candidates, {stage}, {best_text}, {left}\x1b[K")
        self.out.flush()

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.out.write("\n")
            self.out.flush()


@overload
def autotune(kernel: _kernel.Kernel, /, *, configs: Sequence[Mapping[str, Any]],
             key: Key = None, inputs: Inputs = None, runs: int = 5, warmup: int = 1,
             progress: bool | None = None) -> TunedKernel: ...
@overload
def autotune(kernel: None = None, /, *, configs: Sequence[Mapping[str, Any]],
             key: Key = None, inputs: Inputs = None, runs: int = 5, warmup: int = 1,
             progress: bool | None = None) -> Callable[[_kernel.Kernel], TunedKernel]: ...
def autotune(kernel: _kernel.Kernel | None = None, /, *,
             configs: Sequence[Mapping[str, Any]], key: Key = None, inputs: Inputs = None,
             runs: int = 5, warmup: int = 1, progress: bool | None = None
             ) -> TunedKernel | Callable[[_kernel.Kernel], TunedKernel]:
    """Tune a kernel's compile-time parameters: ``@jt.autotune(configs=[...])`` above
    ``@jt.kernel``, or ``jt.autotune(k, configs=[...])``.

    ``configs``: candidate dicts of keyword parameters (and ``threads``). ``key``: which
    arguments' shapes and dtypes a tuning is for (names, default all), or a function of the
    argument ``jax.ShapeDtypeStruct`` s returning a bucket (e.g. a rounded size), so that one
    tuning serves every shape of the bucket. ``inputs``: a function of those structs
    returning the arrays to time on, where random data would be wrong (page tables, lengths,
    routing ids). ``runs``: timed runs per candidate (median); ``warmup``: untimed runs
    first. ``progress``: show a progress bar (default: when stderr is a terminal).
    """
    def wrap(k: _kernel.Kernel) -> TunedKernel:
        return TunedKernel(k, configs, key=key, inputs=inputs, runs=runs, warmup=warmup,
                           progress=progress)

    return wrap(kernel) if kernel is not None else wrap
