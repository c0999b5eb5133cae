"""Targets as capabilities: what the passes and lowerings may know about a machine.

A :class:`Target` is parsed from a name (``"cpu"``, ``"cuda:sm_80"``, ``"cuda:sm_90"``,
``"hip:gfx90a"``, ``"hip:gfx942"``) and carries typed capabilities for its kind. Target
differences live here, as data, never as ``if arch == ...`` branches across the compiler.
``Target.describe()`` is part of every content key: it holds the capabilities and the
identity of the toolchain that compiles for the target.

The host CPU is described once, from ``/proc/cpuinfo``: its architecture, the instruction-set
extensions that compiled code may use (:data:`ISA_FLAGS`) and its model. The same
description is the cache key's fingerprint and what an exported payload requires of the
machine that runs it. LLVM's CPU name (what ``-mcpu`` code generation follows) is a
function of the model and the extensions for a given LLVM, whose version is fixed by TVM's
version in the toolchain identity; so the key determines it without loading TVM, which a
cache hit must not do.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import platform
import re

from .cuda.fingerprint import toolchain_fingerprint
from .errors import KernelError

ISA_FLAGS = frozenset("""
    sse sse2 pni ssse3 sse4_1 sse4_2 sse4a popcnt abm movbe cx16 lahf_lm f16c fma fma4 xop
    avx avx2 bmi1 bmi2 adx aes pclmulqdq vpclmulqdq vaes gfni sha_ni avx_vnni avx_vnni_int8
    avx_ifma avx512f avx512cd avx512bw avx512dq avx512vl avx512ifma avx512vbmi avx512_vbmi2
    avx512_vnni avx512_bitalg avx512_vpopcntdq avx512_bf16 avx512_fp16 amx_tile amx_bf16
    amx_int8
    fp asimd fphp asimdhp asimdrdm asimddp asimdfhm atomics crc32 pmull sha1 sha2 sha3 sha512
    sve sve2 svebf16 svei8mm svef32mm svef64mm bf16 i8mm sme sme2 fcma jscvt lrcpc ilrcpc
""".split())
"""Instruction-set extensions, as ``/proc/cpuinfo`` names them, that compiled code may use.
Flags outside this list (e.g. ``hypervisor``) say nothing about what code can run."""


@dataclasses.dataclass(frozen=True)
class CpuCaps:
    """A CPU: architecture (``uname -m``), usable ISA extensions, model, vector width."""

    arch: str
    isa: tuple[str, ...]
    model: str
    """Vendor, family and model numbers: with ``isa``, what fixes LLVM's CPU name."""
    vector_bits: int
    """Width of the widest SIMD registers (512 with AVX-512, 256 with AVX2, else 128);
    sizes vector loops and register tiles such as the GEMM's."""

    @property
    def bf16_dot(self) -> bool:
        """Whether bfloat16 pairs can be dotted into float32 lanes in one instruction
        (``vdpbf16ps`` on 512-bit registers, AVX512-BF16): the GEMM on bfloat16 operands
        uses it (see :mod:`.cpu.gemm_bf16`). Derived from ``isa``, so it is part of every
        content key."""
        return "avx512_bf16" in self.isa and self.vector_bits >= 512


@dataclasses.dataclass(frozen=True)
class CudaCaps:
    """An NVIDIA GPU architecture, as the CUDA lowering needs it."""

    sm: int
    """Compute capability times ten: 80 for sm_80 (Ampere), 90 for sm_90 (Hopper)."""
    warp_size: int
    max_threads_per_block: int
    static_smem_bytes: int
    """Shared memory a block gets without opting in (48 KiB)."""
    max_smem_bytes: int
    """Shared memory a block may opt into (dynamic shared memory)."""
    smem_banks: int
    bank_bytes: int
    async_copy: bool
    """``cp.async`` global -> shared copies."""
    ldmatrix: bool
    mma_shapes: tuple[tuple[str, str], ...]
    """``(shape, input type)`` pairs of ``mma.sync`` the lowering may use."""
    wgmma: bool
    """Warpgroup MMA (sm_90a); used by a later lowering."""
    tma: bool
    """Tensor memory accelerator copies (sm_90); used by a later lowering."""


@dataclasses.dataclass(frozen=True)
class HipCaps:
    """An AMD GPU architecture."""

    gfx: str
    wavefront: int
    lds_bytes: int
    mfma_shapes: tuple[tuple[str, str], ...]


Caps = CpuCaps | CudaCaps | HipCaps


@dataclasses.dataclass(frozen=True)
class Target:
    """A compilation target: its name as users write it, its kind (``cpu``, ``cuda``,
    ``hip``), its capabilities and the identity of its toolchain."""

    name: str
    kind: str
    caps: Caps
    toolchain: str
    """Identity of what compiles for the target (e.g. ``apache-tvm 0.27.0.post1``): a new
    toolchain never reuses a cached artifact."""

    def describe(self) -> str:
        """A stable text form, part of every content key."""
        return json.dumps({"name": self.name, "kind": self.kind, "toolchain": self.toolchain,
                           "caps": dataclasses.asdict(self.caps)}, sort_keys=True)


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The fields of the first processor in /proc/cpuinfo (empty where unreadable)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def host_isa() -> tuple[str, ...]:
    """The instruction-set extensions of this machine's CPU that compiled code may use."""
    info = _cpuinfo()
    flags = (info.get("flags") or info.get("Features") or "").split()
    return tuple(sorted(ISA_FLAGS.intersection(flags)))


def _cpu_model() -> str:
    info = _cpuinfo()
    keys = ("vendor_id", "cpu family", "model", "CPU implementer", "CPU part")
    return ",".join(f"{k}={info[k]}" for k in keys if k in info)


def _cpu_vector_bits() -> int:
    flags = set(host_isa())
    if "avx512f" in flags:
        return 512
    return 256 if "avx2" in flags else 128


@functools.cache
def _version(dist: str) -> str:
    try:
        return f"{dist} {importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{dist} unknown"


def _cpu() -> Target:
    caps = CpuCaps(platform.machine(), host_isa(), _cpu_model(), _cpu_vector_bits())
    return Target("cpu", "cpu", caps, _version("apache-tvm"))


_F16_MMA = (("m16n8k16", "f16"), ("m16n8k16", "bf16"), ("m16n8k8", "tf32"))
_CUDA = {
    80: dict(max_smem_bytes=163 * 1024, wgmma=False, tma=False),
    86: dict(max_smem_bytes=99 * 1024, wgmma=False, tma=False),
    89: dict(max_smem_bytes=99 * 1024, wgmma=False, tma=False),
    90: dict(max_smem_bytes=227 * 1024, wgmma=True, tma=True),
}
_HIP = {
    "gfx90a": (("32x32x8", "f16"), ("32x32x8", "bf16_1k"), ("16x16x16", "f16")),
    "gfx942": (("32x32x8", "f16"), ("32x32x8", "bf16"), ("16x16x16", "f16")),
}


def _cuda(sm: int) -> Target:
    caps = CudaCaps(sm=sm, warp_size=32, max_threads_per_block=1024,
                    static_smem_bytes=48 * 1024, smem_banks=32, bank_bytes=4, async_copy=True,
                    ldmatrix=True, mma_shapes=_F16_MMA, **_CUDA[sm])
    return Target(f"cuda:sm_{sm}", "cuda", caps, toolchain_fingerprint())


def _hip(gfx: str) -> Target:
    caps = HipCaps(gfx, wavefront=64, lds_bytes=64 * 1024, mfma_shapes=_HIP[gfx])
    return Target(f"hip:{gfx}", "hip", caps, "rocm")


KNOWN = ("cpu", *(f"cuda:sm_{sm}" for sm in _CUDA), *(f"hip:{g}" for g in _HIP))


def parse_target(name: str = "cpu") -> Target:
    """The target called ``name`` (one of :data:`KNOWN`); ``"cpu"`` is this machine.

    >>> parse_target("cuda:sm_80").caps.warp_size
    32
    """
    if not isinstance(name, str):
        raise KernelError(f"target must be a string such as 'cpu' or 'cuda:sm_80', got "
                          f"{name!r}; known targets: {', '.join(KNOWN)}")
    if name == "cpu":
        return _cpu()
    m = re.fullmatch(r"cuda:sm_(\d+)a?", name)
    if m and int(m.group(1)) in _CUDA:
        return _cuda(int(m.group(1)))
    m = re.fullmatch(r"hip:(gfx\w+)", name)
    if m and m.group(1) in _HIP:
        return _hip(m.group(1))
    raise KernelError(f"unknown target {name!r}; known targets: {', '.join(KNOWN)}")


def for_platform(platform_name: str, compute_capability: str | None = None) -> Target:
    """The target a JAX platform compiles for: ``cpu`` is the host; ``cuda`` needs the
    device's compute capability (e.g. ``"9.0"``); ``rocm`` the device's gfx name."""
    if platform_name == "cpu":
        return parse_target("cpu")
    if platform_name == "cuda":
        major, _, minor = (compute_capability or "8.0").partition(".")
        return parse_target(f"cuda:sm_{int(major)}{int(minor or 0)}")
    if platform_name == "rocm":
        return parse_target(f"hip:{compute_capability or 'gfx90a'}")
    raise KernelError(f"jaxtile has no target for the platform {platform_name!r}")
