"""Compile time: where it goes (per phase), cold and warm, and how it grows with body size.

Every cold sample is a fresh Python process (this script re-run with ``--child ...``) with
an empty ``$JAXTILE_CACHE_DIR``, and jaxtile's modules compiled to bytecode beforehand, as
an installed wheel has them (``ensure_bytecode``; each row says ``bytecode_cached``):

- ``cold``: ``import jaxtile`` and the first eager call of one library kernel (``jt.ops``)
  on arrays made before the clock starts, timed after ``import jax`` and JAX's own first
  use (``jax.jit(jnp.sin)``), so the time is what jaxtile adds: its import, TVM's import
  (when the compiler is first needed), the compile, the load and the jitted call.
- ``cold_grad``: the same for the first ``jax.value_and_grad`` of ``jt.ops.attention``
  (three kernels: forward, dq, dk/dv).
- ``hit``: ``import jaxtile`` and the first call of a kernel the cache already holds; the
  process must end without having imported TVM or any module of the GPU tiers.
- ``prebuilt``: the ``cold`` call of ``jt.ops.softmax`` under ``JAXTILE_CPU_ISA=x86-64-v3``,
  with the kernel compiled beforehand by ``jaxtile prebuild`` into ``$JAXTILE_PREBUILT_DIR``
  and without (the issue's first call with an empty cache, which must not import TVM).
- ``warm``: one process, TVM imported and a kernel compiled before the clock starts; then
  every specialisation the library's kernels need (their calls, gradients and jvps) is
  built again as a *user* kernel (the same body under another name, so nothing is cached),
  one at a time: the "new specialisation" of the issue, with the size of the shared object
  it produced (``artifact_bytes``: LLVM's time follows the amount of code). Each is built
  ``--builds`` times (3) under as many names and counts with its median build: this VM's
  cores run at two speeds by the minute, and one build per kernel let a few slow builds
  move the median. Also the growth series: a kernel of N chained elementwise ops, N up to
  2000.

Each timed build is split into phases by wrapping the compiler's functions (they are
disjoint; ``other`` is the rest of the call, e.g. JAX's jit of the call and XLA's compile):
``trace`` (the body traced by JAX), ``convert`` (jaxpr to Tile IR), ``neutral_passes``,
``key`` (content keys), ``cache`` (lookup and store), ``tvm_import`` (the CPU backend's
first import), ``target_passes``, ``tir_build`` (Tile IR to TIR), ``tir_passes`` (TVM's TIR
lowering passes, :mod:`jaxtile.compiler.cpu.tir_passes`), ``llvm_opt`` (LLVM IR generation
and LLVM's optimisation pipeline, TVM's ``codegen_build``), ``ir_reload`` (the optimised
LLVM IR printed, rewritten without debug info and parsed again, ``tir_emit.reload_ir``),
``llvm_codegen`` (instruction selection to object code), ``link`` (``ld``, only where the
FFI does not link objects itself) and ``load`` (into the FFI registry: the object linked in
process, or the shared library opened with ``dlopen``). ``phases_cpu_s`` has the same
phases in CPU time of the building thread (``ld`` runs in a child process, so its CPU time
is not counted): on a loaded machine the figures to compare.

- ``prebuilt_library`` (``--prebuilt-library`` only): ``jaxtile prebuild --library`` into a
  fresh directory, then the ``cold`` calls on the host target with it and without.
- ``installed`` (``--installed`` only): the ``cold`` calls of the jaxtile this interpreter
  imports, as installed (a wheel ships the library prebuilt in its package), with no
  ``$JAXTILE_PREBUILT_DIR``, beside the same calls with the package's prebuilt folder hidden
  (they compile), interleaved. Run it with the interpreter of the installation to measure
  (the repository's ``benchmarks`` folder, not its root, is then first on ``sys.path``).

    python benchmarks/compile.py [--processes 3] [--max-ops 2000]
                                 [--prebuilt-only | --warm-only | --prebuilt-library |
                                  --installed]
                                 [--tvm-entry-checks]

``--tvm-entry-checks`` (with ``--warm-only``) builds with TVM's entry assertions, which the
kernels no longer have (the FFI handler checks each call instead), to measure what they cost.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from _timing import emit, environment, log

TARGET_NEW_SPECIALISATION_S = 0.15
TARGET_COLD_OVER_JAX_S = 0.6
TARGET_COLD_GRAD_S = 1.5
COLD_KERNELS = ("add", "matmul", "matmul_relu", "softmax", "rms_norm", "layer_norm",
                "attention")
GROWTH = (1, 10, 100, 500, 1000, 2000)
ENTRY_CHECKS_ENV = "JAXTILE_BENCH_TVM_ENTRY_CHECKS"
"""Set in a child by ``--tvm-entry-checks``: its CPU kernels are built with TVM's entry
assertions, as before the FFI handler checked the calls (the comparison of
``benchmarks/README.md``'s "entrychecks" section)."""
PHASES = ("trace", "convert", "neutral_passes", "key", "cache", "tvm_import", "target_passes",
          "tir_build", "tir_passes", "llvm_opt", "ir_reload", "llvm_codegen", "link", "load")


class Phases:
    """Seconds per compiler phase, from wrappers around the functions that do each."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.cpu_seconds = dict.fromkeys(PHASES, 0.0)
        self._backend_wrapped = False

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.cpu_seconds = dict.fromkeys(PHASES, 0.0)

    def add(self, phase: str, wall: float, cpu: float) -> None:
        self.seconds[phase] += wall
        self.cpu_seconds[phase] += cpu

    def timed(self, phase: str | Callable[..., str], fn: Callable[..., Any]) -> Callable:
        # The calling thread's CPU time: a build runs in its caller's thread (LLVM too), and
        # on a loaded machine it is the figure that other processes inflate least.
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                name = phase(*args, **kwargs) if callable(phase) else phase
                self.add(name, time.perf_counter() - t0, time.thread_time() - c0)
        return wrapper

    def install(self) -> None:
        """Wrap the compiler's entry points (before any kernel is traced)."""
        from jaxtile import _trace
        from jaxtile.compiler import build, cache, from_jaxpr, pipelines
        from jaxtile.primitives import kernel_call, lowering

        neutral = (pipelines.NEUTRAL, pipelines.NEUTRAL_DYNAMIC)
        _trace.trace = self.timed("trace", _trace.trace)
        from_jaxpr.convert = self.timed("convert", from_jaxpr.convert)
        pipelines.run = self.timed(
            lambda _k, p: "neutral_passes" if p in neutral else "target_passes", pipelines.run)
        build.kernel_key = self.timed("key", build.kernel_key)
        build.ir_key = self.timed("key", build.ir_key)
        cache.find = self.timed("cache", cache.find)
        cache.store = self.timed("cache", cache.store)
        lowering.load = self.timed("load", lowering.load)
        kernel_call.load = lowering.load
        backend = build.backend

        def backend_then_wrap(target: Any) -> Any:
            module = self.timed("tvm_import", backend)(target)
            if not self._backend_wrapped and target.kind == "cpu":
                self._wrap_cpu_backend(module)
            return module

        build.backend = backend_then_wrap

    def _wrap_cpu_backend(self, lower: Any) -> None:
        self._backend_wrapped = True
        tir_emit = lower.tir_emit
        lower.to_tir = self.timed("tir_build", lower.to_tir)
        build_fn = tir_emit.build
        if os.environ.get(ENTRY_CHECKS_ENV):
            def build_fn(func: Any, cpu: str, *, _build: Any = tir_emit.build,
                         **kwargs: Any) -> Any:
                return _build(func, cpu, **{**kwargs, "checks": True})
        tir_emit.build = self.timed("tir_passes", build_fn)
        tir_emit.reload_ir = self.timed("ir_reload", tir_emit.reload_ir)
        # tirx.build runs the TIR passes, then hands the module to LLVM through this
        # module-level function; its time moves from tir_passes to llvm_opt.
        tvm_build = sys.modules["tvm.tirx.build"]
        codegen_build = tvm_build.codegen_build

        def codegen_timed(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return codegen_build(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                self.add("llvm_opt", wall, cpu)
                self.add("tir_passes", -wall, -cpu)

        tvm_build.codegen_build = codegen_timed
        run = subprocess.run

        def run_timed(cmd: Any, *args: Any, **kwargs: Any) -> Any:
            linking = isinstance(cmd, list | tuple) and cmd and cmd[0] == "ld"
            return (self.timed("link", run) if linking else run)(cmd, *args, **kwargs)

        export = tir_emit.export

        def export_timed(module: Any, path: str) -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            link0, link_cpu0 = self.seconds["link"], self.cpu_seconds["link"]
            subprocess.run = run_timed
            try:
                export(module, path)
            finally:
                subprocess.run = run
                self.add("llvm_codegen",
                         time.perf_counter() - t0 - (self.seconds["link"] - link0),
                         time.thread_time() - c0 - (self.cpu_seconds["link"] - link_cpu0))

        tir_emit.export = export_timed
        # Where the FFI links objects itself, code generation ends at the object.
        tir_emit.object_code = self.timed("llvm_codegen", tir_emit.object_code)

    @contextlib.contextmanager
    def measure(self, into: dict[str, Any]) -> Iterator[None]:
        """Time the block: ``into`` gets ``total_s``, ``cpu_s`` (the process's CPU time, which
        a loaded machine inflates less than wall time), each phase and ``other``."""
        self.reset()
        gc.collect()  # a pending full collection would land in the timed section
        t0, c0 = time.perf_counter(), time.process_time()
        yield
        total = time.perf_counter() - t0
        into["total_s"] = round(total, 4)
        into["cpu_s"] = round(time.process_time() - c0, 4)
        into["phases_s"] = {k: round(v, 4) for k, v in self.seconds.items()}
        into["phases_s"]["other"] = round(total - sum(self.seconds.values()), 4)
        into["phases_cpu_s"] = {k: round(v, 4) for k, v in self.cpu_seconds.items()}


def _operands(name: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The call of a library kernel (as a function of arrays) and its arguments."""
    import jax
    import jax.numpy as jnp

    r = jax.random.split(jax.random.key(0), 4)
    f32 = jnp.float32
    if name == "add":
        return None, (jax.random.normal(r[0], (1 << 16,), f32),
                      jax.random.normal(r[1], (1 << 16,), f32))
    if name in ("matmul", "matmul_relu"):
        return None, (jax.random.normal(r[0], (256, 256), f32),
                      jax.random.normal(r[1], (256, 256), f32))
    if name == "softmax":
        return None, (jax.random.normal(r[0], (512, 1000), f32),)
    if name in ("rms_norm", "layer_norm"):
        x, w = jax.random.normal(r[0], (512, 1024), f32), jnp.ones((1024,), f32)
        return None, ((x, w) if name == "rms_norm" else (x, w, jnp.zeros((1024,), f32)))
    if name == "attention":
        return None, tuple(jax.random.normal(k, (1, 2, 128, 64), f32) for k in r[:3])
    if name == "attention_grad":
        def loss(q, k, v):
            import jaxtile as jt
            return jnp.sum(jt.ops.attention(q, k, v, causal=True))
        return (lambda *a: jax.value_and_grad(loss, argnums=(0, 1, 2))(*a),
                tuple(jax.random.normal(k, (1, 2, 128, 64), f32) for k in r[:3]))
    raise ValueError(name)


def child_cold(name: str, hide_package_prebuilt: bool = False) -> dict[str, Any]:
    """First call of one kernel in this fresh process (see the module doc);
    ``hide_package_prebuilt``: with the package's prebuilt folder replaced by an empty one
    after the import, so that the call compiles (the ``installed`` case's comparison)."""
    import jax
    import jax.numpy as jnp

    jax.block_until_ready(jax.jit(jnp.sin)(jnp.ones(8)))  # JAX's first use, not timed
    call, args = _operands(name)
    jax.block_until_ready(args)
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    import jaxtile as jt
    import_s, import_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    from jaxtile.compiler import cache
    if hide_package_prebuilt:
        cache.PACKAGE_PREBUILT = cache.PACKAGE_PREBUILT.with_name("hidden-by-benchmark")
    phases = Phases()
    phases.install()
    fn = call or getattr(jt.ops, name)
    row: dict[str, Any] = {"kernel": name, "import_jaxtile_s": round(import_s, 4),
                           "import_jaxtile_cpu_s": round(import_cpu_s, 4),
                           "tvm_imported_by_import": "tvm" in sys.modules,
                           "gpu_modules_by_import": _gpu_modules()}
    with phases.measure(row):
        jax.block_until_ready(fn(*args))
    row["over_import_jax_s"] = round(import_s + row["total_s"], 4)
    row["over_import_jax_cpu_s"] = round(import_cpu_s + row["cpu_s"], 4)
    row["tvm_imported"] = "tvm" in sys.modules
    row["gpu_modules"] = _gpu_modules()
    row["bytecode_cached"] = _bytecode_cached()
    row["cache_stats"] = cache.stats()
    return row


# The packages whose modules a cold call imports; each a folder of its own in a development
# install (the repository's `jaxtile/`, `compiler/`, `primitives/`).
_PACKAGES = ("jaxtile", "jaxtile.compiler", "jaxtile.primitives")


def ensure_bytecode() -> bool:
    """Compile jaxtile's modules to bytecode where it is missing, as installing a wheel does,
    so that the cold cases time what an installation does. A development install under
    ``PYTHONDONTWRITEBYTECODE`` has none, and every cold process then compiled jaxtile's
    sources again: 0.1-0.2 s more to ``import jaxtile`` and 60-70 ms more in the first build
    (its lazily imported modules) on the Zen 4 VM. False where a folder cannot be written."""
    done = True
    for name in _PACKAGES:
        for folder in importlib.util.find_spec(name).submodule_search_locations or ():
            done &= bool(compileall.compile_dir(folder, quiet=1))
    return done


def _bytecode_cached() -> bool:
    """Whether this process read the bytecode of jaxtile's modules instead of compiling
    their sources (a module's cached file exists)."""
    names = [m for m in sys.modules if m.split(".")[0] == "jaxtile"]
    files = [getattr(sys.modules[m], "__file__", None) for m in names]
    return all(os.path.exists(importlib.util.cache_from_source(f))
               for f in files if f and f.endswith(".py"))


def _gpu_modules() -> int:
    """How many modules of the GPU tiers this process has imported (none on the CPU's
    paths)."""
    tiers = tuple(f"jaxtile.compiler.{t}" for t in ("gpu", "cuda", "hip", "emulator"))
    return sum(1 for m in sys.modules if m.startswith(tiers))


def _library_specialisations() -> list[tuple[Any, Any]]:
    """Every (kernel, specialisation) the library's calls, gradients and jvps create, one
    per distinct IR: two specialisations can differ only in how their tiles were chosen
    (from the table or by the caller) and then build the same code, whose second build is a
    cache hit, not a compile (counting both once put two hits of 9-17 ms among the 20
    "compiles" and lowered the median)."""
    import jax
    import jax.numpy as jnp

    import jaxtile as jt
    from jaxtile.compiler import build

    for name in COLD_KERNELS:
        _, args = _operands(name)
        fn = getattr(jt.ops, name)
        jax.block_until_ready(fn(*args))
        if name not in ("add", "matmul_relu"):
            def loss(*a, fn=fn):
                return jnp.sum(fn(*a) ** 2)
            jax.block_until_ready(jax.grad(loss, argnums=tuple(range(len(args))))(*args))
            jax.block_until_ready(jax.jvp(fn, args, args))
    found, seen = [], set()
    for name in jt.ops.__all__:
        k = getattr(jt.ops, name)
        if not isinstance(k, jt.Kernel):
            continue
        for spec in k._specs.values():
            if spec.batch:
                continue
            key = build.ir_key(spec.compiled_ir)
            if key not in seen:
                seen.add(key)
                found.append((k, spec))
    return found


def _chain_kernel(n: int) -> Any:
    """A kernel whose body is ``n`` chained elementwise ops on one tile."""
    import jax.numpy as jnp

    import jaxtile as jt

    def chain(x):
        (m,) = x.shape
        out = jt.empty((m,), x.dtype)
        i = jt.grid(jt.cdiv(m, 512))
        t = jt.fragment((512,), x.dtype)
        jt.copy(x.at[i * 512], t)
        v = t[...]
        for j in range(n):
            v = v * jnp.float32(0.999) if j % 2 else v + jnp.float32(0.5)
        t[...] = v
        jt.copy(t, out.at[i * 512])
        return out

    return jt.kernel(chain, name=f"chain{n}")


def child_warm(max_ops: int, builds: int) -> dict[str, Any]:
    """New specialisations in a warm process (see the module doc); each kernel is built
    ``builds`` times under as many names (so every build compiles: the name is part of the
    content key), and its row is the build of median time, with all the times in
    ``builds_s``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxtile as jt
    from jaxtile.primitives import kernel_call

    jax.block_until_ready(jt.ops.add(jnp.ones(8), jnp.ones(8)))  # TVM imported, one compile
    specs = _library_specialisations()
    phases = Phases()
    phases.install()
    target = specs[0][1].cpu_platform_target
    rows = []
    for k, spec in specs:
        tries, libraries = [], set()
        for n in range(builds):
            user = jt.kernel(k.fn, threads=k.threads, name=f"user{n}_{k.name}")
            trial: dict[str, Any] = {"kernel": spec.label}
            with phases.measure(trial):
                entry = user.specialisation(spec.specs, spec.params, ()).build(
                    target, kernel_call.load)
            # LLVM's share grows with the code it is given: the artifact's size shows how
            # much.
            trial["artifact_bytes"] = os.path.getsize(entry.library)
            libraries.add(entry.library)
            tries.append(trial)
        if len(libraries) != builds:
            raise RuntimeError(f"{spec.label}: a build was a cache hit, not a compile")
        row = sorted(tries, key=lambda r: r["total_s"])[(builds - 1) // 2]
        row["builds_s"] = [r["total_s"] for r in tries]
        rows.append(row)
    growth = []
    x = jnp.linspace(0, 1, 4096, dtype=jnp.float32)
    for n in [g for g in GROWTH if g <= max_ops]:
        kern = _chain_kernel(n)
        row = {"ops": n}
        with phases.measure(row):
            spec = kern.specialisation((jax.ShapeDtypeStruct(x.shape, x.dtype),), {}, ())
            spec.build(target, kernel_call.load)
        want = np.asarray(x, np.float32)
        for j in range(n):
            want = want * np.float32(0.999) if j % 2 else want + np.float32(0.5)
        np.testing.assert_allclose(np.asarray(kern(x)), want, rtol=1e-4)
        growth.append(row)
    return {"new_specialisations": rows, "growth": growth}


def run_child(args: list[str], cache_dir: str, **extra_env: str) -> dict[str, Any]:
    env = {**os.environ, "JAXTILE_CACHE_DIR": cache_dir, **extra_env}
    env.pop("JAXTILE_INTERPRET", None)
    proc = subprocess.run([sys.executable, __file__, "--child", *args], env=env,
                          capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


PREBUILT_KERNEL = ("softmax", "jaxtile.ops:softmax", ("f32[512,1000]",))
"""The library kernel of the ``prebuilt`` case and its operands' types (``_operands``')."""


def prebuilt_case(processes: int, root: str) -> dict[str, Any] | None:
    """The first call of a library kernel in fresh processes with an empty cache, once
    with the kernel prebuilt for x86-64-v3 (``jaxtile prebuild``, ``$JAXTILE_PREBUILT_DIR``)
    and once without, both under ``JAXTILE_CPU_ISA=x86-64-v3``; None where this CPU cannot
    run that level."""
    from jaxtile.compiler.target import check_isa_level

    try:
        check_isa_level("x86-64-v3")
    except ValueError:
        return None
    name, ref, arg_types = PREBUILT_KERNEL
    prebuilt = tempfile.mkdtemp(dir=root)
    args = [a for t in arg_types for a in ("--arg", t)]
    subprocess.run([sys.executable, "-m", "jaxtile", "prebuild", ref, *args, "--target",
                    "cpu:x86-64-v3", "--out", prebuilt], check=True, capture_output=True,
                   timeout=900)
    isa = {"JAXTILE_CPU_ISA": "x86-64-v3"}
    rows = {"prebuilt": [], "compiled": []}
    for _ in range(processes):
        rows["prebuilt"].append(run_child(["cold", name], tempfile.mkdtemp(dir=root),
                                          JAXTILE_PREBUILT_DIR=prebuilt, **isa))
        rows["compiled"].append(run_child(["cold", name], tempfile.mkdtemp(dir=root), **isa))
    return {"kernel": name, **{case: {
        "over_import_jax_s": _median([r["over_import_jax_s"] for r in found]),
        "over_import_jax_cpu_s": _median([r["over_import_jax_cpu_s"] for r in found]),
        "samples_over_import_jax_cpu_s": [r["over_import_jax_cpu_s"] for r in found],
        "tvm_imported": any(r["tvm_imported"] for r in found),
        "gpu_modules": max(r["gpu_modules"] for r in found)} for case, found in rows.items()}}


def prebuilt_library_case(processes: int, root: str) -> dict[str, Any]:
    """``--prebuilt-library``: ``jaxtile prebuild --library`` (every x86-64 level) into a
    fresh directory, then the ``cold`` first call of each library kernel (and the
    ``value_and_grad`` of attention) on the host target, ``processes`` fresh processes
    each, with that directory in ``$JAXTILE_PREBUILT_DIR`` and an empty cache, beside the
    same calls compiling (no prebuilt directory), interleaved."""
    prebuilt = tempfile.mkdtemp(dir=root)
    env = {k: v for k, v in os.environ.items() if k != "JAXTILE_CPU_ISA"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "jaxtile", "prebuild", "--library", "--out",
                           prebuilt], check=True, capture_output=True, text=True, timeout=3600,
                          env={**env, "JAXTILE_CACHE_DIR": tempfile.mkdtemp(dir=root)})
    entries = proc.stdout.strip().splitlines()
    wall = time.perf_counter() - t0
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {
        n: {"prebuilt": [], "compiled": []} for n in (*COLD_KERNELS, "attention_grad")}
    with _without_env("JAXTILE_CPU_ISA"):
        for i in range(processes):
            for name, found in rows.items():
                found["prebuilt"].append(run_child(["cold", name], tempfile.mkdtemp(dir=root),
                                                   JAXTILE_PREBUILT_DIR=prebuilt))
                found["compiled"].append(run_child(["cold", name], tempfile.mkdtemp(dir=root)))
            log(f"compile: prebuilt library round {i + 1}/{processes} done")
    return {"prebuild": {"entries": len(entries), "wall_s": round(wall, 1),
                         "bytes": sum(int(e.split("(")[1].split()[0]) for e in entries)},
            "first_calls": {name: {case: {
                "over_import_jax_cpu_s": _median([r["over_import_jax_cpu_s"] for r in found]),
                "min_over_import_jax_cpu_s": min(r["over_import_jax_cpu_s"] for r in found),
                "over_import_jax_s": _median([r["over_import_jax_s"] for r in found]),
                "samples_over_import_jax_cpu_s": [r["over_import_jax_cpu_s"] for r in found],
                "tvm_imported": any(r["tvm_imported"] for r in found),
                "gpu_modules": max(r["gpu_modules"] for r in found)}
                for case, found in cases.items()} for name, cases in rows.items()}}


def installed_case(processes: int, root: str) -> dict[str, Any]:
    """``--installed``: the ``cold`` first call of each library kernel (and the
    ``value_and_grad`` of attention) of the jaxtile this interpreter imports, on the host
    target, ``processes`` fresh processes each with an empty cache and no
    ``$JAXTILE_PREBUILT_DIR``: as installed, and with the package's prebuilt folder hidden
    (compiling), interleaved."""
    import jaxtile
    from jaxtile.compiler import cache

    rows: dict[str, dict[str, list[dict[str, Any]]]] = {
        n: {"installed": [], "compiled": []} for n in (*COLD_KERNELS, "attention_grad")}
    with _without_env("JAXTILE_CPU_ISA"), _without_env("JAXTILE_PREBUILT_DIR"):
        for i in range(processes):
            for name, found in rows.items():
                found["installed"].append(run_child(["cold", name], tempfile.mkdtemp(dir=root)))
                found["compiled"].append(run_child(["cold-hidden", name],
                                                   tempfile.mkdtemp(dir=root)))
            log(f"compile: installed round {i + 1}/{processes} done")
    return {"package": os.path.dirname(jaxtile.__file__),
            "package_prebuilt_entries": len(list(cache.PACKAGE_PREBUILT.glob("*/*.so"))),
            "first_calls": {name: {case: {
                "over_import_jax_cpu_s": _median([r["over_import_jax_cpu_s"] for r in found]),
                "min_over_import_jax_cpu_s": min(r["over_import_jax_cpu_s"] for r in found),
                "over_import_jax_s": _median([r["over_import_jax_s"] for r in found]),
                "samples_over_import_jax_cpu_s": [r["over_import_jax_cpu_s"] for r in found],
                "prebuilt_hits": max(r["cache_stats"]["prebuilt_hits"] for r in found),
                "stored": max(r["cache_stats"]["stored"] for r in found),
                "tvm_imported": any(r["tvm_imported"] for r in found),
                "gpu_modules": max(r["gpu_modules"] for r in found)}
                for case, found in cases.items()} for name, cases in rows.items()}}


@contextlib.contextmanager
def _without_env(name: str) -> Iterator[None]:
    """The children run without the environment variable ``name`` (without
    ``JAXTILE_CPU_ISA``: on the host target, which finds prebuilt entries by its level)."""
    before = os.environ.pop(name, None)
    try:
        yield
    finally:
        if before is not None:
            os.environ[name] = before


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


def _median_phases(rows: list[dict[str, Any]], key: str = "phases_s") -> dict[str, float]:
    names = rows[0][key]
    return {p: _median([r[key][p] for r in rows]) for p in names}


def _warm_summary(warm: dict[str, Any]) -> dict[str, Any]:
    new_specs = warm["new_specialisations"]
    return {"median_s": _median([r["total_s"] for r in new_specs]),
            "median_cpu_s": _median([r["cpu_s"] for r in new_specs]),
            "median_artifact_bytes": int(statistics.median(r["artifact_bytes"]
                                                           for r in new_specs)),
            "phases_median_s": _median_phases(new_specs),
            "phases_cpu_median_s": _median_phases(new_specs, "phases_cpu_s"),
            "per_kernel": new_specs}


def _growth_summary(warm: dict[str, Any]) -> dict[str, Any]:
    growth = warm["growth"]
    return {"rows": growth,
            "ms_per_op": {r["ops"]: round(r["total_s"] / r["ops"] * 1e3, 3) for r in growth},
            "cpu_ms_per_op": {r["ops"]: round(r["cpu_s"] / r["ops"] * 1e3, 3)
                              for r in growth}}


def first_calls_report(key: str, side: str, case: dict, processes: int) -> dict:
    """The report of a first-calls case (``prebuilt_library_case``, ``installed_case``) under
    ``key``, judged on its ``side`` (the calls that should compile nothing)."""
    calls = case["first_calls"]
    library = [calls[n][side]["over_import_jax_cpu_s"] for n in COLD_KERNELS]
    return {"benchmark": "compile", "processes_per_case": processes, key: case,
            "targets": {"cold_over_import_jax_s": TARGET_COLD_OVER_JAX_S,
                        "cold_value_and_grad_attention_s": TARGET_COLD_GRAD_S},
            "meets_target": {
                f"cold_{side}_max": max(library) <= TARGET_COLD_OVER_JAX_S,
                f"cold_value_and_grad_attention_{side}":
                    calls["attention_grad"][side]["over_import_jax_cpu_s"]
                    <= TARGET_COLD_GRAD_S},
            "environment": environment()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per case")
    parser.add_argument("--max-ops", type=int, default=max(GROWTH))
    parser.add_argument("--builds", type=int, default=3,
                        help="builds of each new specialisation (its median is counted)")
    parser.add_argument("--prebuilt-only", action="store_true",
                        help="only the prebuilt case (first call with and without it)")
    parser.add_argument("--warm-only", action="store_true",
                        help="only the warm process (new specialisations, growth)")
    parser.add_argument("--prebuilt-library", action="store_true",
                        help="only the first calls with the library prebuilt per x86-64 "
                        "level (jaxtile prebuild --library) and without")
    parser.add_argument("--installed", action="store_true",
                        help="only the first calls of the installed jaxtile (a wheel's "
                        "prebuilt library) and, interleaved, the same compiling")
    parser.add_argument("--tvm-entry-checks", action="store_true",
                        help="build the CPU kernels with TVM's entry assertions (the "
                        "compile time before the FFI handler checked calls)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, *rest = args.child
        result = (child_warm(int(rest[0]), int(rest[1])) if mode == "warm"
                  else child_cold(rest[0], hide_package_prebuilt=mode == "cold-hidden"))
        print(json.dumps(result))
        return
    if not ensure_bytecode():
        log("compile: jaxtile's bytecode could not be written; cold figures include "
            "compiling its sources (see bytecode_cached)")
    if args.prebuilt_library or args.installed:
        key, side, run_case = (("prebuilt_library", "prebuilt", prebuilt_library_case)
                               if args.prebuilt_library
                               else ("installed", "installed", installed_case))
        with tempfile.TemporaryDirectory(prefix="jaxtile-bench-") as root:
            emit(first_calls_report(key, side, run_case(args.processes, root), args.processes))
        return
    if args.prebuilt_only:
        with tempfile.TemporaryDirectory(prefix="jaxtile-bench-") as root:
            emit({"benchmark": "compile", "processes_per_case": args.processes,
                  "prebuilt_first_call": prebuilt_case(args.processes, root),
                  "targets": {"cold_over_import_jax_s": TARGET_COLD_OVER_JAX_S},
                  "environment": environment()})
        return

    if args.warm_only:
        with tempfile.TemporaryDirectory(prefix="jaxtile-bench-") as root:
            checks = {ENTRY_CHECKS_ENV: "1"} if args.tvm_entry_checks else {}
            warm = run_child(["warm", str(args.max_ops), str(args.builds)],
                             tempfile.mkdtemp(dir=root), **checks)
        emit({"benchmark": "compile", "tvm_entry_checks": args.tvm_entry_checks,
              "warm_new_specialisation": _warm_summary(warm),
              "growth": _growth_summary(warm),
              "targets": {"new_specialisation_s": TARGET_NEW_SPECIALISATION_S},
              "environment": environment()})
        return

    cold: dict[str, list[dict[str, Any]]] = {n: [] for n in (*COLD_KERNELS, "attention_grad")}
    hits: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="jaxtile-bench-") as root:
        for i in range(args.processes):
            for name in cold:
                cold[name].append(run_child(["cold", name], tempfile.mkdtemp(dir=root)))
            warm_dir = tempfile.mkdtemp(dir=root)
            run_child(["cold", "softmax"], warm_dir)
            hits.append(run_child(["cold", "softmax"], warm_dir))
            log(f"compile: cold round {i + 1}/{args.processes} done")
        log("compile: prebuilt ...")
        prebuilt = prebuilt_case(args.processes, root)
        log("compile: warm process ...")
        warm = run_child(["warm", str(args.max_ops), str(args.builds)], tempfile.mkdtemp(dir=root))

    cold_summary = {
        name: {"over_import_jax_s": _median([r["over_import_jax_s"] for r in rows]),
               "over_import_jax_cpu_s": _median([r["over_import_jax_cpu_s"] for r in rows]),
               "import_jaxtile_s": _median([r["import_jaxtile_s"] for r in rows]),
               "import_jaxtile_cpu_s": _median([r["import_jaxtile_cpu_s"] for r in rows]),
               "first_call_s": _median([r["total_s"] for r in rows]),
               "first_call_cpu_s": _median([r["cpu_s"] for r in rows]),
               "phases_s": _median_phases(rows),
               "samples_over_import_jax_s": [r["over_import_jax_s"] for r in rows],
               "bytecode_cached": all(r["bytecode_cached"] for r in rows)}
        for name, rows in cold.items()}
    library = [v for k, v in cold_summary.items() if k != "attention_grad"]
    cold_median = _median([c["over_import_jax_s"] for c in library])
    new_median = _median([r["total_s"] for r in warm["new_specialisations"]])
    grad_s = cold_summary["attention_grad"]["over_import_jax_s"]
    emit({
        "benchmark": "compile",
        "processes_per_case": args.processes,
        "cold": cold_summary,
        "cold_median_over_import_jax_s": cold_median,
        "cache_hit": {"over_import_jax_s": _median([r["over_import_jax_s"] for r in hits]),
                      "over_import_jax_cpu_s": _median([r["over_import_jax_cpu_s"]
                                                        for r in hits]),
                      "tvm_imported": any(r["tvm_imported"] for r in hits),
                      "gpu_modules": max(r["gpu_modules"] for r in hits)},
        "prebuilt_first_call": prebuilt,
        "tvm_imported_by_import_jaxtile": any(r["tvm_imported_by_import"]
                                              for rows in cold.values() for r in rows),
        "gpu_modules_imported_by_import_jaxtile": max(
            r["gpu_modules_by_import"] for rows in cold.values() for r in rows),
        "warm_new_specialisation": _warm_summary(warm),
        "growth": _growth_summary(warm),
        "targets": {"new_specialisation_s": TARGET_NEW_SPECIALISATION_S,
                    "cold_over_import_jax_s": TARGET_COLD_OVER_JAX_S,
                    "cold_value_and_grad_attention_s": TARGET_COLD_GRAD_S},
        "meets_target": {"new_specialisation": new_median <= TARGET_NEW_SPECIALISATION_S,
                         "cold": cold_median <= TARGET_COLD_OVER_JAX_S,
                         "cold_value_and_grad_attention": grad_s <= TARGET_COLD_GRAD_S},
        "environment": environment(),
    })


if __name__ == "__main__":
    main()
