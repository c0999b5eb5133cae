"""Static figures of jaxtile's flash-attention forward on CUDA (issue 11: D=128, sm_80, no
spills; issue 18: no spills for float32 either), from ``jt.ops.attention_fwd`` lowered as the
library runs it: 128 threads, the K/V loop a cp.async pipeline, the tiles of
``jt.ops.attention`` (``default_tiles``: 64 x 64 for 16-bit dtypes; float32, whose tf32
fragments take twice the registers, 64 x 32 for D <= 64 and 32 x 32 for D = 128). Also the
flash kernel ``benchmarks/gpu_check.py`` times (``_flash_fwd`` of
``tests/jaxtile/test_language_attention.py``, D = 128) at its 128 x 64 tiles, which spill,
and at 64 x 32, which do not. And ``sm90a_ws``: the FlashAttention-3-style
``jt.ops.attention_fwd_ws`` that ``jt.ops.attention`` runs on ``cuda:sm_90a`` (128 x 128 tiles,
two consumer warpgroups and the producer the warp-specialisation pass adds; HGMMA / UTMALDG
counts), f16 and bf16, causal and not, D = 128 (and 64 with ``--all``).

Prints one JSON object: per configuration (kernel, dtype, head dim, causal, tiles, stages,
architecture) ptxas' registers, spill stores / loads, stack frame, the static shared memory
ptxas reports (0: every array is a view of the dynamic buffer) and the dynamic shared memory
the kernel launches with, SASS counts of HMMA / LDSM / LDGSTS / HGMMA / UTMALDG (cuobjdump,
where installed),
and the compile time (NVRTC in process, else nvcc). No GPU needed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from _timing import emit, log

from jaxtile import ops
from jaxtile.compiler import build
from jaxtile.compiler.cuda.compile import compile_to_library
from jaxtile.compiler.cuda.sass import sass_counts
from jaxtile.compiler.target import parse_target
from jaxtile.ops.attention import default_tiles


def _flash_kernel():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "jaxtile"))
    from test_language_attention import _flash_fwd

    return _flash_fwd


def _figures(kernel: str, d: int, causal: bool, stages: int, arch: str, dtype,
             tiles: tuple[int, int]) -> dict:
    target = parse_target(arch)
    bm, bn = tiles
    if kernel == "jt.ops.attention_fwd_ws":
        q = jax.ShapeDtypeStruct((4, 16, 4096, d), dtype)
        low = ops.attention_fwd_ws.lower(q, q, q, jax.ShapeDtypeStruct((4,), jnp.int32),
                                         causal=causal, stages=stages, bm=bm, bn=bn,
                                         target=arch)
    elif kernel == "gpu_check_flash":
        q = jax.ShapeDtypeStruct((32, 4096, d), dtype)
        low = _flash_kernel().lower(q, q, q, causal=causal, bm=bm, bn=bn, target=arch)
    else:
        q = jax.ShapeDtypeStruct((4, 16, 4096, d), dtype)
        low = ops.attention_fwd.lower(q, q, q, jax.ShapeDtypeStruct((4,), jnp.int32),
                                      causal=causal, stages=stages, bm=bm, bn=bn,
                                      target=arch)
    t0 = time.perf_counter()
    compiled = compile_to_library(build.lowered_ir(low.kernel, target), target)
    seconds = time.perf_counter() - t0
    r = compiled.ptxas
    counts = sass_counts(compiled.cubin)
    name = jnp.dtype(dtype).name
    log(f"{kernel} {name} d={d} causal={causal} tiles={bm}x{bn} stages={stages} {arch}: "
        f"{r.registers} registers, {r.spill_stores}/{r.spill_loads} spill stores/loads")
    return {
        "kernel": kernel, "head_dim": d, "causal": causal, "tiles": [bm, bn],
        "stages": stages, "arch": arch, "dtype": name, "registers": r.registers,
        "spill_stores": r.spill_stores, "spill_loads": r.spill_loads,
        "stack_frame": r.stack_frame, "static_shared_bytes": r.shared_bytes,
        "dynamic_shared_bytes": compiled.launch.dynamic_smem,
        "sass": None if counts is None else {k: counts.get(k, 0)
                                             for k in ("HMMA", "LDSM", "LDGSTS", "HGMMA",
                                                       "UTMALDG")},
        "compiler": compiled.compiler, "compile_s": round(seconds, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all", action="store_true",
                    help="also D=64, 3 stages and sm_90a (default: D=128, 2 stages, sm_80)")
    args = ap.parse_args()
    lib = "jt.ops.attention_fwd"
    configs = [(lib, 128, c, 2, "cuda:sm_80", t) for t in (jnp.bfloat16, jnp.float32)
               for c in (False, True)]
    configs += [(lib, 64, True, 2, "cuda:sm_80", jnp.float32)]
    if args.all:
        configs += [(lib, d, c, s, a, t) for t in (jnp.bfloat16, jnp.float32)
                    for d in (64, 128) for c in (False, True) for s in (2, 3)
                    for a in ("cuda:sm_80", "cuda:sm_90a") if (d, s, a) != (128, 2, "cuda:sm_80")]
    rows = [_figures(k, d, c, s, a, t, default_tiles(t, d)) for k, d, c, s, a, t in configs]
    # the FlashAttention-3-style kernel jt.ops.attention runs on sm_90a (16-bit, D 64/128)
    ws = [_figures("jt.ops.attention_fwd_ws", d, c, 2, "cuda:sm_90a", t, (128, 128))
          for t in (jnp.float16, jnp.bfloat16) for d in ((64, 128) if args.all else (128,))
          for c in (False, True)]
    flash = [_figures("gpu_check_flash", 128, c, 2, "cuda:sm_80", t, tiles)
             for tiles in ((128, 64), (64, 32)) for t in (jnp.float16, jnp.bfloat16)
             for c in (False, True)]

    def clean(r):
        return r["spill_stores"] == r["spill_loads"] == 0

    emit({
        "kernel": f"{lib} (128 threads, cp.async K/V, jt.ops.attention's default tiles)",
        "configs": rows,
        "sm90a_ws": ws,
        "gpu_check_flash": flash,
        "meets_targets": {
            "sm90a_ws_no_spills_hgmma_tma": all(
                clean(r) and (r["sass"] is None or r["sass"]["HGMMA"] > 0 and
                              r["sass"]["UTMALDG"] > 0 and r["sass"]["HMMA"] == 0) for r in ws),
            "d128_sm80_no_spills": all(clean(r) for r in rows
                                       if r["head_dim"] == 128 and r["arch"] == "cuda:sm_80"),
            "float32_no_spills": all(clean(r) for r in rows if r["dtype"] == "float32"),
            "gpu_check_flash_64x32_no_spills": all(clean(r) for r in flash
                                                   if r["tiles"] == [64, 32]),
        },
    })


if __name__ == "__main__":
    main()
