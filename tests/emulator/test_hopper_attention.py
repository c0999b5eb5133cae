"""Flash attention on sm_90a with wgmma for both products: ``S = Q @ K^T`` from shared
memory, ``O += P @ V`` with P in registers (the ``wgmma ... {a-regs}, desc-b`` form), P taken
from S's accumulator by an elementwise cast with no trip through shared memory.

The register-A layout is checked against CuTe's RS ``ALayout_64x16`` (re-tabulated in
test_hopper_primitives.py, the table the emulator's wgmma is checked against), not against
the code generator; the kernels run in the emulator against the kernel's reference semantics
and a jnp formula: D 64 and 128, causal, grouped-query, ragged lengths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_hopper_primitives import _tv_index

from jaxtile import ops
from jaxtile.compiler.gpu import gemm_plan
from jaxtile.compiler.target import parse_target

SM90A = parse_target("cuda:sm_90a")


def _data(shape, dtype, seed):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


# -- the plan ---------------------------------------------------------------------------------

@pytest.mark.parametrize("m, k, threads", [(64, 64, 128), (128, 32, 256), (128, 64, 128)])
def test_register_a_is_cutes_rs_a_layout(m, k, threads):
    p = gemm_plan.plan_gemm(m, 128, k, np.float16, np.float16, np.float32, threads,
                            target=SM90A, a_in_registers=True)
    assert p.instr == gemm_plan.GemmInstr.WGMMA and p.a_tile is None
    gm = p.warps[0]
    assert p.warps[1] == 1   # each warpgroup owns whole rows of A
    lay = p.a_layout
    mi_count = m // (64 * gm)
    assert lay.num_local == mi_count * k // 2
    for t in range(threads):
        wg, tt = divmod(t % (128 * gm), 128)
        for mi in range(mi_count):
            for kk in range(k // 16):
                for e in range(8):   # the instruction's a0..a7 of k step kk
                    idx = _tv_index(tt, e)   # m + 64 k in the 64 x 16 step
                    want = (wg * (m // gm) + 64 * mi + idx % 64, 16 * kk + idx // 64)
                    assert lay.coords(t, mi * (k // 2) + 8 * kk + e) == want


def test_register_a_layout_is_the_accumulator_of_the_gemm_before():
    # S = Q @ K^T [64, 64] then O = P @ V with P [64, 64]: P's required layout is S's.
    s = gemm_plan.plan_gemm(64, 64, 128, np.float16, np.float16, np.float32, 128,
                            target=SM90A, trans_b=True, policy="rows")
    o = gemm_plan.plan_gemm(64, 128, 64, np.float16, np.float16, np.float32, 128,
                            target=SM90A, a_in_registers=True)
    assert s.instr == o.instr == gemm_plan.GemmInstr.WGMMA
    assert o.a_layout == s.acc_layout


@pytest.mark.slow   # float32 attention's lowering takes seconds
def test_register_a_that_wgmma_cannot_take_keeps_the_kernel_on_mma_sync():
    # float32 has no register-A wgmma (tf32 A from registers is not planned): every gemm of
    # the kernel stays on mma.sync so that S and P share one layout.
    q = _data((1, 1, 64, 64), jnp.float32, 0)
    low = ops.attention_fwd.lower(q, q, q, jnp.asarray([64], jnp.int32), bm=64, bn=32,
                                  target="cuda:sm_90a")
    assert "instr='wgmma" not in low.lowered_ir and "instr='m16n8k8'" in low.lowered_ir


# -- lowering ---------------------------------------------------------------------------------

@pytest.mark.parametrize("d", [64, 128])
def test_attention_lowers_to_wgmma_for_both_products(d):
    q = _data((1, 2, 128, d), jnp.float16, 0)
    low = ops.attention_fwd.lower(q, q, q, jnp.asarray([128], jnp.int32),
                                  target="cuda:sm_90a")
    text = low.lowered_ir
    assert "instr='wgmma.m64n64k16'" in text and f"instr='wgmma.m64n{d}k16'" in text
    assert "m16n8k16" not in text
    # P (the register A) carries S's accumulator layout, strictly
    assert text.count("#wgmma(m64n64k16, warpgroups 1x1)") >= 2
    src = low.source
    assert "jaxtile::gemm_wgmma_rs<64, " in src and "jaxtile::gemm_wgmma<64, 64, " in src
    assert "gemm_rs<" not in src and "gemm_ss<" not in src
    # no shared staging of P: the only shared buffers are Q, K and V (and their stages)
    assert "p_s" not in text


# -- emulator runs ----------------------------------------------------------------------------

def _exact(q, k, v, causal, lengths):
    """softmax(q k^T / sqrt(d) + mask) v in float32 by jnp, K/V heads repeated for GQA; a row
    that sees no key is 0."""
    group = q.shape[1] // k.shape[1]
    kf = jnp.repeat(k.astype(jnp.float32), group, axis=1)
    vf = jnp.repeat(v.astype(jnp.float32), group, axis=1)
    s = jnp.einsum("bhtd,bhsd->bhts", q.astype(jnp.float32), kf) / np.sqrt(q.shape[-1])
    t, n = s.shape[-2:]
    keep = jnp.arange(n)[None, None, None, :] < lengths[:, None, None, None]
    if causal:
        keep = keep & (jnp.arange(n)[None, :] <= jnp.arange(t)[:, None])[None, None]
    s = jnp.where(keep, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.where(keep, jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0)), 0.0)
    l_sum = jnp.sum(e, axis=-1, keepdims=True)
    return jnp.einsum("bhts,bhsd->bhtd", jnp.where(l_sum > 0, e / l_sum, 0.0), vf)


def _attention_case(b, h, hkv, t, s, d, dtype, causal, lengths, seed):
    q = _data((b, h, t, d), dtype, seed)
    k = _data((b, hkv, s, d), dtype, seed + 1)
    v = _data((b, hkv, s, d), dtype, seed + 2)
    lens = jnp.asarray(lengths, jnp.int32)
    assert "gemm_wgmma_rs" in ops.attention_fwd.lower(q, k, v, lens, causal=causal,
                                                      target="cuda:sm_90a").source
    got = jax.jit(lambda *a: ops.attention(*a[:3], causal=causal, lengths=a[3]))(q, k, v, lens)
    ref, _ = ops.attention_fwd.reference(q, k, v, lens, causal=causal)
    exact = _exact(q, k, v, causal, lens)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == jnp.float16 else dict(rtol=5e-2, atol=5e-2)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref, np.float32), **tol)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(exact), **tol)


@pytest.mark.slow   # about two minutes of emulation on 2 cores
def test_attention_d64_causal_on_sm90a(hopper):
    # 80 queries and keys: the second 64-row tile is ragged; causal skips its later keys
    _attention_case(1, 1, 1, 80, 80, 64, jnp.float16, True, [80], 0)


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_gqa_ragged_on_sm90a(hopper, d, causal):
    # 4 query heads on 2 K/V heads; batch 1 has 50 valid keys of 100, batch 0 all of them
    _attention_case(2, 4, 2, 100, 100, d, jnp.float16, causal, [100, 50], d + causal)


@pytest.mark.slow
def test_attention_bf16_d128_on_sm90a(hopper):
    _attention_case(1, 2, 1, 70, 130, 128, jnp.bfloat16, False, [130], 9)


@pytest.mark.slow
def test_attention_backward_f16_on_sm90a(hopper):
    """The backward kernels' register-A gemms (dq's ``dS @ K``, the JVP's ``P @ V``) run on
    wgmma too (dK/dV's transposed register A stays scalar): gradients against jnp's, and
    ``attention_dq`` against its reference semantics."""
    b, h, t, d = 1, 2, 80, 64
    q, k, v, g = (_data((b, h, t, d), jnp.float16, 20 + i) for i in range(4))
    lens = jnp.full((b,), t, jnp.int32)
    assert "gemm_wgmma_rs" in ops.attention_dq.lower(
        q, k, v, lens, q, jnp.zeros((b, h, t), jnp.float32), g, jnp.zeros((b, h, t), jnp.float32),
        causal=True, target="cuda:sm_90a").source

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * g.astype(jnp.float32))

    got = jax.jit(jax.grad(loss(lambda *a: ops.attention(*a, causal=True)), (0, 1, 2)))(q, k, v)
    want = jax.grad(loss(lambda q, k, v: _exact(q, k, v, True, lens)), (0, 1, 2))(
        *(x.astype(jnp.float32) for x in (q, k, v)))
    for x, y in zip(got, want):
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y), rtol=5e-2,
                                   atol=5e-2)
    out, lse = ops.attention_fwd.reference(q, k, v, lens, causal=True)
    args = (q, k, v, lens, out, lse, g, jnp.zeros_like(lse))
    got = jax.jit(lambda *a: ops.attention_dq(*a, causal=True))(*args)
    ref = ops.attention_dq.reference(*args, causal=True)
    for x, y in zip(got, ref):
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                                   rtol=2e-2, atol=2e-2)

# -- ptxas ------------------------------------------------------------------------------------

@pytest.mark.slow   # NVRTC/ptxas of a D = 128 attention kernel: about half a minute
def test_attention_d128_compiles_for_sm90a_without_spills_on_hgmma_only():
    from jaxtile.compiler import build
    from jaxtile.compiler.cuda import nvrtc, toolchain
    from jaxtile.compiler.cuda.compile import compile_to_library
    from jaxtile.compiler.cuda.sass import sass_counts

    if not nvrtc.available() and toolchain.nvcc_path() is None:
        pytest.skip("no CUDA compiler: neither NVRTC (pip install 'jaxtile[cuda]') nor nvcc")
    q = jax.ShapeDtypeStruct((2, 4, 1024, 128), jnp.float16)
    low = ops.attention_fwd.lower(q, q, q, jax.ShapeDtypeStruct((2,), jnp.int32), causal=True,
                                  target="cuda:sm_90a")
    compiled = compile_to_library(build.lowered_ir(low.kernel, SM90A), SM90A)
    p = compiled.ptxas
    assert p.spill_stores == p.spill_loads == 0 and p.stack_frame == 0, p
    counts = sass_counts(compiled.cubin)
    if counts is not None:   # both products on HGMMA, none left on mma.sync's HMMA
        assert counts.get("HGMMA", 0) > 0 and counts.get("HMMA", 0) == 0, counts
