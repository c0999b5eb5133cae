"""Stored tile tables of the library kernels, and the rule for shapes a table lacks.

A library kernel's tile parameters (``bm``, ``rows``, ...) that a call leaves out come from
the table of the target the call compiles for (:func:`table_name`: the CPU's x86-64 ISA
level, or the newest CUDA architecture whose limits the GPU meets), at the call's
*bucket*: every argument's dtype and shape with each dimension rounded up to a power of
two, plus the parameters that change the kernel's work (``transpose_a``, ``causal``...).
A bucket the table lacks, a target without a table, or a call passing any tile parameter
gets the rule: the kernel's own defaults (:data:`RULES` where they depend on the operands).
A lookup reads one JSON file once per process and times nothing, so a first call stays
as fast as with fixed defaults.

The choice is made per target. A trace does not know the platforms it will be lowered for,
so it chooses for the active backend's target, and each platform's lowering chooses again
for its own (``Specialisation.for_target``): ``jax.export(..., platforms=["cuda"])`` on a
CPU host compiles the CUDA table's tiles, not the CPU's (which may need more shared memory
than a GPU has). The library's differentiation rules, which run at trace time, get only the
tiles the call passed, so the kernels they call choose theirs per target too.

The tables live in ``jaxtile/ops/tiles/<table>.json``; ``tools/tune_tiles.py`` regenerates
them with :func:`jaxtile.autotune` (CPU tables, timed) or with the autotuner's pruning alone
(CUDA tables: shared memory, ptxas register spills; nothing can be timed without the GPU),
and each file says which. ``JAXTILE_TUNE_OPS=1`` opts in to tuning at run time instead: a
call then times the kernel's candidate space for its exact shapes (once per machine: the
result is stored as any autotuned kernel's is).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxtile import _config
from jaxtile import kernel as _kernel
from jaxtile.autotune import TunedKernel, tuning_target
from jaxtile.compiler.target import ISA_LEVELS, Target, parse_target

FORMAT = "jaxtile-tiles-1"
TABLES = Path(__file__).parent / "tiles"
"""Where the stored tables are: ``<table name with ':' as '-'>.json``."""


@dataclasses.dataclass(frozen=True)
class Space:
    """What may be tuned of one library kernel."""

    tuned: tuple[str, ...]
    """The parameters a table entry sets."""
    cpu: tuple[dict[str, Any], ...]
    """Candidates timed for CPU tables (and by ``JAXTILE_TUNE_OPS=1`` on the CPU)."""
    cuda: tuple[dict[str, Any], ...]
    """Candidates for CUDA tables, in order of preference: the first one the pruning
    keeps is stored (bigger tiles first: more reuse per byte loaded, as long as the
    registers and shared memory hold them)."""
    keep: tuple[str, ...] = ()
    """Parameters that are part of the bucket (they change the work, not just its tiling)."""
    shapes: tuple[tuple[tuple[tuple[int, ...], str], ...], ...] = ()
    """Argument (shape, dtype) lists the offline tuning covers (each a bucket of its own)."""

    def candidates(self, target: Target) -> tuple[dict[str, Any], ...]:
        return self.cuda if target.kind == "cuda" else self.cpu


def _mm(bm: int, bn: int, bk: int, stages: int) -> dict[str, Any]:
    return {"bm": bm, "bn": bn, "bk": bk, "stages": stages}


def _rows(*rows: int) -> tuple[dict[str, Any], ...]:
    return tuple({"rows": r} for r in rows)


_MM_CPU = (_mm(64, 64, 32, 2), _mm(64, 64, 64, 2), _mm(128, 64, 32, 2), _mm(64, 128, 32, 2),
           _mm(128, 128, 32, 2), _mm(128, 128, 64, 2), _mm(32, 128, 64, 2))
_MM_CUDA = (_mm(128, 128, 32, 3), _mm(128, 128, 32, 2), _mm(128, 64, 32, 3),
            _mm(64, 128, 32, 3), _mm(64, 64, 64, 3), _mm(64, 64, 32, 2))
_SQUARE = tuple(((n, n), dt) for n in (512, 1024) for dt in ("float32", "bfloat16"))
_ROWS = (((4096, 1024), "float32"), ((4096, 1024), "bfloat16"))
_NORM_BWD = tuple({"rows": r, "groups": g} for r, g in
                  ((4, 8), (2, 8), (8, 8), (4, 4), (4, 16), (8, 4), (16, 2)))
_ATTN = tuple({"bm": bm, "bn": bn} for bm, bn in ((64, 32), (64, 64), (32, 32), (128, 64),
                                                  (64, 128), (128, 128)))


def _with_vectors(rows: Sequence[tuple[tuple[int, int], str]], n: int):
    """Norm operand lists: ``x`` and ``n`` feature vectors of its dtype."""
    return tuple(((shape, dt),) + ((shape[1:], dt),) * n for shape, dt in rows)


def _norm_bwd_shapes(stats: int):
    """``layer_norm_bwd`` (2 row statistics) / ``rms_norm_bwd`` (1) operand lists."""
    out = []
    for (r, c), dt in _ROWS:
        out.append((((r, c), dt), ((c,), dt)) + (((r,), "float32"),) * stats + (((r, c), dt),))
    return tuple(out)


def _attn_shapes():
    out = []
    for dt in ("float32", "bfloat16"):
        qkv = ((1, 8, 1024, 64), dt)
        out.append((qkv, qkv, qkv, ((1,), "int32")))
    return tuple(out)


SPACES: dict[str, Space] = {
    "matmul": Space(("bm", "bn", "bk", "stages"), _MM_CPU, _MM_CUDA,
                    keep=("transpose_a", "transpose_b"),
                    shapes=tuple((s, s) for s in _SQUARE)),
    "matmul_relu": Space(("bm", "bn", "bk", "stages"),
                         (_mm(128, 128, 32, 3),) + _MM_CPU, _MM_CUDA,
                         shapes=tuple((s, s) for s in _SQUARE)),
    "softmax": Space(("rows",), _rows(4, 1, 2, 8, 16), _rows(4, 8, 2, 1),
                     shapes=tuple((s,) for s in _ROWS)),
    "softmax_bwd": Space(("rows",), _rows(4, 1, 2, 8, 16), _rows(4, 8, 2, 1),
                         shapes=tuple((s, s) for s in _ROWS)),
    "layer_norm": Space(("rows",), _rows(4, 1, 2, 8, 16), _rows(4, 8, 2, 1),
                        shapes=_with_vectors(_ROWS, 2)),
    "layer_norm_fwd": Space(("rows",), _rows(4, 1, 2, 8, 16), _rows(4, 8, 2, 1),
                            shapes=_with_vectors(_ROWS, 2)),
    "rms_norm": Space(("rows",), _rows(4, 1, 2, 8, 16), _rows(4, 8, 2, 1),
                      shapes=_with_vectors(_ROWS, 1)),
    "rms_norm_fwd": Space(("rows",), _rows(4, 1, 2, 8, 16), _rows(4, 8, 2, 1),
                          shapes=_with_vectors(_ROWS, 1)),
    "layer_norm_bwd": Space(("rows", "groups"), _NORM_BWD, _NORM_BWD,
                            shapes=_norm_bwd_shapes(2)),
    "rms_norm_bwd": Space(("rows", "groups"), _NORM_BWD, _NORM_BWD,
                          shapes=_norm_bwd_shapes(1)),
    "attention_fwd": Space(("bm", "bn"), _ATTN,
                           tuple(sorted(_ATTN, key=lambda c: -c["bm"] * c["bn"])),
                           keep=("causal",), shapes=_attn_shapes()),
}
"""Every library kernel with a tile table, by kernel name."""


def _attention_rule(specs: Sequence[jax.ShapeDtypeStruct],
                    target: Target | None) -> dict[str, Any]:
    from .attention import default_tiles

    q = specs[0]
    smem = target.caps.max_smem_bytes if target is not None and target.kind != "cpu" else None
    bm, bn = default_tiles(q.dtype, q.shape[-1] if q.shape else 0, smem)
    return {"bm": bm, "bn": bn}


def _attention_backward_rule(name: str, specs: Sequence[jax.ShapeDtypeStruct],
                             target: Target) -> dict[str, Any]:
    from .attention import BACKWARD_TILES, default_tiles

    q = specs[0]
    smem = target.caps.max_smem_bytes if target.kind != "cpu" else None
    q_tiles, kv_tiles, scores16, scores32 = BACKWARD_TILES[name]
    bm, bn = default_tiles(q.dtype, q.shape[-1] if q.shape else 0, smem, q_tiles=q_tiles,
                           kv_tiles=kv_tiles,
                           score_tiles=scores32 if jnp.dtype(q.dtype) == jnp.float32 else scores16)
    return {"bm": bm, "bn": bn}


RULES: dict[str, Callable[[Sequence[jax.ShapeDtypeStruct], Target | None], dict[str, Any]]] = {
    "attention_fwd": _attention_rule,
}
"""Rules that depend on the operands and the target (the others are the kernels' keyword
defaults)."""


def rule(kernel: _kernel.Kernel, specs: Sequence[jax.ShapeDtypeStruct],
         target: Target | None = None) -> dict[str, Any]:
    """The tile parameters a shape without a table entry gets on ``target``."""
    space = SPACES[kernel.name]
    if kernel.name in RULES:
        return RULES[kernel.name](specs, target)
    chosen = {k: kernel.param_defaults[k] for k in space.tuned}
    if target is not None and target.kind != "cpu" and {"bm", "bn", "bk", "stages"} <= set(chosen):
        chosen = _fit_gemm_tiles(chosen, jnp.dtype(specs[0].dtype).itemsize,
                                 target.caps.max_smem_bytes)
    return chosen


def _fit_gemm_tiles(tiles: dict[str, Any], itemsize: int, smem_bytes: int) -> dict[str, Any]:
    """A matmul's tiles whose pipelined A and B tiles fit ``smem_bytes`` (AMD's 64 KiB of LDS
    holds float32's 128 x 128 x 32 in two stages, not three): fewer stages down to two
    first (the tiles' reuse stays), then the larger of ``bm`` and ``bn`` halved."""
    out = dict(tiles)

    def need() -> int:
        return (out["bm"] + out["bn"]) * out["bk"] * out["stages"] * itemsize

    while need() > smem_bytes and out["stages"] > 2:
        out["stages"] -= 1
    while need() > smem_bytes and max(out["bm"], out["bn"]) > 16:
        out["bm" if out["bm"] >= out["bn"] else "bn"] //= 2
    return out


def table_name(target: Target) -> str | None:
    """The table a target uses, from its capabilities: the widest x86-64 ISA level the CPU
    has all of (``cpu:x86-64-v4``, ``cpu:x86-64-v3``), or the newest CUDA architecture with
    a table that the GPU's compute capability and shared memory both cover; None (the
    rules) for other CPUs and GPUs."""
    caps = target.caps
    if target.kind == "cpu":
        if caps.arch not in ("x86_64", "AMD64"):
            return None
        for level in ("x86-64-v4", "x86-64-v3"):
            if set(ISA_LEVELS[level]) <= set(caps.isa):
                return f"cpu:{level}"
        return None
    if target.kind == "cuda":
        fits = []
        for name in stored_tables():
            if not name.startswith("cuda:"):
                continue
            them = parse_target(name).caps
            if them.sm <= caps.sm and them.max_smem_bytes <= caps.max_smem_bytes \
                    and (not them.arch_specific or them == caps):
                fits.append((them.sm, name))
        return max(fits)[1] if fits else None
    return None


def table_path(name: str) -> Path:
    return TABLES / f"{name.replace(':', '-')}.json"


@functools.cache
def stored_tables() -> tuple[str, ...]:
    """The names of the tables shipped with jaxtile."""
    return tuple(sorted(json.loads(p.read_text())["table"] for p in TABLES.glob("*.json")))


@functools.cache
def load(name: str) -> dict[str, Any]:
    """Table ``name``'s entries: kernel name -> bucket -> entry (``config``, and how it
    was chosen); empty if there is no such table."""
    try:
        data = json.loads(table_path(name).read_text())
    except FileNotFoundError:
        return {}
    if data.get("format") != FORMAT:
        raise ValueError(f"{table_path(name)}: not a {FORMAT} table")
    return data["kernels"]


def bucket(kernel: _kernel.Kernel, specs: Sequence[jax.ShapeDtypeStruct],
           params: Mapping[str, Any]) -> str:
    """A table key: each argument's dtype and shape with every dimension rounded up to a
    power of two, and the values of the parameters the kernel's space keeps (given or
    default)."""
    def pow2(n: int) -> int:
        return 1 << max(0, int(n) - 1).bit_length()

    args = " ".join(f"{jnp.dtype(s.dtype).name}[{','.join(str(pow2(d)) for d in s.shape)}]"
                    for s in specs)
    kept = " ".join(f"{k}={params.get(k, kernel.param_defaults[k])!r}"
                    for k in SPACES[kernel.name].keep)
    return f"{args} | {kept}" if kept else args


def active_target() -> Target:
    """What a call compiles for: the active backend's target on the CPU platform, else the
    default device's GPU."""
    return tuning_target()


def choose(kernel: _kernel.Kernel, specs: Sequence[jax.ShapeDtypeStruct],
           params: Mapping[str, Any], target: Target | None) -> dict[str, Any]:
    """The tile parameters for a call that passes none of them (a ``Kernel.tile_rule``):
    tuned now (``JAXTILE_TUNE_OPS=1``, for calls that run), else the table's entry for the
    call's bucket, else :func:`rule`."""
    space = SPACES[kernel.name]
    if any(k in params for k in space.tuned):
        # A call that sets some tiles itself gets the rule's for the others.
        chosen = rule(kernel, specs, target or active_target())
        return {k: v for k, v in chosen.items() if k not in params}
    runs = target is None
    target = target or active_target()
    if runs and _config.get("JAXTILE_TUNE_OPS"):
        return _tune_now(kernel, space, target, tuple(specs), dict(params))
    name = table_name(target)
    entry = load(name).get(kernel.name, {}).get(bucket(kernel, specs, params)) \
        if name else None
    return dict(entry["config"]) if entry else rule(kernel, specs, target)


_tuners: dict[tuple[str, str], TunedKernel] = {}


def _tune_now(kernel: _kernel.Kernel, space: Space, target: Target,
              specs: tuple[jax.ShapeDtypeStruct, ...], params: dict[str, Any]
              ) -> dict[str, Any]:
    """The best of the kernel's candidates for these exact shapes, timed now (or found in
    the autotuner's records from an earlier run)."""
    tuner = _tuners.get((kernel.name, target.kind))
    if tuner is None:
        configs = list(space.candidates(target))
        if (r := rule(kernel, specs, target)) not in configs:
            configs.insert(0, r)
        tuner = TunedKernel(kernel, configs, inputs=inputs_for(kernel.name))
        _tuners[(kernel.name, target.kind)] = tuner
    return tuner.best_config(*specs, **params)


def inputs_for(name: str) -> Callable[..., Sequence[Any]] | None:
    """Timing inputs where random data would be wrong: attention's sequence lengths."""
    if not name.startswith("attention"):
        return None

    def make(*specs: jax.ShapeDtypeStruct) -> list[Any]:
        rng = np.random.default_rng(0)
        out = []
        for s in specs:
            if len(s.shape) == 1 and np.dtype(s.dtype) == np.int32:
                out.append(jnp.full(s.shape, specs[1].shape[2], jnp.int32))  # every key
            else:
                out.append(jnp.asarray(rng.standard_normal(s.shape), s.dtype))
        return out
    return make


def choose_backward(kernel: _kernel.Kernel, specs: Sequence[jax.ShapeDtypeStruct],
                    params: Mapping[str, Any], target: Target | None) -> dict[str, Any]:
    """The tiles of an attention backward kernel (no table: they are not tuned) that a call
    leaves out: :func:`.attention.default_tiles` fitted to the target's shared memory."""
    chosen = _attention_backward_rule(kernel.name, specs, target or active_target())
    return {k: v for k, v in chosen.items() if k not in params}


def install(kernels: Mapping[str, _kernel.Kernel]) -> None:
    """Give each library kernel with a :data:`SPACES` entry its table lookup, and the
    attention backward kernels their shared-memory rule."""
    from .attention import BACKWARD_TILES

    for name, k in kernels.items():
        if name in SPACES:
            k.tile_rule = functools.partial(choose, k)
        elif name in BACKWARD_TILES:
            k.tile_rule = functools.partial(choose_backward, k)
