"""The bfloat16 dot capability (``CpuCaps.bf16_dot``) and the rewrite of the placeholder
call into ``vdpbf16ps`` in LLVM IR (``compiler/cpu/bf16_dot.py``)."""

import dataclasses

import pytest

from jaxtile.compiler.cpu import bf16_dot
from jaxtile.compiler.target import CpuCaps


@pytest.mark.parametrize("isa, bits, has", [
    (("avx2", "avx512f", "avx512_bf16"), 512, True),
    (("avx2", "avx512f"), 512, False),             # AVX-512 without BF16
    (("avx2", "avx512_bf16"), 256, False),          # no 512-bit registers to use it on
    (("asimd", "bf16"), 128, False),                # Arm's BF16 is another instruction
])
def test_bf16_dot_follows_the_isa(isa, bits, has):
    caps = CpuCaps("x86_64", isa, "model", bits)
    assert caps.bf16_dot is has
    # Derived, not stored: the content key already holds the ISA it comes from.
    assert "bf16_dot" not in dataclasses.asdict(caps)


AMD = "vendor_id=AuthenticAMD,cpu family=25,model=17"
INTEL = "vendor_id=GenuineIntel,cpu family=6,model=143"
BF16_ISA = ("avx2", "avx512f", "avx512_bf16")
AMX = ("amx_tile", "amx_bf16")


@pytest.mark.parametrize("model, isa, dots", [
    (AMD, BF16_ISA, True),              # Zen 4: a dot does twice an FMA's products
    (INTEL, BF16_ISA, False),           # one dot port against two FMA ports: FMAs
    (INTEL, BF16_ISA + AMX, True),      # AMX's GEMM is built on the dot path
    ("", BF16_ISA + AMX, True),         # a named CPU (cpu:sapphirerapids) has no model
])
def test_an_intel_cpu_dots_only_with_amx(model, isa, dots):
    caps = CpuCaps("x86_64", isa, model, 512)
    assert caps.bf16_dot is dots
    assert caps.amx_bf16 is ("amx_tile" in isa)


_IR = """\
define void @f(ptr %p) #0 {{
  %1 = tail call <16 x float> @{name}(<16 x float> %a, <16 x i32> %b, <16 x i32> %c), !dbg !7
  %2 = call <16 x float> @{name}(<16 x float> splat (float 0.000000e+00), \
<16 x i32> <i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7, i32 8, i32 9, i32 10, i32 11, \
i32 12, i32 13, i32 14, i32 15, i32 16>, <16 x i32> %1)
  ret void
}}

declare <16 x float> @{name}(<16 x float>, <16 x i32>, <16 x i32>) local_unnamed_addr
"""


def test_placeholder_calls_become_the_intrinsic():
    text = bf16_dot._patch(_IR.format(name=bf16_dot.PLACEHOLDER))
    assert bf16_dot.PLACEHOLDER not in text
    lines = text.splitlines()
    calls = [line for line in lines if f"@{bf16_dot.INTRINSIC}(" in line]
    assert len(calls) == 3                                   # two calls, one declaration
    assert calls[0].strip() == (
        f"%1 = tail call <16 x float> @{bf16_dot.INTRINSIC}(<16 x float> %a, "
        "<32 x bfloat> %jaxtile.dp1.a, <32 x bfloat> %jaxtile.dp1.b), !dbg !7")
    assert "bitcast <16 x i32> %b to <32 x bfloat>" in lines[1]
    # A constant operand with commas inside stays one operand.
    assert "  %jaxtile.dp2.a = bitcast <16 x i32> <i32 1, i32 2," in text
    assert "(<16 x float> splat (float 0.000000e+00), <32 x bfloat> %jaxtile.dp2.a" in text


def test_a_call_in_an_unexpected_form_is_an_error():
    odd = _IR.format(name=bf16_dot.PLACEHOLDER).replace("tail call <16 x float> @",
                                                        "tail call fast <16 x float> @")
    with pytest.raises(RuntimeError, match="not rewritten"):
        bf16_dot._patch(odd)


@pytest.mark.parametrize("group, want", [
    ('{ "target-cpu"="znver4" }', '{ "target-cpu"="znver4" "target-features"="+avx512bf16" }'),
    ('{ nounwind "target-cpu"="x" "target-features" }',
     '{ nounwind "target-cpu"="x" "target-features"="+avx512bf16" }'),
    ('{ "target-cpu"="x" "target-features"="+avx2,+fma" }',
     '{ "target-cpu"="x" "target-features"="+avx2,+fma,+avx512bf16" }'),
    ('{ "target-cpu"="x" "target-features"="+avx512bf16" }',
     '{ "target-cpu"="x" "target-features"="+avx512bf16" }'),
])
def test_functions_get_the_bf16_feature(group, want):
    assert bf16_dot._with_feature(f"attributes #0 = {group}") == f"attributes #0 = {want}"


def test_functions_using_tiles_get_the_amx_features():
    """LLVM aborts the process on a tile intrinsic in a function without AMX's features (a
    CPU name that does not imply them): the rewrite adds them where tiles are used, and
    only there."""
    tiles = ("define void @f(ptr %p) #0 {\n  call void @llvm.x86.ldtilecfg(ptr %p)\n"
             "  ret void\n}\n\nattributes #0 = { \"target-cpu\"=\"x86-64-v4\" }\n")
    assert bf16_dot._resolve_text(tiles).splitlines()[-1] == (
        'attributes #0 = { "target-cpu"="x86-64-v4" "target-features"="+amx-tile,+amx-bf16" }')
    plain = tiles.replace("@llvm.x86.ldtilecfg", "@g")
    assert bf16_dot._resolve_text(plain) == plain
    assert bf16_dot._with_feature('attributes #0 = { "target-cpu"="x" "target-features"='
                                  '"+avx2,+amx-tile" }', *bf16_dot.AMX_FEATURES) == (
        'attributes #0 = { "target-cpu"="x" "target-features"="+avx2,+amx-tile,+amx-bf16" }')
