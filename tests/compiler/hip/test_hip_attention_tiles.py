"""The attention backward and JVP kernels' tiles on AMD: chosen by each kernel's rule to fit
64 KiB of LDS (their defaults need up to 96 KiB at D = 128), checked against the shared memory
of the kernels as lowered; NVIDIA's and the CPU's choices unchanged."""

import jax
import jax.numpy as jnp
import pytest

from jaxtile import ops
from jaxtile.compiler import build
from jaxtile.compiler.gpu.codegen.lower import generate
from jaxtile.compiler.target import parse_target
from jaxtile.ops.attention import BACKWARD_TILES, default_tiles

SLOW = pytest.mark.slow
KERNELS = sorted(BACKWARD_TILES)


def _args(name, dtype, d):
    q = jax.ShapeDtypeStruct((1, 2, 256, d), dtype)
    kv = jax.ShapeDtypeStruct((1, 1, 256, d), dtype)
    lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
    lse = jax.ShapeDtypeStruct((1, 2, 256), jnp.float32)
    return {"attention_dq": (q, kv, kv, lengths, q, lse, q, lse),
            "attention_dkdv": (q, kv, kv, lengths, lse, lse, q),
            "attention_jvp": (q, kv, kv, lengths, q, lse, q, kv, kv)}[name]


def _shared_bytes(name, dtype, d, gfx):
    target = parse_target(f"hip:{gfx}")
    low = getattr(ops, name).lower(*_args(name, dtype, d), target=target.name)
    return generate(build.lowered_ir(low.kernel, target), target).shared_bytes


@pytest.mark.parametrize("name", KERNELS)
def test_rule_fits_amd_and_keeps_nvidia_and_cpu(name):
    kernel = getattr(ops, name)
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
        for d in (64, 128):
            args = _args(name, dtype, d)
            default = dict(zip(("bm", "bn"), default_tiles(dtype, d)))
            for target in ("cuda:sm_80", "cuda:sm_90", "cpu"):
                assert kernel.tile_rule(args, {}, parse_target(target)) == default, target
            for gfx in ("gfx90a", "gfx942"):
                chosen = kernel.tile_rule(args, {}, parse_target(f"hip:{gfx}"))
                assert chosen["bm"] <= default["bm"] and chosen["bn"] <= default["bn"]
            # A tile the call passes is kept; the rule chooses only the other.
            assert set(kernel.tile_rule(args, {"bm": 16}, parse_target("hip:gfx942"))) == {"bn"}
    # At D = 128 f16 the dK/dV and JVP defaults do not fit 64 KiB (dq's just does), so AMD
    # gets smaller tiles there.
    args = _args(name, jnp.float16, 128)
    chosen = kernel.tile_rule(args, {}, parse_target("hip:gfx942"))
    assert (chosen != {"bm": 64, "bn": 64}) == (name != "attention_dq")


@SLOW
def test_d128_jvp_fits_the_lds():
    # The JVP kernel keeps six [64, 128] f16 tiles at its defaults (96 KiB): its rule's tiles
    # lower within gfx942's 64 KiB.
    assert _shared_bytes("attention_jvp", jnp.float16, 128, "gfx942") <= 65536


@SLOW
@pytest.mark.parametrize("gfx", ["gfx90a", "gfx942"])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32],
                         ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("name", KERNELS)
def test_backward_kernels_fit_the_lds(name, d, dtype, gfx):
    assert _shared_bytes(name, dtype, d, gfx) <= parse_target(f"hip:{gfx}").caps.lds_bytes
