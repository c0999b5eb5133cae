"""The FlashAttention-3-style forward (``jt.ops.attention_fwd_ws``) on sm_90a: K and V through a
TMA ring of their 4-D ``(B, Hkv, S, D)`` operands, two consumer warpgroups that each own 64 of
a block's 128 query rows, and the producer warpgroup the warp-specialisation pass adds.

What ``jt.ops.attention`` picks on which target; the split as the lowered IR shows it; emulator
runs (no finding) against an independent float64 numpy formula and
``jax.nn.dot_product_attention``: f16 and bf16, causal and not, grouped-query heads (H=4,
Hkv=2), ragged T and S, per-batch lengths, a row that sees no key, NaN in q, sliding windows,
``jax.vmap`` (5-D TMA boxes); and the emulator reporting the missing ``fence.proxy.async`` the
split would leave if it dropped the barrier that orders Q's generic writes before the loop's
wgmma reads."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtile import ops
from jaxtile.compiler.cuda import emulated
from jaxtile.compiler.emulator import EmulatedKernel, EmulatorError
from jaxtile.compiler.target import parse_target

attention_mod = importlib.import_module("jaxtile.ops.attention")   # (ops.attention: the function)


def _data(shape, dtype, seed):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _operands(b, h, hkv, t, s, d, dtype, seed=0):
    return (_data((b, h, t, d), dtype, seed), _data((b, hkv, s, d), dtype, seed + 1),
            _data((b, hkv, s, d), dtype, seed + 2))


# -- which kernel -----------------------------------------------------------------------------

@pytest.mark.parametrize("target, dtype, d, want", [
    ("cuda:sm_90a", jnp.float16, 128, True),
    ("cuda:sm_90a", jnp.bfloat16, 64, True),
    ("cuda:sm_90a", jnp.float32, 128, False),   # no register-A wgmma for P @ V
    ("cuda:sm_90a", jnp.float16, 96, False),    # wgmma's N is 64, 128 or 256
    ("cuda:sm_90a", jnp.float16, 256, False),   # 128 x 128 tiles in 2 stages pass 227 KiB
    ("cuda:sm_90", jnp.float16, 128, False),    # TMA, no wgmma nor setmaxnreg
    ("cuda:sm_80", jnp.float16, 128, False),
    ("hip:gfx942", jnp.float16, 128, False),
    ("cpu", jnp.float16, 128, False),
])
def test_the_warp_specialised_kernel_is_chosen_by_capabilities(target, dtype, d, want):
    assert attention_mod.uses_warp_specialised(parse_target(target), dtype, d) is want


@pytest.mark.parametrize("kw, want", [
    (dict(block_k=64), True), (dict(block_k=32), False),   # S's wgmma N: 64 or 128
    (dict(stages=3), True),     # 32 KiB of Q + 3 x 64 KiB of K and V: 224 KiB
    (dict(stages=4), False),    # 288 KiB: more than an sm_90a block has
])
def test_the_tiles_asked_for_must_fit_the_warp_specialised_kernel(kw, want):
    sm90a = parse_target("cuda:sm_90a")
    assert attention_mod.uses_warp_specialised(sm90a, jnp.float16, 128, **kw) is want


def test_attention_traces_the_ws_kernel_on_the_sm90a_backend(hopper, monkeypatch):
    called = []
    for name in ("attention_fwd", "attention_fwd_ws"):
        real = getattr(attention_mod, name)
        monkeypatch.setattr(attention_mod, name,
                            lambda *a, _r=real, _n=name, **kw: called.append(_n) or _r(*a, **kw))
    q, k, v = _operands(1, 1, 1, 64, 64, 64, jnp.float16)
    jax.eval_shape(lambda *a: ops.attention(*a), q, k, v)
    jax.eval_shape(lambda *a: ops.attention(*a, block_q=64), q, k, v)   # asks for 64 rows
    jax.eval_shape(lambda *a: ops.attention(*a), *(x.astype(jnp.float32) for x in (q, k, v)))
    assert called == ["attention_fwd_ws", "attention_fwd", "attention_fwd"]


# -- the lowered IR ---------------------------------------------------------------------------

def test_lowered_ir_shows_the_split_and_the_4d_tma_ring():
    q = jax.ShapeDtypeStruct((2, 4, 200, 128), jnp.float16)
    kv = jax.ShapeDtypeStruct((2, 2, 150, 128), jnp.float16)
    low = ops.attention_fwd_ws.lower(q, kv, kv, jax.ShapeDtypeStruct((2,), jnp.int32),
                                     causal=True, target="cuda:sm_90a")
    text = low.lowered_ir
    assert ("warp_specialise() {barrier=1, consumer_regs=232, consumers=256, producer_regs=40, "
            "producers=128}") in text
    # both products split M over the two warpgroups (each row's max and sum stay in one)
    gemms = [line for line in text.splitlines() if "gemm()" in line]
    assert len(gemms) == 2 and all("warpgroups=(2, 1)" in g for g in gemms), gemms
    # K and V: 4-D TMA boxes (D in two 64-element column blocks, 128 keys, one head)
    copies = [line for line in text.splitlines() if "copy()" in line and "tma_box" in line]
    assert len(copies) == 2 and all("tma_box=(64, 128, 1, 1)" in c for c in copies), copies
    # the producer reads the key count lengths[b] that bounds the ring
    assert any("src=lengths[" in line and "role='producer'" in line
               for line in text.splitlines())
    assert "tma_release()" in text and "mbarrier_init" not in text
    # Q's generic writes before the loop reach the loop's wgmma reads through the ring
    # set-up's barrier, kept over the consumers with its fence.proxy.async
    head = text[:text.index("for %")]
    assert ("barrier() !{named=(1, 256), proxy_fence=True, reason='every thread is past its "
            "waits") in head
    src = low.source
    assert "JT_LAUNCH_BOUNDS(384, 1)" in src and "setmaxnreg_inc<232>" in src
    assert "tma_load_4d(" in src and "gemm_wgmma_rs" in src


def test_rows_tma_cannot_load_keep_cp_async():
    # D = 60: rows of 120 bytes (not a multiple of 16); the kernel runs unsplit on cp.async
    q = jax.ShapeDtypeStruct((1, 1, 128, 60), jnp.float16)
    low = ops.attention_fwd_ws.lower(q, q, q, jax.ShapeDtypeStruct((1,), jnp.int32),
                                     target="cuda:sm_90a")
    assert "warp_specialise()" not in low.lowered_ir and "tma_box" not in low.lowered_ir
    assert "cp_async" in low.source


# -- emulator runs ----------------------------------------------------------------------------

def _f64(q, k, v, causal, lengths, window=None):
    """softmax(q k^T / sqrt(d) + mask) v in float64 numpy; a row that sees no key is 0; NaN
    scores propagate; ``window=(left, right)``: query i sees keys i - left .. i + right."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("bhtd,bhsd->bhts", q, k) / np.sqrt(q.shape[-1])
    t, n = s.shape[-2:]
    keep = np.arange(n)[None, None, None, :] < np.asarray(lengths)[:, None, None, None]
    if causal:
        keep = keep & (np.arange(n)[None, :] <= np.arange(t)[:, None])[None, None]
    if window is not None:
        offset = np.arange(n)[None, :] - np.arange(t)[:, None]
        keep = keep & ((-window[0] <= offset) & (offset <= window[1]))[None, None]
    s = np.where(keep, s, -np.inf)
    with np.errstate(invalid="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        e = np.where(keep, np.exp(s - np.where(m == -np.inf, 0.0, m)), 0.0)
        total = np.sum(e, axis=-1, keepdims=True)
        p = np.where(total == 0, 0.0, e / np.where(total == 0, 1.0, total))
    return np.einsum("bhts,bhsd->bhtd", p, v), keep.any(axis=-1)


def _check(b, h, hkv, t, s, d, dtype, causal, lengths, seed=0, nan_at=None):
    q, k, v = _operands(b, h, hkv, t, s, d, dtype, seed)
    if nan_at is not None:
        q = q.at[nan_at].set(jnp.nan)
    lens = jnp.asarray(lengths, jnp.int32)
    got = jax.jit(lambda *a: ops.attention(*a[:3], causal=causal, lengths=a[3]))(q, k, v, lens)
    got = np.asarray(got, np.float64)
    want, sees = _f64(q, k, v, causal, lengths)
    # the output's rounding (2^-11 f16, 2^-8 bf16 of |out| <= max|v|) and P's cast to v's type
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == jnp.float16 else dict(rtol=5e-2, atol=5e-2)
    np.testing.assert_allclose(got, want, **tol)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    # jax.nn.dot_product_attention (XLA, (B, T, N, D), grouped heads natively) on the rows
    # that see a key (it averages all of V for the others)
    xla = jax.nn.dot_product_attention(
        *(x.transpose(0, 2, 1, 3) for x in (q, k, v)), is_causal=causal,
        key_value_seq_lengths=lens, implementation="xla").transpose(0, 2, 1, 3)
    xla = np.asarray(xla, np.float64)
    rows = np.broadcast_to(sees[..., None], got.shape)
    np.testing.assert_allclose(got[rows], xla[rows], **tol)
    return got, sees


def test_f16_causal_gqa_ragged_lengths(hopper):
    # H = 4 on Hkv = 2; T = 70, S = 90 divide no tile; 57 valid keys, so causal rows past
    # them see 57; TMA's zero fill past S, and the keys past 57, are masked to -inf
    _check(1, 4, 2, 70, 90, 64, jnp.float16, True, [57], seed=1)
    src = hopper[-1]
    assert "setmaxnreg_dec<40>" in src and "tma_load_4d(" in src


def test_bf16_d128_empty_rows_and_nan(hopper):
    # grouped heads (2 on 1); batch 1 sees no key (lengths 0: every row 0); a NaN in q row 5
    # of head 1 makes that row NaN and no other
    got, sees = _check(2, 2, 1, 40, 72, 128, jnp.bfloat16, False, [72, 0], seed=2,
                       nan_at=(0, 1, 5, 3))
    assert not sees[1].any() and np.all(got[1] == 0)
    assert np.isnan(got[0, 1, 5]).all() and np.isnan(got).sum() == 128


def test_vmap_makes_the_operands_5d_tma_loads(hopper):
    # jax.vmap adds a leading axis to q, k and v: the ring loads 5-D boxes
    q = _data((2, 1, 2, 40, 64), jnp.float16, 6)
    k, v = _data((2, 1, 1, 72, 64), jnp.float16, 7), _data((2, 1, 1, 72, 64), jnp.float16, 8)
    got = jax.jit(jax.vmap(lambda *a: ops.attention(*a, causal=True)))(q, k, v)
    assert "tma_load_5d(" in hopper[-1] and "setmaxnreg_dec<40>" in hopper[-1]
    for i in range(2):
        want, _ = _f64(q[i], k[i], v[i], True, [72])
        np.testing.assert_allclose(np.asarray(got[i], np.float64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.slow   # 3 query tiles x 4 heads x 2 batches of 384 emulated threads: 10-80 s
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_d128_larger_on_sm90a(hopper, dtype, causal):
    # 300 queries (3 tiles, the last ragged), 333 keys (3 ring tiles wrapping 2 stages)
    _check(2, 4, 2, 300, 333, 128, dtype, causal, [333, 150], seed=3)


@pytest.mark.slow   # 3 query tiles whose rings start past key 0: about half a minute
@pytest.mark.parametrize("window, causal", [((40, 0), True), ((100, 30), False)])
def test_sliding_window_on_sm90a(hopper, window, causal):
    # the ring starts at the window's first key tile (the producer computes it too)
    q, k, v = _operands(1, 2, 1, 300, 300, 64, jnp.float16, 5)
    lens = jnp.asarray([280], jnp.int32)
    got = jax.jit(lambda *a: ops.attention(*a[:3], causal=causal, window=window,
                                           lengths=a[3]))(q, k, v, lens)
    assert "setmaxnreg_dec<40>" in hopper[-1]
    want, _ = _f64(q, k, v, causal, [280], window)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-2, atol=2e-2)


# -- ptxas ------------------------------------------------------------------------------------

@pytest.mark.slow   # NVRTC of the D = 128 kernel: a few seconds
def test_d128_compiles_without_spills_on_hgmma_and_tma():
    from jaxtile.compiler import build
    from jaxtile.compiler.cuda import nvrtc, toolchain
    from jaxtile.compiler.cuda.compile import compile_to_library
    from jaxtile.compiler.cuda.sass import sass_counts

    if not nvrtc.available() and toolchain.nvcc_path() is None:
        pytest.skip("no CUDA compiler: neither NVRTC (pip install 'jaxtile[cuda]') nor nvcc")
    sm90a = parse_target("cuda:sm_90a")
    q = jax.ShapeDtypeStruct((1, 16, 4096, 128), jnp.float16)
    low = ops.attention_fwd_ws.lower(q, q, q, jax.ShapeDtypeStruct((1,), jnp.int32),
                                     causal=True, target="cuda:sm_90a")
    compiled = compile_to_library(build.lowered_ir(low.kernel, sm90a), sm90a)
    p = compiled.ptxas
    assert p.spill_stores == p.spill_loads == 0 and p.stack_frame == 0, p
    counts = sass_counts(compiled.cubin)
    if counts is not None:   # both products on HGMMA, K/V by TMA, nothing on mma.sync
        assert counts.get("HGMMA", 0) > 0 and counts.get("UTMALDG", 0) > 0, counts
        assert counts.get("HMMA", 0) == 0 and counts.get("LDGSTS", 0) == 0, counts


_TMA_4D_5D = r"""
#include <jaxtile/device.h>
using jaxtile::ptr;
JT_KERNEL JT_LAUNCH_BOUNDS(128) void probe(ptr<const uint8_t> map, ptr<const int> c,
                                           ptr<unsigned> out) {
  JT_SHARED(uint64_t, bar, 1);
  JT_SHARED_AT(jaxtile::u32x4, tile, 1024, 0);
  const auto* m = jaxtile::ptr_cast<const jaxtile::tensor_map>(map);
  if (jaxtile::thread_idx().x == 0) {
    jaxtile::mbarrier_init(bar, 1);
    jaxtile::fence_mbarrier_init();
    jaxtile::mbarrier_arrive_expect_tx(bar, 2 * c[5]);
    jaxtile::tma_load_4d(tile, m, bar, c[0], c[1], c[2], c[3]);
    jaxtile::tma_load_5d(tile + 512, m, bar, c[0], c[1], c[2], c[3], c[4]);
  }
  jaxtile::mbarrier_wait_parity(bar, 0);
  out[jaxtile::thread_idx().x] = tile[jaxtile::thread_idx().x].x;
}
"""


def test_the_4d_and_5d_tma_loads_assemble_for_sm90a():
    """device_ptx.h's ``cp.async.bulk.tensor.{4,5}d`` forms (coordinates as the PTX ISA's
    ``.dim``-element vector) through nvcc and ptxas."""
    from jaxtile.compiler.cuda import toolchain

    if toolchain.nvcc_path() is None:
        pytest.skip("nvcc not installed")
    cubin = toolchain.compile_cubin(_TMA_4D_5D, "sm_90a", file="tma_4d_5d.cu")
    assert cubin.kernels["probe"].spill_stores == 0


# -- a seeded mistake -------------------------------------------------------------------------

def test_dropping_the_barrier_before_the_loop_is_reported():
    """The split keeps the ring set-up's proxy-fence barrier where shared memory is written
    before the loop: without it Q's generic writes reach wgmma's async-proxy reads unfenced
    (what the pass did before it kept it)."""
    q, k, v = _operands(1, 1, 1, 64, 64, 64, jnp.float16, 4)
    lens = jnp.asarray([64], jnp.int32)
    code = ops.attention_fwd_ws.lower(q, k, v, lens, target="cuda:sm_90a")._gpu
    params, launch = emulated.emulator_launch(code)

    def run(source, name):
        arrays = [np.asarray(x).view(np.float16) for x in (q, k, v)] + [
            np.asarray(lens), np.zeros(q.shape, np.float16), np.zeros(q.shape[:3], np.float32)]
        report = EmulatedKernel.build(source, code.symbol, params, launch,
                                      file=f"{name}.cu").run(*arrays)
        return report, arrays

    report, arrays = run(code.source, "fa3_ok")
    assert report["findings"] == []
    want, _ = _f64(q, k, v, False, [64])
    np.testing.assert_allclose(arrays[4].astype(np.float64), want, rtol=2e-2, atol=2e-2)
    kept = ("fence_proxy_async();\n  barrier_sync(1, 256);  // every thread is past its "
            "waits")
    assert kept in code.source
    bad = code.source.replace(kept, "//")
    with pytest.raises(EmulatorError) as err:
        run(bad, "fa3_mutated")
    assert "missing fence.proxy.async" in str(err.value) and "smem0" in str(err.value)
