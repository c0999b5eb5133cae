"""The ``jaxtile`` command (also ``python -m jaxtile``): ``doctor``, ``cache``, ``inspect``,
``prebuild``, ``bench``.

Each subcommand is a function of its parsed arguments returning the exit status; errors a
user can fix (a bad kernel reference, argument spec or duration) are one line on stderr
and status 2, as argparse's own are.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_SHOWS = ("ir", "lowered", "source", "ptxas", "smem", "layouts")
_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
           "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8",
           "u16": "uint16", "u32": "uint32", "u64": "uint64", "bool": "bool"}
_ARG = re.compile(r"([A-Za-z0-9_]+)\[([0-9, ]*)\]")


class UsageError(Exception):
    """A mistake in the command line or what it names; printed without a traceback."""


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GiB"


def _age(seconds: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds / length:.0f}{unit}"
    return f"{seconds:.0f}s"


# --- doctor ----------------------------------------------------------------------------
def _doctor(args: argparse.Namespace) -> int:
    from jaxtile.compiler import doctor

    checks = doctor.run()
    width = max(len(c.name) for c in checks)
    for c in checks:
        mark = "ok" if c.ok else "--"
        print(f"[{mark}] {c.name:<{width}}  {c.detail}")
        if not c.ok and c.advice:
            print(f"     {'':<{width}}  -> {c.advice}")
    return 1 if any(c.required and not c.ok for c in checks) else 0


# --- cache -----------------------------------------------------------------------------
def _cache_ls(args: argparse.Namespace) -> int:
    from jaxtile.compiler import cache, cache_admin

    now = time.time()
    found = cache_admin.entries()
    for e in found:
        what = f"{e.kind:<22} {e.symbol}" if not e.problem else f"DAMAGED: {e.problem}"
        print(f"{e.key[:16]}  {_size(e.size):>10}  {_age(now - e.mtime):>4}  {what}")
    print(f"{len(found)} entries in {cache.cache_dir()}")
    return 0


def _cache_stats(args: argparse.Namespace) -> int:
    from jaxtile.compiler import cache, cache_admin

    found = cache_admin.entries()
    others = cache_admin.other_files()
    print(f"cache directory: {cache.cache_dir()}")
    print(f"entries: {len(found)} ({_size(sum(e.size for e in found))})")
    kinds: dict[str, int] = {}
    for e in found:
        kinds[e.kind or "damaged"] = kinds.get(e.kind or "damaged", 0) + 1
    for kind, count in sorted(kinds.items()):
        print(f"  {kind}: {count}")
    other_size = sum(p.stat().st_size for p in others)
    print(f"emulator builds: {len(others)} files ({_size(other_size)})")
    return 0


def _cache_verify(args: argparse.Namespace) -> int:
    from jaxtile.compiler import cache_admin

    found = cache_admin.entries()
    bad = [e for e in found if e.problem]
    for e in bad:
        print(f"{e.key}: {e.problem} ({', '.join(str(p) for p in e.files)})")
    print(f"{len(found)} entries checked, {len(bad)} damaged"
          + (" (a kernel call rebuilds them; `jaxtile cache clear` removes them)" if bad else ""))
    return 1 if bad else 0


def _cache_clear(args: argparse.Namespace) -> int:
    from jaxtile.compiler import cache, cache_admin

    older = None
    if args.older_than is not None:
        try:
            older = cache_admin.parse_duration(args.older_than)
        except ValueError as e:
            raise UsageError(f"--older-than: {e}") from None
    files, size = cache_admin.clear(older_than=older)
    print(f"removed {files} files ({_size(size)}) from {cache.cache_dir()}")
    return 0


# --- inspect ---------------------------------------------------------------------------
def _load_file(path: str) -> Any:
    """Run the Python file ``path`` as a module and return it."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location(f"_jaxtile_cli_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.resolve().parent))  # its own imports, as `python file` has
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    return module


def _lookup(ref: str, expected: str, prefix: str = "") -> tuple[str, str, Any]:
    """``(where, name, value)`` for ``where:name``, where is ``path/to/file.py`` (run as a
    module) or an importable module; ``expected`` says the form in the usage error."""
    where, sep, name = ref.rpartition(":")
    if not sep or not where or not name:
        raise UsageError(f"{prefix}expected {expected}, got {ref!r}")
    if where.endswith(".py"):
        module = _load_file(where)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise UsageError(f"{prefix}cannot import {where}: {e}") from None
    return where, name, getattr(module, name, None)


def load_kernel(ref: str) -> Any:
    """The kernel ``path/to/file.py:name`` (the file is run as a module) or
    ``module:name`` (``jaxtile.ops:softmax``) names."""
    import jaxtile as jt

    path, name, found = _lookup(ref, "path/to/file.py:kernel_name or module:kernel_name")
    if not isinstance(found, jt.Kernel):
        what = "not defined" if found is None else f"a {type(found).__name__}"
        raise UsageError(f"{path}: {name} is {what}, not a jaxtile kernel (@jt.kernel)")
    return found


def parse_arg(text: str) -> Any:
    """``f32[1024,1024]`` (or ``float32[...]``, ``i32[]`` for a scalar) as a
    ``jax.ShapeDtypeStruct``."""
    import jax

    m = _ARG.fullmatch(text.strip())
    if m is None:
        raise UsageError(f"--arg {text!r}: expected dtype[dims], e.g. f32[1024,1024]")
    dtype_name, dims = m.groups()
    try:
        dtype = jax.numpy.dtype(_DTYPES.get(dtype_name, dtype_name))
    except TypeError:
        raise UsageError(f"--arg {text!r}: unknown dtype {dtype_name!r}; use one of "
                         f"{', '.join(_DTYPES)}") from None
    shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
    return jax.ShapeDtypeStruct(shape, dtype)


def parse_param(text: str) -> tuple[str, Any]:
    """``name=value``: a Python literal (``64``, ``0.5``, ``True``, ``'x'``) or else text."""
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise UsageError(f"--param {text!r}: expected name=value, e.g. bm=64")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


def _layouts(lowered: Any) -> str:
    # The lowered IR's declarations carry each register tile's layout (``dtype[dims]#...``),
    # followed by ``  # file:line``.
    annotated = [line.strip() for line in lowered.lowered_ir.splitlines()
                 if "]#" in line.partition("  # ")[0]]
    conversions = lowered.conversions
    lines = ["register tile layouts:", *(f"  {a}" for a in annotated or ["none"]),
             "layout conversions:", *(f"  {c}" for c in conversions or ["none"])]
    return "\n".join(lines)


def _show(lowered: Any, what: str) -> str:
    if what == "ir":
        return lowered.tile_ir
    if what == "lowered":
        return lowered.lowered_ir
    if what == "source":
        return lowered.source
    if what == "smem":
        return lowered.shared_memory
    if what == "layouts":
        return _layouts(lowered)
    report = lowered.ptxas
    if report is None:
        raise UsageError("--show ptxas needs nvcc (install the CUDA toolkit or set $NVCC)")
    return (f"registers {report.registers}, spill stores {report.spill_stores} B, spill loads "
            f"{report.spill_loads} B, stack frame {report.stack_frame} B, shared memory "
            f"{report.shared_bytes} B")


def _inspect(args: argparse.Namespace) -> int:
    import jaxtile as jt

    kernel = load_kernel(args.kernel)
    specs = [parse_arg(a) for a in args.arg]
    params = dict(parse_param(p) for p in args.param)
    cuda_only = [s for s in args.show if s in ("ptxas", "smem", "layouts")]
    if cuda_only and not args.target.startswith("cuda:"):
        raise UsageError(f"--show {'/'.join(cuda_only)} needs a CUDA target, "
                         "e.g. --target cuda:sm_80")
    try:
        lowered = kernel.lower(*specs, target=args.target, **params)
        for what in args.show:
            if len(args.show) > 1:
                print(f"== {what} ==")
            print(_show(lowered, what))
    except jt.KernelError as e:
        raise UsageError(str(e)) from None
    return 0


def _prebuild(args: argparse.Namespace) -> int:
    """Compile without running, for each ``--target``, into ``--out`` as cache entries: a
    prebuilt directory (``$JAXTILE_PREBUILT_DIR``, or the package's ``compiler/prebuilt``)
    whose entries later calls on any machine of that target load instead of compiling.
    ``--library``: the kernels of the library's common calls (``jaxtile/ops/_library.py``),
    by default for every x86-64 level, into the package's own prebuilt folder."""
    import os

    import jaxtile as jt
    from jaxtile.compiler import cache
    from jaxtile.compiler.target import ISA_LEVELS, parse_target

    if (args.kernel is None) == (args.library is None):
        raise UsageError("name a kernel (path/to/file.py:kernel) or --library, not both")
    if args.library is not None and (args.arg or args.param):
        raise UsageError("--arg and --param go with a kernel, not with --library")
    out = args.out or (str(cache.PACKAGE_PREBUILT) if args.library is not None else None)
    if out is None:
        raise UsageError("--out DIR is required with a kernel")
    default = [f"cpu:{level}" for level in ISA_LEVELS] if args.library is not None else ["cpu"]
    try:
        targets = [parse_target(name) for name in args.target or default]
    except ValueError as e:
        raise UsageError(f"--target: {e}") from None
    # The cache would fall back to a temporary directory (with a warning) where ``out``
    # cannot be written, and the entries would be lost: say so instead.
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create {out} ({e.strerror or e}); pass --out DIR") from None
    if not os.access(out, os.W_OK):
        raise UsageError(f"cannot write {out}; pass --out DIR and name DIR in "
                         "JAXTILE_PREBUILT_DIR")
    # The entries are written where the cache is: the output directory, while this runs.
    before = os.environ.get("JAXTILE_CACHE_DIR")
    os.environ["JAXTILE_CACHE_DIR"] = str(Path(out).resolve())
    cache.clear_memory()
    try:
        if args.library is not None:
            _prebuild_library(args.library, targets)
        else:
            kernel = load_kernel(args.kernel)
            specs = [parse_arg(a) for a in args.arg]
            params = dict(parse_param(p) for p in args.param)
            for target in targets:
                lowered = kernel.lower(*specs, target=target.name, **params)
                _built(lowered.target, lowered.kernel)
    except jt.KernelError as e:
        raise UsageError(str(e)) from None
    finally:
        cache.clear_memory()
        if before is None:
            del os.environ["JAXTILE_CACHE_DIR"]
        else:
            os.environ["JAXTILE_CACHE_DIR"] = before
    return 0


def _built(target_name: str, kernel: Any, label: str = "") -> None:
    """Build ``kernel`` (Tile IR) for the target named and print its entry."""
    from jaxtile.compiler import build
    from jaxtile.compiler.target import parse_target

    _written(target_name, build.build(kernel, parse_target(target_name)), label)


def _written(target_name: str, entry: Any, label: str) -> None:
    """Make sure the built ``entry`` is in the output directory (the cache directory while
    ``prebuild`` runs), and print it. A lookup that finds the key in a prebuilt directory
    (``$JAXTILE_PREBUILT_DIR``, the package's own) returns that entry without writing one:
    it is copied, so the output directory holds every entry asked for."""
    from jaxtile.compiler import cache

    if not Path(entry.library).resolve().is_relative_to(cache.cache_dir().resolve()):
        meta = entry.meta
        entry = cache.store(entry.key, Path(entry.library).read_bytes(), meta.symbol,
                            meta.num_blocks, alignment=meta.alignment, kind=entry.kind,
                            launch=meta.launch, ptx_bytes=meta.ptx_bytes,
                            signature=meta.signature)
    size = Path(entry.library).stat().st_size
    print(f"{target_name}: {entry.key} ({size} B){' ' + label if label else ''}")


def _prebuild_library(only: Sequence[str], targets: Sequence[Any]) -> None:
    """The library's calls (``only`` those named) compiled for ``targets``, each kernel
    specialisation with the tiles its target's table chooses, on the compile threads (one
    per CPU: the wheel build runs this)."""
    from jaxtile.compiler import build
    from jaxtile.ops import _library

    try:
        specs = _library.specialisations(only)
    except ValueError as e:
        raise UsageError(f"--library: {e}") from None
    for target in targets:
        if target.kind != "cpu":
            raise UsageError(f"--library prebuilds for CPU targets; got {target.name}")
    builds = []
    for target in targets:
        for spec in specs:
            mine = spec.for_target(target)
            builds.append((target.name, build.submit(mine.compiled_ir, target), mine.label))
    for name, future, label in builds:
        _written(name, future.result(), label)


# --- bench -----------------------------------------------------------------------------
def load_function(ref: str) -> Any:
    """The function ``module:name`` or ``path/to/file.py:name`` names."""
    where, name, found = _lookup(ref, "module:function or file.py:function", "--against: ")
    if not callable(found):
        raise UsageError(f"--against: {where} has no function {name}")
    return found


def _random_inputs(specs: Sequence[Any], seed: int) -> list[Any]:
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(seed), max(len(specs), 1))
    inputs = []
    for key, spec in zip(keys, specs):
        if jnp.issubdtype(spec.dtype, jnp.floating):
            inputs.append(jax.random.normal(key, spec.shape, spec.dtype))
        elif spec.dtype == jnp.bool_:
            inputs.append(jax.random.bernoulli(key, 0.5, spec.shape))
        else:
            inputs.append(jax.random.randint(key, spec.shape, 0, 16, spec.dtype))
    return inputs


def _median_seconds(fn: Any, inputs: Sequence[Any], runs: int) -> tuple[float, Any]:
    import jax

    result = jax.block_until_ready(fn(*inputs))  # compile and warm up outside the timing
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn(*inputs))
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2], result


def _bench(args: argparse.Namespace) -> int:
    import jax
    import numpy as np

    import jaxtile as jt

    kernel = load_kernel(args.kernel)
    against = load_function(args.against)
    specs = [parse_arg(a) for a in args.arg]
    params = dict(parse_param(p) for p in args.param)
    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    inputs = _random_inputs(specs, args.seed)
    try:
        ours, got = _median_seconds(jax.jit(lambda *xs: kernel(*xs, **params)), inputs,
                                    args.runs)
    except jt.KernelError as e:
        raise UsageError(str(e)) from None
    theirs, want = _median_seconds(jax.jit(against), inputs, args.runs)
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    if len(got_leaves) != len(want_leaves):
        raise UsageError(f"the kernel returns {len(got_leaves)} arrays, --against "
                         f"{len(want_leaves)}")
    worst, agree = 0.0, True
    for g, w in zip(got_leaves, want_leaves):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g64.shape != w64.shape:
            raise UsageError(f"the kernel returns shape {g64.shape}, --against {w64.shape}")
        tol = 2e-2 if np.dtype(g.dtype).itemsize <= 2 else 1e-4
        worst = max(worst, float(np.max(np.abs(g64 - w64), initial=0.0)))
        agree = agree and bool(np.allclose(g64, w64, rtol=tol, atol=tol))
    print(f"backend {jt.backend()}, median of {args.runs} runs")
    print(f"{kernel.name:<24} {ours * 1e3:10.3f} ms")
    print(f"{args.against:<24} {theirs * 1e3:10.3f} ms   ({theirs / ours:.2f}x the kernel's time)")
    print(f"max |difference| {worst:.3g}: " + ("results agree" if agree else "RESULTS DIFFER"))
    return 0 if agree else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxtile", description="jaxtile: kernels for JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="toolchains, GPU driver, JAX plugins, CPU ISA, "
                            "cache: what is found and what to do where something is missing")
    doctor.set_defaults(run=_doctor)

    cache = sub.add_parser("cache", help="the on-disk kernel cache ($JAXTILE_CACHE_DIR)")
    cache_sub = cache.add_subparsers(dest="action", required=True)
    cache_sub.add_parser("ls", help="every entry: key, size, age, kind, symbol").set_defaults(
        run=_cache_ls)
    cache_sub.add_parser("stats", help="entry counts and sizes").set_defaults(run=_cache_stats)
    cache_sub.add_parser("verify", help="check every entry as a lookup does; exit 1 if any "
                         "is damaged").set_defaults(run=_cache_verify)
    clear = cache_sub.add_parser("clear", help="delete entries and emulator builds")
    clear.add_argument("--older-than", metavar="DURATION",
                       help="only those written more than DURATION ago (30m, 12h, 7d, 2w)")
    clear.set_defaults(run=_cache_clear)

    inspect = sub.add_parser("inspect", help="what a kernel compiles to")
    inspect.add_argument("kernel", help="path/to/file.py:kernel_name")
    inspect.add_argument("--arg", action="append", default=[], metavar="DTYPE[DIMS]",
                         help="an argument's type, in order, e.g. f32[1024,1024]")
    inspect.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                         help="a compile-time parameter, e.g. bm=64")
    inspect.add_argument("--target", default="cpu",
                         help="cpu, cpu:x86-64-v3, cuda:sm_80, cuda:sm_90...")
    inspect.add_argument("--show", action="append", choices=_SHOWS, metavar="WHAT",
                         help=f"one of {', '.join(_SHOWS)} (repeatable; default ir)")
    inspect.set_defaults(run=_inspect)

    prebuild = sub.add_parser("prebuild", help="compile a kernel ahead of time into a "
                              "directory of entries that calls load instead of compiling "
                              "($JAXTILE_PREBUILT_DIR)")
    prebuild.add_argument("kernel", nargs="?", help="path/to/file.py:kernel_name or "
                          "module:kernel_name (jaxtile.ops:softmax)")
    prebuild.add_argument("--library", nargs="*", metavar="CALL",
                          help="instead of a kernel: the kernels of the library's common "
                          "calls (all, or those named: softmax, attention_grad...), by "
                          "default for every x86-64 level into the package's prebuilt "
                          "folder")
    prebuild.add_argument("--arg", action="append", default=[], metavar="DTYPE[DIMS]",
                          help="an argument's type, in order, e.g. f32[1024,1024]")
    prebuild.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                          help="a compile-time parameter, e.g. bm=64")
    prebuild.add_argument("--target", action="append", metavar="TARGET",
                          help="cpu:x86-64-v3, cpu:x86-64-v4 (code for every CPU of that "
                          "level) or cpu (this CPU only); repeatable, default cpu (with "
                          "--library: every x86-64 level)")
    prebuild.add_argument("--out", metavar="DIR",
                          help="the directory to write the entries to (with --library, "
                          "default: the package's compiler/prebuilt)")
    prebuild.set_defaults(run=_prebuild)

    bench = sub.add_parser("bench", help="time a kernel against a JAX function on random "
                           "inputs, and compare their results")
    bench.add_argument("kernel", help="path/to/file.py:kernel_name")
    bench.add_argument("--against", required=True, metavar="MODULE:FUNCTION",
                       help="the function to compare with (module:name or file.py:name), "
                       "called with the same arrays")
    bench.add_argument("--arg", action="append", default=[], metavar="DTYPE[DIMS]",
                       help="an argument's type, in order, e.g. f32[1024,1024]")
    bench.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                       help="a compile-time parameter of the kernel, e.g. bm=64")
    bench.add_argument("--runs", type=int, default=20, help="timed runs of each (median)")
    bench.add_argument("--seed", type=int, default=0, help="of the random inputs")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = _parser().parse_args(argv)
    if getattr(args, "show", None) is None and args.command == "inspect":
        args.show = ["ir"]
    try:
        return int(args.run(args))
    except UsageError as e:
        print(f"jaxtile {args.command}: {e}", file=sys.stderr)
        return 2
