"""The GPU check: jaxtile's kernels on an NVIDIA or AMD GPU, for correctness and against XLA.

For a machine with a GPU (finishes in under 8 minutes; ``--budget`` seconds in all):

- correctness, first: every ``jt.ops`` kernel (forward, and the backward and forward-mode
  kernels through ``jax.grad`` / ``jax.jvp`` of the public ops), a pipelined GEMM and flash
  attention written in the tile language, all at ragged shapes, against independent
  jnp / numpy formulas, each within a tolerance on its largest error relative to the largest
  entry of the formula's result. Any mismatch (or a check that raises) makes the exit status
  1, after the rest has run;
- then the timings: softmax over an 8192 x 8192 float32 matrix against ``jax.nn.softmax``
  (GB/s); GEMM 8192^3 in float16 and bfloat16 (float32 accumulation):
  ``jt.ops.matmul`` against ``jnp.dot`` (cuBLAS, or rocBLAS / hipBLASLt on ROCm), TFLOP/s
  of both and their ratio; the flash-attention forward against
  ``jax.nn.dot_product_attention`` (cuDNN where XLA picks it), causal and not; and
  ``jt.ops.attention``'s forward (``ops_attention``: the FlashAttention-3-style kernel where
  the device's target has TMA, wgmma and setmaxnreg, which kernel ran is reported) against
  ``jax.nn.dot_product_attention(..., implementation="cudnn")``;
- last, the kernel tests (``--tests``) under pytest with JAX's default device the GPU.

What cannot run is reported with the reason (no GPU, out of time) and the rest still runs.
Prints one JSON object; progress goes to stderr.

    python benchmarks/gpu_check.py [--platform auto|cuda|rocm] [--budget 450] [--rounds 5]
                                   [--tests PATH ...]

``--platform`` picks the GPU: ``auto`` (the default) takes JAX's first GPU, NVIDIA's (the
``cuda`` platform) or AMD's (``rocm``, with ``jax-rocm7-plugin``: ``pip install
'jaxtile[rocm]'``); naming one where JAX has no such device is exit status 2, with the
reason. On ROCm the kernels are compiled by clang for the device's gfx architecture and run
through the ROCm handler; the checks that cannot run there yet are expected failures with the
reason (:func:`rocm_expected_failures`), so a ROCm run fails on a wrong result, on one of them
passing (the list is stale), or on any other check failing.

Without a GPU, ``--backend cpu`` or ``--backend cuda-emulator`` (the generated CUDA run in
the SIMT emulator) runs the correctness checks at small shapes, and on the CPU the timings at
``--gemm-size`` / ``--seq``, to check the script itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _timing import emit, environment, interleaved, log, ratio

import jaxtile as jt
from jaxtile import _ffi

ROOT = Path(__file__).resolve().parents[1]
KERNEL_TESTS = ("tests/jaxtile/test_ops.py", "tests/jaxtile/test_language_attention.py",
                "tests/jaxtile/test_language_reductions.py",
                "tests/jaxtile/test_language_gemm_control.py",
                "tests/jaxtile/test_language_atomics.py")
EMULATOR_EXPECTED_FAILURES: dict[str, str] = {}
"""Checks known to fail only in the SIMT emulator (name: why); on a GPU they must pass."""
ROCM_FLASH_LDS = ("the float32 flash-attention check's tiles need 72 KiB of shared memory with "
                  "their reduction scratch, more than the 64 KiB of LDS an AMD workgroup has")


def rocm_expected_failures(names: list[str]) -> dict[str, str]:
    """The checks among ``names`` that cannot pass on ROCm yet (name: why): each fails to
    compile for the gfx target with that reason, which tests/test_gpu_check.py verifies
    without a GPU by lowering every check for ``rocm``."""
    expected = {}
    for name in names:
        if name.startswith("flash_attention_float32"):
            expected[name] = ROCM_FLASH_LDS
    return expected

# The flash-attention forward's (query, key) tiles, in the correctness check and the timing:
# 64 x 32 compiles without spills on sm_80 (128-136 registers; 128 x 64 spilled 12-60 bytes,
# benchmarks/ptxas_attention.py measures both).
FLASH_TILES = (64, 32)


class Clock:
    """The time left of the whole check's budget."""

    def __init__(self, budget: float) -> None:
        self.end = time.monotonic() + budget

    def left(self) -> float:
        return self.end - time.monotonic()


def _why(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:400]}"


def devices(platform: str) -> list[Any]:
    """JAX's devices of ``platform``; empty where JAX has none (no CUDA plugin or no GPU)."""
    try:
        return list(jax.devices(platform))
    except RuntimeError:
        return []


def toolchain(platform: str = "cuda") -> dict[str, Any]:
    """What compiles and runs ``platform``'s kernels here."""
    if platform == "rocm":
        from jaxtile.compiler.hip import toolchain as hip

        runtime = _ffi.rocm_runtime_error()
        return {"compiler": hip.identity(), "clang": hip.clang_path(),
                "runtime": "loaded" if not runtime else runtime}
    from jaxtile.compiler.cuda import fingerprint, sass

    driver = _ffi.cuda_driver_error()
    cuobjdump = sass.cuobjdump_path()
    return {"compiler": fingerprint.toolchain_fingerprint(),
            "nvrtc": fingerprint.nvrtc.library_path(),
            "nvcc": fingerprint.toolchain.nvcc_path(),
            "cuobjdump": cuobjdump[0] if cuobjdump else None,
            "driver": "loaded" if not driver else driver}


def kernel_tests(tests: list[str], seconds: float) -> dict[str, Any]:
    """The kernel tests under pytest on the GPU (JAX's default device)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
           "-rfE", *tests]
    log(f"kernel tests: {' '.join(tests)} (at most {seconds:.0f} s) ...")
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"")[-2000:]
        return {"status": "timed out", "seconds": round(seconds),
                "output_tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail}
    counts = {word: int(n) for n, word in re.findall(
        r"(\d+) (passed|failed|skipped|errors?|xfailed)", proc.stdout.splitlines()[-1]
        if proc.stdout.strip() else "")}
    failures = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"status": "passed" if proc.returncode == 0 else "failed", "counts": counts,
            "failures": failures[:40], "tests": tests}


# -- correctness ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Check:
    """One correctness check: jaxtile's result against an independent formula's."""

    name: str
    ours: Callable[[], Any]    # jaxtile's result (a pytree of arrays)
    want: Callable[[], Any]    # the formula's, with the same tree structure
    tol: float                 # largest |ours - want| allowed, relative to the largest |want|


def _data(shape: tuple[int, ...], dtype: Any = jnp.float32, seed: int = 0) -> Any:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _f64(x: Any) -> np.ndarray:
    return np.asarray(x, np.float64)


def _softmax(x: Any) -> Any:
    e = jnp.exp(x - jnp.max(x, -1, keepdims=True))
    return e / jnp.sum(e, -1, keepdims=True)


def _layer_norm(x: Any, w: Any, b: Any, eps: float = 1e-5) -> Any:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _rms_norm(x: Any, w: Any, eps: float = 1e-6) -> Any:
    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _attention(q: Any, k: Any, v: Any, causal: bool, lengths: Any) -> Any:
    """Grouped-query attention over the first ``lengths[b]`` keys, in float32 jnp."""
    group = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    s = jnp.einsum("bhtd,bhsd->bhts", q, k, precision="highest") / np.sqrt(q.shape[-1])
    t, n = s.shape[-2:]
    keep = jnp.arange(n)[None, :] < lengths[:, None, None, None]
    if causal:
        keep = keep & (jnp.arange(n)[None, :] <= jnp.arange(t)[:, None])
    s = jnp.where(keep, s, -jnp.inf)
    p = jnp.exp(s - jnp.max(s, -1, keepdims=True))
    return jnp.einsum("bhts,bhsd->bhtd", p / jnp.sum(p, -1, keepdims=True), v,
                      precision="highest")


def _decode(q: Any, kp: Any, vp: Any, table: Any, lengths: Any) -> Any:
    """One query token per sequence against its pages of keys and values."""
    hk, _, _, d = kp.shape
    keys, vals = (jnp.moveaxis(x[:, table], 0, 1).reshape(q.shape[0], hk, -1, d)
                  for x in (kp, vp))
    group = q.shape[1] // hk
    keys, vals = (jnp.repeat(x, group, axis=1) for x in (keys, vals))
    s = jnp.einsum("bhd,bhsd->bhs", q, keys, precision="highest") / np.sqrt(d)
    s = jnp.where(jnp.arange(s.shape[-1]) < lengths[:, None, None], s, -jnp.inf)
    return jnp.einsum("bhs,bhsd->bhd", _softmax(s), vals, precision="highest")


def _tile_gemm():
    # The tile-language GEMM whose ptxas figures the tests check (and ptxas_report reports).
    sys.path.insert(0, str(ROOT / "tests"))
    from gemm_kernels import pipelined_gemm

    return pipelined_gemm


def correctness_checks(small: bool) -> list[Check]:
    """Every ``jt.ops`` kernel (the backward and forward-mode ones through ``jax.grad`` and
    ``jax.jvp``), the tile-language GEMM and flash attention, at shapes that leave partial
    tiles: small ones for the CPU and the emulator, larger ones for a GPU. Float32 GEMMs run
    on tf32 tensor cores on CUDA (10-bit mantissas), hence their tolerances."""
    rows, cols = (37, 300) if small else (1000, 1027)
    m, n, k = (70, 40, 72) if small else (1000, 776, 520)   # N, K: 16-byte rows (cp.async)
    b_, h, hk, t, d = (2, 4, 2, 45, 64) if small else (2, 8, 2, 1000, 128)
    lengths = jnp.asarray([t, (2 * t) // 3], jnp.int32)
    checks: list[Check] = []

    # Each check's functions take their operands through functools.partial: the names here
    # are reused for the next checks' operands.
    v, u = _data((rows * cols + 7,)), _data((rows * cols + 7,), seed=1)
    checks.append(Check("add", functools.partial(jt.ops.add, v, u),
                        functools.partial(np.add, _f64(v), _f64(u)), 1e-6))

    x, g = _data((rows, cols)), _data((rows, cols), seed=1)
    w, bias = _data((cols,), seed=2), _data((cols,), seed=3)
    checks.append(Check("softmax", functools.partial(jt.ops.softmax, x),
                        functools.partial(_softmax, x), 1e-5))
    checks.append(Check(
        "softmax_bwd", functools.partial(jax.grad(lambda x: jnp.sum(jt.ops.softmax(x) * g)), x),
        functools.partial(jax.grad(lambda x: jnp.sum(_softmax(x) * g)), x), 1e-4))
    for name, op, formula, args in (("layer_norm", jt.ops.layer_norm, _layer_norm, (x, w, bias)),
                                    ("rms_norm", jt.ops.rms_norm, _rms_norm, (x, w))):
        argnums = tuple(range(len(args)))
        checks.append(Check(f"{name}_fwd", functools.partial(op, *args),
                            functools.partial(formula, *args), 1e-4))
        checks.append(Check(
            f"{name}_bwd",
            functools.partial(jax.grad(lambda *a, op=op: jnp.sum(op(*a) * g), argnums), *args),
            functools.partial(jax.grad(lambda *a, f=formula: jnp.sum(f(*a) * g), argnums),
                              *args), 1e-3))

    a, b = _data((m, k), jnp.float16), _data((k, n), jnp.float16, seed=1)
    want = _f64(a) @ _f64(b)
    for ta in (False, True):
        for tb in (False, True):
            args = (a.T if ta else a, b.T if tb else b)
            checks.append(Check(
                f"matmul_{'t' if ta else 'n'}{'t' if tb else 'n'}",
                functools.partial(jt.ops.matmul, *args, transpose_a=ta, transpose_b=tb),
                lambda want=want: want, 4e-3))
    checks.append(Check("matmul_relu", lambda: jt.ops.matmul_relu(a, b),
                        lambda: np.maximum(want, 0), 4e-3))
    gm = _data((m, n), jnp.float16, seed=2)
    ta_, tb_ = _data((m, k), jnp.float16, seed=3), _data((k, n), jnp.float16, seed=4)
    checks.append(Check(
        "matmul_bwd",
        lambda: jax.grad(lambda a, b: jnp.sum((jt.ops.matmul(a, b) * gm).astype(jnp.float32)),
                         (0, 1))(a, b),
        lambda: (_f64(gm) @ _f64(b).T, _f64(a).T @ _f64(gm)), 1e-2))
    checks.append(Check(
        "matmul_jvp", lambda: jax.jvp(jt.ops.matmul, (a, b), (ta_, tb_)),
        lambda: (want, _f64(ta_) @ _f64(b) + _f64(a) @ _f64(tb_)), 1e-2))
    tile_gemm = _tile_gemm()
    checks.append(Check("tile_gemm", lambda: tile_gemm(a, b, bm=64, bn=64), lambda: want,
                        1e-3))

    q = _data((b_, h, t, d))
    kk, vv = _data((b_, hk, t, d), seed=1), _data((b_, hk, t, d), seed=2)
    go = _data((b_, h, t, d), seed=3)
    tangents = tuple(_data(z.shape, seed=10 + i) for i, z in enumerate((q, kk, vv)))
    for causal in (False, True):
        tag = "_causal" if causal else ""

        def ours(*qkv, causal=causal):
            return jt.ops.attention(*qkv, causal=causal, lengths=lengths)

        def formula(*qkv, causal=causal):
            return _attention(*qkv, causal, lengths)

        checks.append(Check(f"attention_fwd{tag}", functools.partial(ours, q, kk, vv),
                            functools.partial(formula, q, kk, vv), 4e-3))
        # 16-bit operands: on a target with TMA, wgmma and setmaxnreg, the
        # FlashAttention-3-style kernel (jt.ops.attention picks it for f16/bf16 only)
        q16, k16, v16 = (z.astype(jnp.float16) for z in (q, kk, vv))
        checks.append(Check(f"attention_fwd_f16{tag}", functools.partial(ours, q16, k16, v16),
                            functools.partial(formula, *(z.astype(jnp.float32)
                                                         for z in (q16, k16, v16))), 1e-2))
        checks.append(Check(
            f"attention_dq_dkdv{tag}",
            functools.partial(jax.grad(lambda *a, f=ours: jnp.sum(f(*a) * go), (0, 1, 2)),
                              q, kk, vv),
            functools.partial(jax.grad(lambda *a, f=formula: jnp.sum(f(*a) * go), (0, 1, 2)),
                              q, kk, vv), 1e-2))
        checks.append(Check(f"attention_jvp{tag}",
                            functools.partial(jax.jvp, ours, (q, kk, vv), tangents),
                            functools.partial(jax.jvp, formula, (q, kk, vv), tangents), 1e-2))

    page, pages, per_seq = 16, 12 if small else 200, 4 if small else 64
    rng = np.random.default_rng(7)
    table = jnp.asarray(rng.permutation(pages)[:2 * per_seq].reshape(2, per_seq), jnp.int32)
    qd = _data((2, 4, d), seed=8)
    kp, vp = _data((2, pages, page, d), seed=9), _data((2, pages, page, d), seed=10)
    dlen = jnp.asarray([page * per_seq - 27, page * per_seq], jnp.int32)
    checks.append(Check("attention_decode",
                        lambda: jt.ops.attention_decode(qd, kp, vp, table, dlen, splits=2),
                        lambda: _decode(qd, kp, vp, table, dlen), 4e-3))

    flash = _flash_kernel()
    bh, seq = (3, 37) if small else (16, 1000)
    for dtype, tol in ((jnp.float32, 4e-3), (jnp.bfloat16, 3e-2)):
        fq, fk, fv = (_data((1, bh, seq, d), dtype, seed=20 + i) for i in range(3))
        for causal in (False, True):
            checks.append(Check(
                f"flash_attention_{jnp.dtype(dtype)}{'_causal' if causal else ''}",
                functools.partial(flash, fq[0], fk[0], fv[0], causal=causal, bm=FLASH_TILES[0],
                                  bn=FLASH_TILES[1]),
                functools.partial(lambda q, k, v, c: _attention(q, k, v, c, jnp.asarray(
                    [seq], jnp.int32))[0], *(z.astype(jnp.float32) for z in (fq, fk, fv)),
                                  causal), tol))
    return checks


def run_checks(checks: list[Check], expected_failures: dict[str, str]) -> dict[str, Any]:
    """Each check's largest relative error, and whether it is within its tolerance.
    ``expected_failures`` (name: why) turns those checks' failures into ``expected failure``
    and their passes into ``unexpectedly passed`` (itself a failure: the list is stale)."""
    results: dict[str, Any] = {}
    for c in checks:
        log(f"correctness: {c.name} ...")
        try:
            got, want = jax.jit(c.ours)(), c.want()
            errors = [_max_rel_error(g, w) for g, w in zip(jax.tree.leaves(got),
                                                          jax.tree.leaves(want), strict=True)]
            error = max(errors)
            ok = bool(np.isfinite(error)) and error <= c.tol
            entry: dict[str, Any] = {"status": "passed" if ok else "mismatch",
                                     "max_rel_error": error, "tolerance": c.tol}
        except Exception as e:  # noqa: BLE001 - a check that raises fails; the rest still run
            entry = {"status": "error", "error": _why(e)}
        if c.name in expected_failures:
            entry["expected_failure"] = expected_failures[c.name]
            entry["status"] = ("unexpectedly passed" if entry["status"] == "passed"
                               else "expected failure")
        results[c.name] = entry
    failed = [name for name, r in results.items()
              if r["status"] not in ("passed", "expected failure")]
    return {"status": "failed" if failed else "passed", "failed": failed, "checks": results}


def _timed(ours, theirs, args, rounds: int) -> dict[str, list[float]]:
    contenders = {"jaxtile": lambda: ours(*args).block_until_ready(),
                  "xla": lambda: theirs(*args).block_until_ready()}
    interleaved(contenders, rounds=1, calls=1)  # compile and warm up, discarded
    return interleaved(contenders, rounds=rounds, calls=3)


def _throughput(samples: dict[str, list[float]], flops: float) -> dict[str, Any]:
    """TFLOP/s of both contenders (medians) and jaxtile's speed relative to XLA's."""
    seconds = {name: float(np.median(s)) for name, s in samples.items()}
    return {"tflops": {name: round(flops / t / 1e12, 3) for name, t in seconds.items()},
            "speed_jaxtile_over_xla": round(seconds["xla"] / seconds["jaxtile"], 3),
            "time_ratio": ratio(samples, "jaxtile", "xla")}


def _max_rel_error(got, want) -> float:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))


def gemm(dtype: Any, rounds: int, n: int) -> dict[str, Any]:
    """TFLOP/s of jt.ops.matmul (128x128x32 tiles, 3 stages) and jnp.dot on (n, n) @ (n, n);
    both accumulate in float32 and return ``dtype``."""
    keys = jax.random.split(jax.random.key(0), 2)
    a, b = (jax.random.normal(k, (n, n), jnp.float32).astype(dtype) for k in keys)
    ours = jax.jit(functools.partial(jt.ops.matmul, bm=128, bn=128, bk=32, stages=3))
    theirs = jax.jit(jnp.dot)
    error = _max_rel_error(ours(a, b), theirs(a, b))
    samples = _timed(ours, theirs, (a, b), rounds)
    return {"shape": [n, n, n], **_throughput(samples, 2.0 * n ** 3), "max_rel_error": error}


def softmax(rounds: int, n: int) -> dict[str, Any]:
    """GB/s of jt.ops.softmax and jax.nn.softmax over an (n, n) float32 matrix (read once,
    written once): a kernel without jt.gemm, so timed on every GPU (ROCm's included)."""
    x = jax.random.normal(jax.random.key(2), (n, n), jnp.float32)
    ours, theirs = jax.jit(jt.ops.softmax), jax.jit(functools.partial(jax.nn.softmax, axis=-1))
    error = _max_rel_error(ours(x), theirs(x))
    samples = _timed(ours, theirs, (x,), rounds)
    seconds = {name: float(np.median(t)) for name, t in samples.items()}
    return {"shape": [n, n], "gb_per_s": {name: round(2 * x.nbytes / t / 1e9, 1)
                                          for name, t in seconds.items()},
            "speed_jaxtile_over_xla": round(seconds["xla"] / seconds["jaxtile"], 3),
            "time_ratio": ratio(samples, "jaxtile", "xla"), "max_rel_error": error}


def _flash_kernel():
    # The kernel the tests verify, so that the timing is of tested code.
    sys.path.insert(0, str(ROOT / "tests" / "jaxtile"))
    from test_language_attention import _flash_fwd

    return _flash_fwd


def flash_attention(dtype: Any, causal: bool, rounds: int, seq: int, *, bh: int = 32,
                    d: int = 128, bm: int = FLASH_TILES[0], bn: int = FLASH_TILES[1]
                    ) -> dict[str, Any]:
    """Flash-attention forward against jax.nn.dot_product_attention, (bh, seq, d) operands."""
    kernel = _flash_kernel()
    keys = jax.random.split(jax.random.key(1), 3)
    q, k, v = (jax.random.normal(key, (bh, seq, d), jnp.float32).astype(dtype) for key in keys)
    ours = jax.jit(functools.partial(kernel, causal=causal, bm=bm, bn=bn))

    def xla(q, k, v):
        # jax.nn's layout is (batch, seq, heads, dim).
        t = [x[None].transpose(0, 2, 1, 3) for x in (q, k, v)]
        return jax.nn.dot_product_attention(*t, is_causal=causal)[0].transpose(1, 0, 2)

    theirs = jax.jit(xla)
    error = _max_rel_error(ours(q, k, v), theirs(q, k, v))
    samples = _timed(ours, theirs, (q, k, v), rounds)
    flops = 4.0 * bh * seq * seq * d * (0.5 if causal else 1.0)
    return {"shape": {"bh": bh, "seq": seq, "d": d}, "tiles": [bm, bn],
            **_throughput(samples, flops), "max_rel_error": error}


def ops_attention(dtype: Any, causal: bool, rounds: int, seq: int, *, b: int = 2,
                  h: int = 16, d: int = 128) -> dict[str, Any]:
    """``jt.ops.attention``'s forward (the FlashAttention-3-style ``attention_fwd_ws`` where
    the device's target has TMA, wgmma and setmaxnreg, else ``attention_fwd``) against
    ``jax.nn.dot_product_attention(..., implementation="cudnn")`` (XLA's choice where cuDNN
    refuses the call, said in ``reference``), (b, h, seq, d) operands; the error first."""
    from jaxtile.autotune import tuning_target
    from jaxtile.ops.attention import uses_warp_specialised

    target = tuning_target()
    ws = uses_warp_specialised(target, dtype, d)
    keys = jax.random.split(jax.random.key(2), 3)
    q, k, v = (jax.random.normal(key, (b, h, seq, d), jnp.float32).astype(dtype)
               for key in keys)
    ours = jax.jit(functools.partial(jt.ops.attention, causal=causal))

    def reference(implementation):
        def run(q, k, v):
            t = [x.transpose(0, 2, 1, 3) for x in (q, k, v)]   # jax.nn's (B, T, N, D)
            return jax.nn.dot_product_attention(*t, is_causal=causal,
                                                implementation=implementation
                                                ).transpose(0, 2, 1, 3)
        return jax.jit(run)

    try:
        theirs, which = reference("cudnn"), "cudnn"
        want = theirs(q, k, v)
    except Exception as e:  # noqa: BLE001 - cuDNN refuses some shapes and devices: say so
        theirs, which = reference(None), f"xla's choice (cudnn: {_why(e)})"
        want = theirs(q, k, v)
    error = _max_rel_error(ours(q, k, v), want)
    samples = _timed(ours, theirs, (q, k, v), rounds)
    flops = 4.0 * b * h * seq * seq * d * (0.5 if causal else 1.0)
    return {"shape": {"b": b, "h": h, "seq": seq, "d": d}, "target": target.name,
            "kernel": "attention_fwd_ws" if ws else "attention_fwd", "reference": which,
            **_throughput(samples, flops), "max_rel_error": error}


def _attempt(clock: Clock, need: float, what: str, fn) -> dict[str, Any]:
    """``fn()``, or why it did not run (out of time, or the error it raised)."""
    if clock.left() < need:
        return {"not_run": f"out of time ({clock.left():.0f} s left, {what} needs ~{need} s)"}
    log(f"{what} ...")
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - report every failure and go on
        return {"not_run": _why(e)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=450.0, help="seconds in all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tests", nargs="*", default=list(KERNEL_TESTS))
    parser.add_argument("--backend", choices=("gpu", "cpu", "cuda-emulator"), default="gpu",
                        help="where kernels run: the GPU (default), or without one the CPU or "
                             "the SIMT emulator, at small shapes")
    parser.add_argument("--platform", choices=("auto", "cuda", "rocm"), default="auto",
                        help="with --backend gpu: the GPU's JAX platform (auto: the first "
                             "GPU JAX has)")
    parser.add_argument("--gemm-size", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=4096, help="flash attention's length")
    args = parser.parse_args(argv)
    clock = Clock(args.budget)
    result: dict[str, Any] = {"benchmark": "gpu_check", "backend": args.backend,
                              "environment": environment()}
    platform = "cpu"
    if args.backend == "gpu":
        gpus = devices("gpu" if args.platform == "auto" else args.platform)
        if not gpus:
            wanted = {"auto": "GPU", "cuda": "NVIDIA (cuda) GPU",
                      "rocm": "ROCm device (AMD GPU)"}[args.platform]
            reason = f"no {wanted}: JAX's devices are {jax.devices()}"
            if args.platform == "rocm":
                reason += (" (ROCm needs JAX's ROCm plugin, pip install 'jaxtile[rocm]', on a "
                           "machine with ROCm 7 and an AMD GPU)")
            log(reason)
            result.update(gpu=None, not_run=reason, toolchain=_attempt(
                clock, 0, "toolchain",
                functools.partial(toolchain, "rocm" if args.platform == "rocm" else "cuda")))
            emit(result)
            # A platform asked for by name must be there; auto finds what there is.
            return 0 if args.platform == "auto" else 2
        platform = gpus[0].platform
        result["gpu"] = {"platform": platform, "devices": [str(d) for d in gpus],
                         "kind": gpus[0].device_kind,
                         # gfx942... on ROCm, 9.0... on CUDA.
                         "compute_capability": getattr(gpus[0], "compute_capability", None)}
    else:
        jax.clear_caches()   # jax.jit's caches do not know jaxtile's backend
        jt.set_backend(args.backend)
    result["toolchain"] = _attempt(clock, 0, "toolchain",
                                   functools.partial(toolchain, platform))
    # Correctness first, and whatever the budget: a fast wrong kernel is no result.
    checks = correctness_checks(small=args.backend != "gpu")
    expected = EMULATOR_EXPECTED_FAILURES if args.backend == "cuda-emulator" else {}
    if platform == "rocm":
        expected = rocm_expected_failures([c.name for c in checks])
    result["correctness"] = run_checks(checks, expected)
    failed = result["correctness"]["status"] != "passed"
    if args.backend == "cuda-emulator":
        result["timings"] = {"not_run": "the emulator's times say nothing about a GPU's"}
    else:
        result["gemm"] = {str(jnp.dtype(t)): _attempt(clock, 60, f"gemm {jnp.dtype(t)}",
                                                      functools.partial(gemm, t, args.rounds,
                                                                        args.gemm_size))
                          for t in (jnp.float16, jnp.bfloat16)}
        result["softmax"] = _attempt(clock, 20, "softmax",
                                     functools.partial(softmax, args.rounds, args.gemm_size))
        result["flash_attention"] = {
            f"{jnp.dtype(t)}{'_causal' if c else ''}": _attempt(
                clock, 45, "flash attention",
                functools.partial(flash_attention, t, c, args.rounds, args.seq))
            for t in (jnp.float16, jnp.bfloat16) for c in (False, True)}
        result["ops_attention"] = {
            f"{jnp.dtype(t)}{'_causal' if c else ''}": _attempt(
                clock, 45, "jt.ops.attention",
                functools.partial(ops_attention, t, c, args.rounds, args.seq))
            for t in (jnp.float16, jnp.bfloat16) for c in (False, True)}
    if args.backend == "gpu":
        result["kernel_tests"] = _attempt(clock, 30, "kernel tests",
                                          lambda: kernel_tests(args.tests, clock.left() - 5))
        failed = failed or result["kernel_tests"].get("status") in ("failed", "timed out")
    emit(result)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
