"""Every kernel of ``jt.ops`` compiled for each GPU target and run in the emulator (races,
bounds, barriers and cp.async checked), against its reference semantics and an independent
jnp / numpy formula; the backward and forward-mode kernels through ``jax.grad`` / ``jax.jvp``
of the public ops. Ragged shapes throughout. The targets: CUDA (sm_80, in the SIMT emulator)
and AMD (``hip-emulator`` and ``hip-emulator:gfx90a``, HIP text run in the emulator's wave64
mode; the kernels built on ``jt.gemm`` use MFMA for 16-bit operands). Every kernel also
compiles for sm_80 (NVRTC, else nvcc). The default run keeps one CUDA emulator case and two
compiles (the suite's time budget; for HIP, ``test_hip_emulator_backend.py`` keeps the
default run's case); ``-m slow`` runs the rest."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import ops
from jaxtile.compiler import build
from jaxtile.compiler.cuda import nvrtc, toolchain
from jaxtile.compiler.cuda.compile import compile_to_library
from jaxtile.compiler.hip import lower as hip_lower
from jaxtile.compiler.hip import toolchain as hip_toolchain
from jaxtile.compiler.target import parse_target

SLOW = pytest.mark.slow
BF16 = np.dtype(ml_dtypes.bfloat16)
_BACKENDS = {"cuda": "cuda-emulator", "gfx942": "hip-emulator", "gfx90a": "hip-emulator:gfx90a"}


def _on(*names):
    """Runs the test on the backends ``names`` (ids ``cuda``, ``gfx942``, ``gfx90a``)."""
    return pytest.mark.parametrize("gpu", [_BACKENDS[n] for n in names], ids=names,
                                   indirect=True)


ALL, CUDA, HIP = _on("cuda", "gfx942", "gfx90a"), _on("cuda"), _on("gfx942", "gfx90a")


@pytest.fixture
def gpu(request):
    """Kernels compile for the backend's GPU target and run in the emulator for the test."""
    before = jt.backend()
    # jax.jit's caches do not know jaxtile's backend (see tests/emulator/conftest.py).
    jax.clear_caches()
    jt.set_backend(request.param)
    yield request.param
    jt.set_backend(before)
    jax.clear_caches()


def _data(shape, dtype=np.float32, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _close(got, want, tol=2e-5):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=tol, atol=tol)


def _against(kernel, args, want, tol=2e-5, **params):
    """The emulator's result against ``kernel``'s reference and ``want``."""
    got = jax.jit(lambda *a: kernel(*a, **params))(*args)
    _close(got, kernel.reference(*args, **params), tol)
    _close(got, want, tol)


# -- elementwise, rows ---------------------------------------------------------------------

@SLOW   # also in test_cuda_backend.py's default run
@ALL
def test_add(gpu):
    x, y = _data((1000,)), _data((1000,), seed=1)
    _against(ops.add, (x, y), x + y)


def _softmax_loss(f, x, w):
    return jnp.sum(f(x) * w)


@SLOW
@ALL
@pytest.mark.parametrize("shape", [(10, 300), (33, 64)])
def test_softmax_and_its_backward(gpu, shape):
    x, w = _data(shape), _data(shape, seed=1)
    y = jax.nn.softmax(x, axis=-1)
    _against(ops.softmax, (x,), y)
    g = jax.jit(jax.grad(lambda x: _softmax_loss(ops.softmax, x, w)))(x)
    _close(g, jax.grad(lambda x: _softmax_loss(lambda t: jax.nn.softmax(t, -1), x, w))(x))
    _against(ops.softmax_bwd, (y, w), y * (w - jnp.sum(w * y, -1, keepdims=True)))


def _layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _rms_norm(x, w, eps=1e-6):
    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


@SLOW
@ALL
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_norms_forward_and_backward(gpu, norm):
    """The forward kernel, then ``jax.grad`` (the ``*_bwd`` kernel) for every input."""
    x, w, b, g = _data((7, 200)), _data((200,), seed=1), _data((200,), seed=2), \
        _data((7, 200), seed=3)
    if norm == "layer":
        _against(ops.layer_norm, (x, w, b), _layer_norm(x, w, b), 1e-4)
        fn, ref, args = ops.layer_norm, _layer_norm, (x, w, b)
    else:
        _against(ops.rms_norm, (x, w), _rms_norm(x, w), 1e-4)
        fn, ref, args = ops.rms_norm, _rms_norm, (x, w)
    argnums = tuple(range(len(args)))
    got = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * g), argnums))(*args)
    _close(got, jax.grad(lambda *a: jnp.sum(ref(*a) * g), argnums)(*args), 1e-3)


# -- matmul --------------------------------------------------------------------------------

@pytest.mark.parametrize("ta, tb", [(False, False), pytest.param(False, True, marks=SLOW),
                                    pytest.param(True, False, marks=SLOW),
                                    pytest.param(True, True, marks=SLOW)],
                         ids=["nn", "nt", "tn", "tt"])
@CUDA
def test_matmul_transposes(gpu, ta, tb):
    m, n, k = 70, 40, 72                      # ragged against 64 x 64 x 32 tiles
    a = _data((k, m) if ta else (m, k), np.float16)
    b = _data((n, k) if tb else (k, n), np.float16, seed=1)
    want = np.asarray(a.T if ta else a, np.float64) @ np.asarray(b.T if tb else b, np.float64)
    _against(ops.matmul, (a, b), want, 2e-2, transpose_a=ta, transpose_b=tb)


@SLOW
@CUDA
def test_matmul_backward_and_relu(gpu):
    a, b = _data((70, 72), BF16), _data((72, 40), BF16, seed=1)
    af, bf = (np.asarray(t, np.float64) for t in (a, b))
    _against(ops.matmul_relu, (a, b), np.maximum(af @ bf, 0), 3e-2)
    g = _data((70, 40), BF16, seed=2)
    da, db = jax.jit(jax.grad(lambda a, b: jnp.sum((ops.matmul(a, b) * g)
                                                  .astype(jnp.float32)), (0, 1)))(a, b)
    gf = np.asarray(g, np.float64)
    _close((da, db), (gf @ bf.T, af.T @ gf), 1e-1)


# -- attention -----------------------------------------------------------------------------

@SLOW
@ALL
@pytest.mark.parametrize("dtype, d", [(np.float32, 64), (np.float16, 128)],
                         ids=["f32-d64", "f16-d128"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_backward_and_jvp(gpu, dtype, d, causal):
    """dq, then dK/dV (``attention_dq``, ``attention_dkdv``), and the JVP kernel, GQA (2
    query heads on 1 K/V head), 40 queries and keys (no tile divides them). The tiles are
    each kernel's rule's for the target: on AMD they fit 64 KiB of LDS (f16 at D = 128 needs
    smaller ones than CUDA's). Float32 gemms run on tf32 tensor cores on CUDA and xf32
    MFMA on gfx942 (10-bit mantissas), hence the tolerance; gfx90a has no float32 MFMA."""
    tol = 4e-3 if dtype == np.float32 else 3e-2
    q, k, v = (_data(s, dtype, seed=i) for i, s in enumerate([(1, 2, 40, d), (1, 1, 40, d),
                                                               (1, 1, 40, d)]))
    g = _data((1, 2, 40, d), dtype, seed=5)
    lengths = jnp.full((1,), 40, jnp.int32)

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * g.astype(jnp.float32))

    def mine(q, k, v):
        return ops.attention(q, k, v, causal=causal)

    def theirs(q, k, v):
        return _attention(q, k, v, lengths, causal)

    got = jax.jit(jax.grad(loss(mine), (0, 1, 2)))(q, k, v)
    _close(got, jax.grad(loss(theirs), (0, 1, 2))(*(x.astype(jnp.float32) for x in (q, k, v))),
           tol)
    t = tuple(_data(x.shape, dtype, seed=10 + i) for i, x in enumerate((q, k, v)))
    got = jax.jit(lambda *a: jax.jvp(mine, a, t))(q, k, v)
    _close(got, jax.jvp(theirs, tuple(x.astype(jnp.float32) for x in (q, k, v)),
                        tuple(x.astype(jnp.float32) for x in t)), tol)
    # Each kernel on its own against its reference semantics.
    out, lse = ops.attention_fwd.reference(q, k, v, lengths, causal=causal)
    g_lse = jnp.zeros_like(lse)
    args = (q, k, v, lengths, out, lse, g, g_lse)
    got = jax.jit(lambda *a: ops.attention_dq(*a, causal=causal))(*args)
    _close(got, ops.attention_dq.reference(*args, causal=causal), tol)
    delta = got[1]
    args = (q, k, v, lengths, lse, delta, g)
    got = jax.jit(lambda *a: ops.attention_dkdv(*a, causal=causal))(*args)
    _close(got, ops.attention_dkdv.reference(*args, causal=causal), tol)
    args = (q, k, v, lengths, out, lse, *t)
    got = jax.jit(lambda *a: ops.attention_jvp(*a, causal=causal))(*args)
    _close(got, ops.attention_jvp.reference(*args, causal=causal), tol)


def _decode_case(dtype):
    rng = np.random.default_rng(7)
    page, pages, per_seq, d = 16, 12, 4, 64
    table = jnp.asarray(rng.permutation(pages)[:2 * per_seq].reshape(2, per_seq), jnp.int32)
    q = jnp.asarray(rng.standard_normal((2, 4, d)), dtype)
    kp, vp = (jnp.asarray(rng.standard_normal((2, pages, page, d)), dtype) for _ in range(2))
    return q, kp, vp, table, jnp.asarray([37, 64], jnp.int32)


def _decode_formula(q, kp, vp, table, lengths):
    hk, _, _, d = kp.shape
    keys, vals = (jnp.moveaxis(x[:, table], 0, 1).reshape(q.shape[0], hk, -1, d)
                  for x in (kp, vp))
    group = q.shape[1] // hk
    keys, vals = (jnp.repeat(x, group, axis=1).astype(jnp.float32) for x in (keys, vals))
    s = jnp.einsum("bhd,bhsd->bhs", q.astype(jnp.float32), keys) / np.sqrt(d)
    s = jnp.where(jnp.arange(s.shape[-1]) < lengths[:, None, None], s, -jnp.inf)
    return jnp.einsum("bhs,bhsd->bhd", jax.nn.softmax(s, axis=-1), vals)


@SLOW
@CUDA
def test_attention_decode_and_combine(gpu):
    args = _decode_case(np.float32)
    got = jax.jit(lambda *a: ops.attention_decode(*a, splits=2))(*args)
    _close(got, _decode_formula(*args), 1e-4)
    o_part, lse_part = ops.decode_partial.reference(*args, splits=2)
    _against(ops.decode_combine, (o_part, lse_part), _decode_formula(*args), 1e-4)
    parts = jax.jit(lambda *a: ops.decode_partial(*a, splits=2))(*args)
    _close(parts, (o_part, lse_part), 1e-4)


@SLOW
@HIP
def test_decode_combine(gpu):
    """The split-K combine of decode attention: softmax-weighted partial outputs."""
    o_part, lse_part = _data((2, 3, 4, 64), seed=1), _data((2, 3, 4), seed=2)
    weights = jax.nn.softmax(lse_part, axis=1)[..., None]
    _against(ops.decode_combine, (o_part, lse_part), jnp.sum(weights * o_part, axis=1), 1e-5)


def _tol(dtype):
    return {np.float32: 1e-4, np.float16: 2e-2, jnp.bfloat16: 8e-2}[dtype]


@SLOW
@HIP
@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16, np.float32],
                         ids=["f16", "bf16", "f32"])
def test_matmuls_on_hip(gpu, dtype):
    """MFMA for 16-bit operands (f32: xf32 MFMA on gfx942, 10-bit mantissas, hence its
    tolerance; the scalar gemm on gfx90a), 70 x 72 tiles that divide nothing."""
    h = _data((70, 72), dtype)
    want = jnp.dot(h.astype(jnp.float32), h.T.astype(jnp.float32), precision="highest")
    tol = 2e-2 if dtype == np.float32 and gpu == "hip-emulator" else _tol(dtype)
    _against(ops.matmul, (h, h.T), want, tol)
    _against(ops.matmul_relu, (h, h.T), jnp.maximum(want, 0), tol)


def _attention(q, k, v, lengths, causal):
    """softmax(q k^T / sqrt(D) + mask) v in float32, K/V heads repeated for GQA."""
    group = q.shape[1] // k.shape[1]
    k, v = (jnp.repeat(x.astype(jnp.float32), group, axis=1) for x in (k, v))
    s = jnp.einsum("bhtd,bhsd->bhts", q.astype(jnp.float32), k,
                   precision="highest") / np.sqrt(q.shape[-1])
    rows, cols = np.arange(s.shape[2])[:, None], np.arange(s.shape[3])[None]
    keep = (cols < lengths[:, None, None, None]) & ((cols <= rows) if causal else True)
    p = jax.nn.softmax(jnp.where(keep, s, -jnp.inf), axis=-1)
    return jnp.einsum("bhts,bhsd->bhtd", p, v, precision="highest")


@SLOW
@HIP
@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_forward_on_hip(gpu, dtype, d, causal):
    """Flash attention on MFMA with the AMD tiles: GQA (4 query heads on 2 K/V heads),
    ragged (70 queries and keys, 53 valid keys in the second sequence)."""
    q = _data((2, 4, 70, d), dtype)
    k, v = _data((2, 2, 70, d), dtype, 1), _data((2, 2, 70, d), dtype, 2)
    lengths = jnp.asarray([70, 53], jnp.int32)
    got = jax.jit(lambda *a: ops.attention(*a, causal=causal, lengths=lengths))(q, k, v)
    want, _ = ops.attention_fwd.reference(q, k, v, lengths, causal=causal)
    _close(got, want, _tol(dtype))
    _close(got, _attention(q, k, v, lengths, causal), _tol(dtype))


@SLOW
@HIP
def test_attention_decode_on_hip(gpu):
    """Paged decode attention, split-K over 2 parts, on the AMD tiles."""
    args = _decode_case(np.float32)
    got = jax.jit(lambda *a: ops.attention_decode(*a, splits=2))(*args)
    _close(got, _decode_formula(*args), 1e-4)


# -- every kernel compiles for sm_80 -------------------------------------------------------

def _compile_cases():
    x, w = _data((64, 512)), _data((512,), seed=1)
    stats = jnp.zeros((64,), jnp.float32)
    h = _data((64, 4096), np.float16)
    q = _data((2, 4, 256, 128), BF16)
    kv = _data((2, 2, 256, 128), BF16)
    lengths = jnp.full((2,), 256, jnp.int32)
    lse = jnp.zeros((2, 4, 256), jnp.float32)
    dq_args = (q, kv, kv, lengths, q, lse, q, lse)
    dkdv_args = (q, kv, kv, lengths, lse, lse, q)
    jvp_args = (q, kv, kv, lengths, q, lse, q, kv, kv)
    decode = _decode_case(BF16)
    o_part = jnp.zeros((2, 4, 2, 64), jnp.float32)
    lse_part = jnp.zeros((2, 4, 2), jnp.float32)
    return [
        ("add", ops.add, (x[0], x[1]), {}),
        ("softmax", ops.softmax, (x,), {}),
        ("softmax_bwd", ops.softmax_bwd, (x, x), {}),
        ("layer_norm_fwd", ops.layer_norm_fwd, (x, w, w), {}),
        ("layer_norm_bwd", ops.layer_norm_bwd, (x, w, stats, stats, x), {}),
        ("rms_norm_fwd", ops.rms_norm_fwd, (x, w), {}),
        ("rms_norm_bwd", ops.rms_norm_bwd, (x, w, stats, x), {}),
        ("matmul_nt", ops.matmul, (h, h), {"transpose_b": True}),
        ("matmul_tn", ops.matmul, (h.T, h.T), {"transpose_a": True}),
        ("matmul_relu", ops.matmul_relu, (h, h.T), {}),
        ("attention_fwd", ops.attention_fwd, (q, kv, kv, lengths), {"causal": True}),
        ("attention_dq", ops.attention_dq, dq_args, {"causal": True}),
        ("attention_dkdv", ops.attention_dkdv, dkdv_args, {"causal": True}),
        ("attention_jvp", ops.attention_jvp, jvp_args, {}),
        ("decode_partial", ops.decode_partial, decode, {"splits": 2}),
        ("decode_combine", ops.decode_combine, (o_part, lse_part), {}),
    ]


_CHEAP = {"softmax", "decode_combine"}


@pytest.mark.skipif(not nvrtc.available() and toolchain.nvcc_path() is None,
                    reason="neither NVRTC (jaxtile[cuda]) nor nvcc is installed")
@pytest.mark.parametrize("case", [pytest.param(i, id=c[0], marks=() if c[0] in _CHEAP
                                               else SLOW)
                                  for i, c in enumerate(_compile_cases())])
def test_every_kernel_compiles_for_sm80(case):
    name, kernel, args, params = _compile_cases()[case]
    target = parse_target("cuda:sm_80")
    low = kernel.lower(*args, target="cuda:sm_80", **params)
    compiled = compile_to_library(build.lowered_ir(low.kernel, target), target)
    assert compiled.ptxas.registers > 0, name
    assert compiled.launch.dynamic_smem <= target.caps.max_smem_bytes


@pytest.mark.skipif(hip_toolchain.clang_path() is None,
                    reason=f"no clang for AMD GPUs: {hip_toolchain.INSTALL_HINT}")
@pytest.mark.parametrize("gfx", ["gfx90a", "gfx942"])
@pytest.mark.parametrize("case", [pytest.param(i, id=c[0], marks=SLOW)
                                  for i, c in enumerate(_compile_cases())])
def test_every_kernel_compiles_for_hip(case, gfx):
    """Every jt.ops kernel, with the tiles its rule chooses for the target, compiled by clang
    to a code object for gfx90a and gfx942, within the target's LDS, with no register spills
    (attention_dkdv, attention_jvp and decode_partial keep a 32-byte array on the stack,
    scratch that is not a spill)."""
    name, kernel, args, params = _compile_cases()[case]
    target = parse_target(f"hip:{gfx}")
    low = kernel.lower(*args, target=target.name, **params)
    compiled = hip_lower.compile_to_library(build.lowered_ir(low.kernel, target), target)
    r = compiled.resources
    assert compiled.arch == gfx and r.vgprs > 0, name
    assert compiled.launch.dynamic_smem + r.lds_bytes <= target.caps.lds_bytes, name
    assert r.sgpr_spills == r.vgpr_spills == 0, (name, r)
