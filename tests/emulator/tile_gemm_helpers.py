"""Running the planner's GEMM kernels (compiler/gpu/gemm_kernel.py) in the emulator."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from jaxtile.compiler.emulator import Buffer, EmulatedKernel, LaunchConfig, Scalar
from jaxtile.compiler.gpu.gemm_kernel import gemm_kernel_source
from jaxtile.compiler.gpu.gemm_plan import GemmPlan, plan_gemm
from jaxtile.compiler.target import parse_target

SM80 = parse_target("cuda:sm_80")


def plan(bm: int, bn: int, bk: int, dtype: str, acc: str = "float32", threads: int = 128,
         **kw) -> GemmPlan:
    """A block-tile plan for sm_80 with both operands of ``dtype``."""
    return plan_gemm(bm, bn, bk, dtype, dtype, acc, threads, target=SM80, **kw)


def operands(p: GemmPlan, M: int, N: int, K: int, seed: int = 0):
    """Random A and B as stored (transposed when the plan says so), and their logical
    [M, K] and [K, N] views."""
    rng = np.random.default_rng(seed)
    dt = ml_dtypes.bfloat16 if p.a_dtype.name == "bfloat16" else p.a_dtype
    if np.issubdtype(p.a_dtype, np.integer):
        a = rng.integers(-8, 8, (M, K)).astype(dt)
        b = rng.integers(-8, 8, (K, N)).astype(dt)
    else:
        a = rng.standard_normal((M, K)).astype(dt)
        b = rng.standard_normal((K, N)).astype(dt)
    a_st = np.ascontiguousarray(a.T) if p.trans_a else a
    b_st = np.ascontiguousarray(b.T) if p.trans_b else b
    return a_st, b_st, a, b


def run(p: GemmPlan, M: int, N: int, K: int, *, stages: int = 3, seed: int = 0,
        dump: bool = False):
    """Build and run the kernel of plan ``p`` on C[M, N] = A @ B; returns (C, a, b, report[,
    D]) with a, b the logical operands."""
    name = f"gemm_{p.a_dtype.name}"
    src = gemm_kernel_source(p, name, stages, dump_accumulator=dump)
    acc = p.acc_dtype.name
    params = [Buffer("A", p.a_dtype.name), Buffer("B", p.b_dtype.name), Buffer("C", acc)]
    if dump:
        params.append(Buffer("D", acc))
    params += [Scalar("M", M), Scalar("N", N), Scalar("K", K)]
    grid = (-(-N // p.n), -(-M // p.m), 1)
    k = EmulatedKernel.build(src, name, params, LaunchConfig(grid, (p.threads, 1, 1)),
                             file=f"{name}.cu")
    a_st, b_st, a, b = operands(p, M, N, K, seed)
    c = np.zeros((M, N), p.acc_dtype)
    extra = []
    if dump:
        extra = [np.zeros(grid[0] * grid[1] * p.threads * p.acc_layout.num_local, p.acc_dtype)]
    if p.a_dtype.name != "bfloat16":
        report = k.run(a_st, b_st, c, *extra)
        return (c, a, b, report, *extra)
    # numpy's bfloat16 has no DLPack: go through JAX's FFI call instead.
    import jax.numpy as jnp

    import jaxtile.primitives  # noqa: F401  (registers the custom call target)

    k.report()
    outs = [(x.shape, x.dtype) for x in (c, *extra)]
    results = k.ffi_call(outs, jnp.asarray(a_st), jnp.asarray(b_st))
    report = k.report()
    if report["findings"]:
        raise AssertionError(report["findings"])
    return (np.asarray(results[0]), a, b, report, *(np.asarray(r) for r in results[1:]))


def excess_wavefronts(report) -> list[dict]:
    """The bank-conflict entries with more wavefronts than ideal."""
    return [e for e in report["bank_conflicts"] if e["wavefronts"] > e["ideal_wavefronts"]]


def tf32(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32 in numpy: round to 10 mantissa bits, ties away from zero."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def unswizzled(p: GemmPlan) -> GemmPlan:
    """``p`` with plain row-major shared tiles (to show what the swizzle buys)."""
    return dataclasses.replace(p, a_tile=dataclasses.replace(p.a_tile, swizzled=False),
                               b_tile=dataclasses.replace(p.b_tile, swizzled=False))
