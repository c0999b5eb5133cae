"""``vdpbf16ps`` (AVX512-BF16) in TIR kernels built by TVM 0.27's LLVM backend.

The instruction takes 32 bfloat16 values in each of two 512-bit registers and adds the
products of each pair ``(2i, 2i+1)`` to float32 lane ``i`` of an accumulator; LLVM names it
``llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)``. TVM
cannot call it directly: its bfloat16 legalisation turns every bfloat16 value into
float32 or uint16 before code generation, and its LLVM code generation crashes on a
bfloat16 vector type (both seen with apache-tvm 0.27.0.post1, LLVM 22). So kernels call a
placeholder, :data:`PLACEHOLDER`, on the same bits held as ``int32x16`` (each 32-bit lane
one pair, the lower half the even element), and :func:`resolve` rewrites the module's
optimised LLVM IR: each call of the placeholder becomes two bitcasts to ``<32 x bfloat>``
and the intrinsic, in place, before machine code is generated, and AVX512-BF16 is added
to the functions' target features (LLVM's CPU name need not imply it). LLVM's optimiser
has then seen an opaque call there, which only keeps it from moving memory accesses
across it; local arrays that do not escape (the accumulator tile) are still kept in
registers.

Semantics (Intel SDM, ``VDPBF16PS``; checked bitwise on Zen 4 by
``tests/jaxtile/test_cpu_gemm_bf16.py``): each lane adds the odd product first, then the
even one, ``acc = (acc + a[2i+1] * b[2i+1]) + a[2i] * b[2i]``, rounding each sum to
nearest even once; the products are not rounded (not even into float32's range:
``-3e38 + 2.98e38 * 2`` is ``2.95e38``); input and output subnormals are zero (DAZ, FTZ)
whatever MXCSR says, as XLA:CPU's float32 arithmetic has them.
"""

from __future__ import annotations

import re

import tvm
from tvm import tirx
from tvm.ir import Expr

from . import tir_emit

PLACEHOLDER = "jaxtile_dpbf16ps_512"
INTRINSIC = "llvm.x86.avx512bf16.dpbf16ps.512"
LANES = 16
"""float32 lanes of the accumulator (32 bfloat16 values per operand)."""

FEATURE = "+avx512bf16"
AMX_FEATURES = ("+amx-tile", "+amx-bf16")
"""What the AMX GEMM's intrinsics (:mod:`.gemm_amx`) need of the functions calling them."""
_FEATURES = re.compile(r'"target-features"(?:="([^"]*)")?')
_CALL = re.compile(r"^(\s*%[\w.]+ = (?:tail |notail )?call <16 x float> )@"
                   + PLACEHOLDER + r"\((.*)\)(.*)$")


def dot_pairs(acc: Expr, a: Expr, b: Expr) -> Expr:
    """``acc`` (``float32x16``) plus, in each lane, the dot product of the bfloat16 pairs
    that the lanes of ``a`` and ``b`` (``int32x16``) hold (lower half: the even element)."""
    return tirx.call_pure_extern(f"float32x{LANES}", PLACEHOLDER, acc, a, b)


def resolve(module: tvm.runtime.Module) -> tvm.runtime.Module:
    """``module`` (from :func:`.tir_emit.build`) ready for :func:`.tir_emit.export`: every
    call of :data:`PLACEHOLDER` made a ``vdpbf16ps``, AMX's features given to functions that
    use tiles (:data:`AMX_FEATURES`), and no debug info (the module is
    parsed again from its LLVM IR, which is printed for that anyway: see
    :func:`.tir_emit.reload_ir`). Raises ``RuntimeError`` if a call is left in a form not
    rewritten (so no kernel links against a function that does not exist)."""
    return tir_emit.reload_ir(module, _resolve_text)


def _resolve_text(text: str) -> str:
    text = _patch(text) if "@" + PLACEHOLDER in text else text
    if "@llvm.x86.ldtilecfg(" in text:
        # As for vdpbf16ps, LLVM's name for the CPU need not imply AMX; without the
        # features LLVM aborts the process ("Cannot select") instead of raising.
        text = "\n".join(_with_feature(line, *AMX_FEATURES)
                         if line.startswith("attributes #") and '"target-cpu"' in line
                         else line for line in text.splitlines()) + "\n"
    return text


def _patch(text: str) -> str:
    out: list[str] = []
    calls = 0
    for line in text.splitlines():
        m = _CALL.match(line)
        if m:
            acc, a, b = _split_operands(m.group(2))
            calls += 1
            names = (f"%jaxtile.dp{calls}.a", f"%jaxtile.dp{calls}.b")
            for name, operand in zip(names, (a, b)):
                out.append(f"  {name} = bitcast {operand} to <32 x bfloat>")
            out.append(f"{m.group(1)}@{INTRINSIC}({acc}, <32 x bfloat> {names[0]}, "
                       f"<32 x bfloat> {names[1]}){m.group(3)}")
        elif line.startswith(f"declare <16 x float> @{PLACEHOLDER}("):
            out.append(f"declare <16 x float> @{INTRINSIC}(<16 x float>, <32 x bfloat>, "
                       "<32 x bfloat>)")
        elif line.startswith("attributes #") and '"target-cpu"' in line:
            out.append(_with_feature(line))
        else:
            out.append(line)
    patched = "\n".join(out) + "\n"
    if "@" + PLACEHOLDER in patched:
        raise RuntimeError(f"a call of {PLACEHOLDER} was not rewritten to {INTRINSIC}")
    return patched


def _with_feature(line: str, *wanted: str) -> str:
    """An attribute group with ``wanted`` (default: AVX512-BF16) among its target
    features. The placeholder (or a tile intrinsic) is only called for a CPU whose ISA has
    the extension, but LLVM's name for that CPU (``-mcpu``) need not imply it (a CPU it
    does not know becomes a generic one)."""
    wanted = wanted or (FEATURE,)
    m = _FEATURES.search(line)
    if m is None:
        return line.replace(" }", f' "target-features"="{",".join(wanted)}" }}', 1)
    features = [f for f in (m.group(1) or "").split(",") if f]
    features += [f for f in wanted if f not in features]
    return line[:m.start()] + f'"target-features"="{",".join(features)}"' + line[m.end():]


def _split_operands(text: str) -> list[str]:
    """The comma-separated operands of an LLVM call (commas inside constants such as
    ``<i32 1, i32 2>`` or ``splat (i32 0)`` do not separate)."""
    operands, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        elif ch == "," and depth == 0:
            operands.append(text[start:i].strip())
            start = i + 1
    operands.append(text[start:].strip())
    if len(operands) != 3:
        raise RuntimeError(f"unexpected operands of {PLACEHOLDER}: {text}")
    return operands
