"""The CUDA lowering without running it: layouts in the IR, conversions, masks, barriers, the
generated source (device-header rule, nvcc for sm_80 and sm_90a where installed)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import ops
from jaxtile.compiler import parser, printer, target
from jaxtile.compiler.cuda import toolchain
from jaxtile.compiler.gpu.device_rule import device_rule_violations

F32 = jnp.float32


def _spec(shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_softmax_ir_shows_layouts_and_round_trips():
    low = ops.softmax.lower(_spec((10, 300)), target="cuda:sm_80")
    text = low.lowered_ir
    assert "scratch frag0: fragment float32[4, 384]#blocked(vec 4, threads 4x32)" in text
    # the row maxima: the tile's layout with the columns dropped (their threads replicas)
    assert "float32[4]#slice(blocked(vec 4, threads 4x32), [4, 384], dims (1,)) = reduce" \
        in text
    assert printer.format_kernel(parser.parse_kernel(text)) == text
    assert low.conversions == ()


def test_source_is_readable_and_keeps_the_device_rule():
    src = ops.layer_norm.lower(_spec((10, 300)), _spec((300,)), _spec((300,)),
                               target="cuda:sm_80").source
    assert device_rule_violations(src) == []
    assert "#include <jaxtile/device.h>" in src
    # one comment per tile op naming the user's source line
    assert "// layer_norm.py:" in src
    assert "shfl_xor(kFullMask" in src  # the row sums fold across lanes


@jt.kernel(threads=64)
def _row_sums_to_local(x):
    """A reduction whose result every thread needs whole (stored into a local tile): the
    strict replicated demand disagrees with the reduction's own layout."""
    n, m = x.shape
    out = jt.empty((n,), F32)
    jt.grid(1)
    t = jt.fragment((n, m), F32)
    loc = jt.local((n,), F32)
    jt.copy(x.at[0, 0], t)
    loc[...] = jnp.sum(t[...], axis=1)
    out[...] = loc[...] * 2
    return out


def test_incompatible_demands_insert_a_conversion():
    low = _row_sums_to_local.lower(_spec((8, 32)), target="cuda:sm_80")
    assert len(low.conversions) == 1
    assert "#replicated" in low.conversions[0]
    assert "relayout(" in low.lowered_ir


_static_softmax = jt.kernel(threads=128)(ops.softmax.fn)
"""The library's softmax body with every size static (the library's is dynamic in rows)."""


def test_masks_are_kept_only_where_not_provable():
    even = _static_softmax.lower(_spec((16, 256)), target="cuda:sm_80")
    assert even.masks == ()
    ragged = _static_softmax.lower(_spec((10, 300)), target="cuda:sm_80")
    # rows (10 is no multiple of 4) and columns (300 < the 384-column tile)
    assert len(ragged.masks) == 2 and all("dims [0, 1]" in m for m in ragged.masks)
    assert "unsigned(" not in even.source and "unsigned(" in ragged.source
    # Rows the kernel is compiled for every count of prove nothing: their masks stay, the
    # columns' (static, dividing the tile) go.
    dynamic = ops.softmax.lower(_spec((16, 256)), target="cuda:sm_80")
    assert len(dynamic.masks) == 2 and all("dims [0]" in m for m in dynamic.masks)


@jt.kernel(threads=64)
def _transpose_through_shared(x, *, loop=1):
    """Fill a shared tile with one thread mapping, read it back with another (transposed):
    a read-after-write between different threads; in a loop also a write-after-read."""
    n, m = x.shape
    out = jt.empty((m, n), F32)
    jt.grid(1)
    s = jt.shared((n, m), F32)
    f = jt.fragment((m, n), F32)

    @jt.loop(loop)
    def _(i):
        jt.copy(x.at[0, 0], s)
        f[...] = s[...].T + i.astype(F32)

    jt.copy(f, out.at[0, 0])
    return out


def test_barriers_where_threads_differ_and_across_iterations():
    once = _transpose_through_shared.lower(_spec((16, 32)), target="cuda:sm_80", loop=1)
    assert once.lowered_ir.count("barrier()") == 1
    looped = _transpose_through_shared.lower(_spec((16, 32)), target="cuda:sm_80", loop=3)
    text = looped.lowered_ir
    assert text.count("barrier()") == 2
    assert "reason='write after read of smem0'" in text
    assert "reason='read after write of smem0'" in text


@jt.kernel(threads=32)
def _same_thread_shared(x):
    """Each thread reads back exactly what it wrote to shared memory: no barrier."""
    (n,) = x.shape
    out = jt.empty((n,), F32)
    jt.grid(1)
    s = jt.shared((n,), F32)
    s[...] = x[...] * 2
    out[...] = s[...] + 1
    return out


def test_no_barrier_when_the_same_thread_reads_what_it_wrote():
    low = _same_thread_shared.lower(_spec((128,)), target="cuda:sm_80")
    assert "barrier()" not in low.lowered_ir


@pytest.mark.parametrize("name", [n for n in target.KNOWN
                                  if n.startswith("cuda:") and n != "cuda:sm_75"])
def test_every_cuda_target_lowers(name):
    low = ops.softmax.lower(_spec((10, 300)), target=name)
    assert "#include <jaxtile/device.h>" in low.source and low.lowered_ir


def test_turing_lowering_is_a_clear_error():
    with pytest.raises(jt.KernelError, match="cuda:sm_75 lacks .*cp.async"):
        _ = ops.softmax.lower(_spec((10, 300)), target="cuda:sm_75").source


@jt.kernel(threads=128)
def _stage_through_shared(x):
    n, m = x.shape
    out = jt.empty((n, m), F32)
    jt.grid(1)
    s = jt.shared((n, m), F32)
    jt.copy(x.at[0, 0], s)
    jt.copy(s, out.at[0, 0])
    return out


@pytest.mark.parametrize("name,fits", [("cuda:sm_80", True), ("cuda:sm_87", True),
                                       ("cuda:sm_86", False), ("cuda:sm_89", False),
                                       ("cuda:sm_120", False), ("cuda:sm_121", False),
                                       ("cuda:sm_90", True), ("cuda:sm_100", True)])
def test_shared_memory_per_block_is_each_architectures(name, fits):
    # 112 KiB of shared memory: more than the 99 KiB of sm_86/89/120/121, within the 163 KiB
    # of sm_80/87 and the 227 KiB of sm_90/100.
    low = _stage_through_shared.lower(_spec((224, 128)), target=name)
    if fits:
        assert "shared memory 114688 / " in low.shared_memory
    else:
        with pytest.raises(jt.KernelError, match="114688 bytes of shared memory, more than "
                                                 "the 101376"):
            _ = low.shared_memory


@pytest.mark.skipif(toolchain.nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
def test_nvcc_compiles_the_generated_source(arch):
    low = ops.softmax.lower(_spec((10, 300)), target=f"cuda:{arch}")
    report = low.ptxas
    assert report is not None and report.registers > 0
    assert report.spill_stores == 0
    assert np.isfinite(report.registers)


@pytest.mark.skipif(toolchain.nvcc_path() is None, reason="nvcc is not installed")
def test_fp16_gemm_from_the_language_meets_the_static_targets():
    """matmul_relu 4096^3, 128x128x32 tiles, 128 threads, 3 stages (the issue's figures):
    a cp.async pipeline in 48 KiB of shared memory, no spills, at most 224 registers."""
    a = _spec((4096, 4096), jnp.float16)
    low = ops.matmul_relu.lower(a, a, target="cuda:sm_80")
    assert "cp_async<16>" in low.source and "cp_async_wait<1>" in low.source
    assert "gemm_ss<jaxtile::kGemmMma16, 128, 128, 32, 2, 2" in low.source
    assert low.masks == ()
    report = low.ptxas
    assert report.spill_stores == 0 and report.spill_loads == 0
    assert report.registers <= 224
    assert report.shared_bytes == 0          # every shared array is a view of the dynamic one
    assert low.shared_memory.startswith("shared memory 49152 / ")   # 3 stages of A and B
    from jaxtile.compiler.cuda import sass

    cubin = toolchain.compile_cubin(low.source, "sm_80")
    counts = sass.sass_counts(cubin.data)
    if counts is not None:  # cuobjdump installed
        assert counts.get("HMMA", 0) and counts.get("LDSM", 0) and counts.get("LDGSTS", 0)


@jt.kernel(threads=128)
def _attention_block(q, k, v, *, bm=64, bn=64):
    """One block of attention without the online rescaling: S = Q K^T in registers, a row
    softmax, P = S in bf16 as gemm_rs's A, O = P V."""
    n, d = q.shape
    out = jt.empty((n, d), q.dtype)
    i = jt.grid(jt.cdiv(n, bm))
    q_s, k_s, v_s = (jt.shared(shape, q.dtype) for shape in ((bm, d), (bn, d), (bn, d)))
    s = jt.fragment((bm, bn), jnp.float32)
    p = jt.fragment((bm, bn), q.dtype)
    o = jt.fragment((bm, d), jnp.float32)
    jt.copy(q.at[i * bm, 0], q_s)
    jt.copy(k.at[0, 0], k_s)
    jt.copy(v.at[0, 0], v_s)
    s[...] = jnp.zeros((bm, bn), jnp.float32)
    o[...] = jnp.zeros((bm, d), jnp.float32)
    jt.gemm(q_s, k_s, s, transpose_b=True)
    e = jnp.exp(s[...] - jnp.max(s[...], axis=1, keepdims=True))
    p[...] = (e / jnp.sum(e, axis=1, keepdims=True)).astype(q.dtype)
    jt.gemm(p, v_s, o)
    jt.copy(o, out.at[i * bm, 0])
    return out


def test_attention_layouts_need_no_conversion():
    """With a register-A gemm in the kernel, every gemm gets whole rows per warp: S's
    accumulator, the row softmax and P share one layout."""
    x = _spec((256, 128), jnp.bfloat16)
    low = _attention_block.lower(x, x, x, target="cuda:sm_80")
    assert low.conversions == ()
    assert "#mma(m16n8k16, warps 4x1)" in low.lowered_ir
    assert "gemm_rs<" in low.source
    if toolchain.nvcc_path() is not None:
        assert low.ptxas.spill_stores == 0


@jt.kernel(threads=64)
def _scaled_rows(x, *, layout=None):
    n, m = x.shape
    out = jt.empty((n, m), F32)
    jt.grid(1)
    t = jt.fragment((n, m), F32)
    if layout is not None:
        jt.annotate_layout(t, layout)
    jt.copy(x.at[0, 0], t)
    t[...] = t[...] / jnp.sum(t[...], axis=1, keepdims=True)
    jt.copy(t, out.at[0, 0])
    return out


def test_annotated_layout_wins_and_changes_the_key():
    x = _spec((8, 64))
    plain = _scaled_rows.lower(x, target="cuda:sm_80")
    pinned = _scaled_rows.lower(x, target="cuda:sm_80", layout="blocked(vec 1)")
    assert "frag0: fragment float32[8, 64]#blocked(vec 4" in plain.lowered_ir
    assert "frag0: fragment float32[8, 64]#blocked(vec 1, threads 1x64)" in pinned.lowered_ir
    assert plain.key != pinned.key
    assert "#blocked(vec 1" in pinned.tile_ir   # in the IR the key hashes
    with pytest.raises(jt.KernelError, match="annotate_layout.*not a layout"):
        _scaled_rows.lower(x, target="cuda:sm_80", layout="stripes(3)")
    ref = _scaled_rows.reference(jnp.ones((8, 64)), layout="replicated")
    np.testing.assert_allclose(np.asarray(ref), 1 / 64)
