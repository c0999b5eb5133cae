"""Targets as capabilities: what the passes and lowerings may know about a machine.

A :class:`Target` is parsed from a name (``"cpu"``, ``"cuda:sm_80"``, ``"cuda:sm_90a"``,
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

A CPU target may also name an ISA level narrower than the host (``cpu:x86-64-v3``, see
:data:`ISA_LEVELS`): its extensions are the level's, its vector width theirs, and LLVM
compiles for the level's generic CPU, so the code runs on any machine of that level. That
is how AVX2 code is built and tested on an AVX-512 machine (``JAXTILE_CPU_ISA``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import platform
import re
from collections.abc import Callable
from typing import Protocol, runtime_checkable

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
    level: str = "host"
    """``"host"``: code for this very CPU (LLVM's name for it); else an ISA level of
    :data:`ISA_LEVELS` (``"x86-64-v3"``) or a CPU of :data:`ISA_CPUS`
    (``"sapphirerapids"``), also LLVM's CPU name for it, whose extensions alone ``isa``
    then lists."""
    amx_emulated: bool = False
    """Test-only (:data:`AMX_EMULATION`): the AMX tile operations of the bfloat16 GEMM are
    emitted as plain loops implementing their definition (:mod:`.cpu.gemm_amx`), so that
    the very same AMX kernel runs on a CPU without AMX. Part of the content key when set,
    so emulated code never stands in for native code or the reverse."""

    @property
    def vector_registers(self) -> int:
        """SIMD registers the code may use: 32 with AVX-512, else 16 (x86-64's ymm/xmm)."""
        return 32 if "avx512f" in self.isa else 16

    @property
    def _bf16_pairs(self) -> bool:
        """AVX512-BF16 on 512-bit registers: what ``vdpbf16ps`` and AMX's GEMM need."""
        return "avx512_bf16" in self.isa and self.vector_bits >= 512

    @property
    def bf16_dot(self) -> bool:
        """Whether the GEMM on bfloat16 operands dots bfloat16 pairs into float32 lanes
        (``vdpbf16ps`` on 512-bit registers, AVX512-BF16; see :mod:`.cpu.gemm_bf16`) instead
        of widening them for float32 FMAs. The CPU must have the instruction, and it must
        pay: on AMD's cores (Zen 4) a dot issues as often as a 512-bit FMA and does twice
        its products, while on Intel's one dot port matches two FMA ports, and the dot path,
        with its pairs to re-lay, took 1.6x the FMA path's time (the 1024^3 GEMM on a
        Sapphire Rapids VM with AMX off, ``benchmarks/README.md``). So an Intel CPU dots
        only where AMX takes its GEMMs (:attr:`amx_bf16`, whose path is built on this one).
        Derived from ``isa`` and ``model``, so part of every content key."""
        intel = self.model.startswith("vendor_id=GenuineIntel")
        return self._bf16_pairs and (not intel or self.amx_bf16)

    @property
    def amx_bf16(self) -> bool:
        """Whether the GEMM on bfloat16 operands may use AMX tiles (``tdpbf16ps``, see
        :mod:`.cpu.gemm_amx`): the CPU has AMX-TILE and AMX-BF16, and (for the host) Linux
        granted this process the tile data state (:func:`host_isa` drops the flags when it
        refused). Every AMX-BF16 CPU also has AVX512-BF16, whose path (:attr:`bf16_dot`)
        the AMX one replaces."""
        return "amx_tile" in self.isa and "amx_bf16" in self.isa and self._bf16_pairs


@runtime_checkable
class GpuCaps(Protocol):
    """What the GPU tier (``compiler/gpu/``) may ask of a GPU, whatever its vendor:
    :class:`CudaCaps` and :class:`HipCaps` answer it, so that GPU-common code is written once
    against these names instead of one vendor's."""

    @property
    def arch(self) -> str:
        """The architecture's name, for messages (``sm_80``, ``gfx90a``)."""
        ...

    @property
    def warp_size(self) -> int:
        """Threads that run in lockstep (a warp; a wavefront on AMD)."""
        ...

    @property
    def max_threads_per_block(self) -> int: ...

    @property
    def static_smem_bytes(self) -> int:
        """Shared memory a block gets without opting in."""
        ...

    @property
    def max_smem_bytes(self) -> int:
        """Shared memory a block may use at most."""
        ...

    @property
    def mma_shapes(self) -> tuple[tuple[str, str], ...]:
        """``(shape, input type)`` pairs of the matrix instructions the lowering may use."""
        ...

    @property
    def dialect(self) -> str:
        """The language the generated source is compiled as (``CUDA``, ``HIP``), for the
        source's header and messages."""
        ...

    @property
    def tma(self) -> bool:
        """Whether global -> shared tile copies may be made by a tensor memory accelerator
        completing on mbarriers (:mod:`.gpu.tma`)."""
        ...

    @property
    def setmaxnreg(self) -> bool:
        """Whether warpgroups may move registers between them (``setmaxnreg``), which warp
        specialisation needs (:mod:`.gpu.warp_specialise`)."""
        ...


@dataclasses.dataclass(frozen=True)
class CudaCaps:
    """An NVIDIA GPU architecture, as the CUDA lowering needs it."""

    sm: int
    """Compute capability times ten: 80 for sm_80 (Ampere), 90 for sm_90 (Hopper)."""
    arch_specific: bool
    """The ``a`` variant (sm_90a, sm_100a): code may use the architecture-specific
    instructions, and its PTX runs on that architecture only (no PTX fallback to newer
    GPUs, see :func:`.cuda.compile.arch_of`)."""
    warp_size: int
    max_threads_per_block: int
    static_smem_bytes: int
    """Shared memory a block gets without opting in (48 KiB)."""
    max_smem_bytes: int
    """Shared memory a block may opt into (dynamic shared memory)."""
    smem_banks: int
    bank_bytes: int
    async_copy: bool
    """``cp.async`` global -> shared copies (sm_80 on)."""
    ldmatrix: bool
    mma_shapes: tuple[tuple[str, str], ...]
    """``(shape, input type)`` pairs of ``mma.sync`` the lowering may use."""
    wgmma: bool
    """Warpgroup MMA (sm_90a only: Blackwell has tcgen05 instead); used by a later lowering."""
    tcgen05: bool
    """Fifth-generation tensor core instructions (sm_100a); used by a later lowering."""
    tma: bool
    """Tensor memory accelerator copies (sm_90 on): the pipelining pass makes a pipelined
    loop's staged copies TMA loads where their shapes allow (:mod:`.gpu.tma`)."""
    setmaxnreg: bool = False
    """``setmaxnreg.{inc,dec}`` (sm_90a): a TMA ring may be warp-specialised
    (:mod:`.gpu.warp_specialise`)."""

    @property
    def arch(self) -> str:
        """``sm_XY``, or ``sm_XYa`` for an architecture-specific target."""
        return f"sm_{self.sm}{'a' if self.arch_specific else ''}"

    @property
    def dialect(self) -> str:
        return "CUDA"


@dataclasses.dataclass(frozen=True)
class MfmaShape:
    """One matrix-core instruction of a wave: D (m x n) = A (m x k) @ B (k x n) + C, with C
    and D in float32 (AGPRs or VGPRs) and A, B of type ``operand``, each lane holding
    ``k * m / 64`` of A's and of B's elements (the layouts are :mod:`.hip.mfma`'s)."""

    m: int
    n: int
    k: int
    operand: str
    """``f16``, ``bf16``, ``xf32`` (float32 operands multiplied at reduced precision: a
    10-bit mantissa, like NVIDIA's tf32), ``fp8`` or ``bf8`` (OCP-like float8 E4M3 / E5M2,
    gfx942's FNUZ variants)."""
    builtin: str
    """clang's builtin for it (``__builtin_amdgcn_mfma_f32_32x32x8f16``)."""
    instruction: str
    """The mnemonic the target's assembler prints (gfx90a: ``v_mfma_f32_32x32x8f16``,
    gfx942: ``v_mfma_f32_32x32x8_f16``)."""


@dataclasses.dataclass(frozen=True)
class HipCaps:
    """An AMD Instinct GPU architecture (CDNA), as the HIP lowering needs it.

    Sources: AMD's "AMD Instinct MI200 Instruction Set Architecture" (CDNA2, gfx90a) and
    "AMD Instinct MI300 Instruction Set Architecture" (CDNA3, gfx942) reference guides: the
    register files and matrix instructions (their "Matrix Arithmetic Instructions" chapter),
    LDS (the "Data Share Operations" chapter) and buffer addressing (range checking in the
    "Vector Memory Buffer Instructions" chapter), cross-checked against what clang 19's
    AMDGPU backend accepts for ``--offload-arch=gfx90a`` / ``gfx942``.
    """

    gfx: str
    warp_size: int
    """Lanes of a wave: 64 on CDNA (wave64; no wave32 mode)."""
    max_threads_per_block: int
    lds_bytes: int
    """LDS a workgroup may allocate (64 KiB; also what one compute unit has)."""
    lds_banks: int
    lds_bank_bytes: int
    """LDS is 32 banks of 4 bytes (see :mod:`.hip.lds` for the wave64 access phases)."""
    mfma: tuple[MfmaShape, ...]
    """The matrix instructions into float32 the lowering may use."""
    vgprs: int
    """The unified vector register file per lane of a SIMD: 512 registers shared by the
    waves on it, each wave's architectural VGPRs followed by its AGPRs."""
    arch_vgprs: int
    """Architectural VGPRs one wave may address (256)."""
    agprs: int
    """Accumulation registers (AGPRs) one wave may address (256): MFMA's C and D may live
    there, and every other instruction only moves data in and out of them."""
    vgpr_granule: int
    """A wave's VGPRs are allocated in blocks of this many (8)."""
    sgprs: int
    """Scalar registers per SIMD (800), shared by its waves: ``sgprs // n`` waves of ``n``
    each, with no rounding up (LLVM's occupancy rule for GFX8 and GFX9, see
    :meth:`.hip.resources.KernelResources.waves_per_simd`)."""
    max_sgprs: int
    """Scalar registers one wave may address (102, plus VCC)."""
    max_waves_per_simd: int
    simds_per_cu: int
    buffer_loads_zero_out_of_range: bool
    """Buffer loads through a resource descriptor whose size bounds the buffer return zero
    for every out-of-range offset (and buffer stores drop them): the masks at the end of a
    buffer are not needed."""

    # GpuCaps' names for the same facts (warp_size and max_threads_per_block are fields).
    @property
    def arch(self) -> str:
        return self.gfx

    @property
    def static_smem_bytes(self) -> int:
        """A workgroup may use all of the LDS (there is no opt-in above a default)."""
        return self.lds_bytes

    @property
    def max_smem_bytes(self) -> int:
        return self.lds_bytes

    @property
    def mma_shapes(self) -> tuple[tuple[str, str], ...]:
        """The MFMA shapes as ``("32x32x8", "f16")`` pairs."""
        return tuple((f"{s.m}x{s.n}x{s.k}", s.operand) for s in self.mfma)

    @property
    def dialect(self) -> str:
        return "HIP"

    @property
    def tma(self) -> bool:
        """CDNA has no tensor memory accelerator: pipelines copy with the threads."""
        return False

    @property
    def setmaxnreg(self) -> bool:
        """CDNA allocates registers per kernel: no warpgroup moves them at run time."""
        return False


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
        caps = dataclasses.asdict(self.caps)
        # Named only when set, so that the keys of real CPUs did not change when the
        # test-only field came.
        if caps.get("amx_emulated") is False:
            del caps["amx_emulated"]
        return json.dumps({"name": self.name, "kind": self.kind, "toolchain": self.toolchain,
                           "caps": caps}, sort_keys=True)


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


AMX_FLAGS = frozenset({"amx_tile", "amx_bf16", "amx_int8"})

AMX_EMULATION = False
"""Test-only switch (tests set it with ``monkeypatch``): a host whose flags name AMX gets
:attr:`CpuCaps.amx_emulated`, and no permission is asked of the OS (the emulation touches no
tile state). Together with flags added to :func:`_cpuinfo`, it runs the AMX kernel on any
CPU."""


def _cpu_flags() -> set[str]:
    """Every flag ``/proc/cpuinfo`` gives this CPU (``flags`` on x86, ``Features`` on Arm)."""
    info = _cpuinfo()
    return set((info.get("flags") or info.get("Features") or "").split())


def host_isa() -> tuple[str, ...]:
    """The instruction-set extensions of this machine's CPU that compiled code may use.

    AMX's flags count only once Linux has granted this process the tile data state
    (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, asked by the FFI library: :func:`amx_permitted`):
    without it the first tile instruction would kill the process."""
    flags = _cpu_flags()
    if _amx_refused(flags):
        flags -= AMX_FLAGS
    return tuple(sorted(ISA_FLAGS.intersection(flags)))


def _amx_refused(flags: set[str]) -> bool:
    """Whether a CPU with these flags has AMX that this process may not use (no tile data
    state granted; the test-only emulation needs none)."""
    return bool(flags & AMX_FLAGS) and not AMX_EMULATION and not amx_permitted()


@functools.cache
def amx_permitted() -> bool:
    """Whether this process may use AMX tiles: the FFI library asks Linux for the tile data
    state once (``ffi/cpu/host_cpu.cc``); False where it is refused, where the CPU has no
    AMX, or where the FFI library cannot be loaded (then no AMX kernel could run anyway)."""
    try:
        from jaxtile import _ffi
    except ImportError:
        return False
    return bool(_ffi.amx_permitted())


def amx_note() -> str | None:
    """Why this CPU's AMX goes unused (for ``jaxtile doctor``), or None."""
    flags = _cpu_flags()
    if {"amx_tile", "amx_bf16"} <= flags and _amx_refused(flags):
        return ("the CPU has AMX but Linux refused this process the tile data state "
                "(arch_prctl ARCH_REQ_XCOMP_PERM); bfloat16 GEMMs use AVX512-BF16 instead")
    return None


_V2 = "sse sse2 pni ssse3 sse4_1 sse4_2 popcnt cx16 lahf_lm"
_V3 = _V2 + " avx avx2 bmi1 bmi2 f16c fma abm movbe"
_V4 = _V3 + " avx512f avx512bw avx512cd avx512dq avx512vl"
ISA_LEVELS = {"x86-64-v3": tuple(sorted(_V3.split())), "x86-64-v4": tuple(sorted(_V4.split()))}
"""The x86-64 micro-architecture levels (System V psABI) a CPU target may be narrowed to,
with their extensions as ``/proc/cpuinfo`` names them (``abm`` is LZCNT): v3 is AVX2 + FMA
(Haswell, Zen 1-3), v4 adds AVX-512 F/BW/CD/DQ/VL (Skylake-X, Zen 4; not its BF16)."""

_SPR = (_V4 + " aes pclmulqdq adx sha_ni gfni vaes vpclmulqdq avx_vnni avx512ifma avx512vbmi"
        " avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq avx512_bf16 avx512_fp16"
        " amx_tile amx_bf16 amx_int8")
ISA_CPUS = {"sapphirerapids": tuple(sorted(_SPR.split()))}
"""CPUs a target may name by LLVM's CPU name, for extensions no level has: Sapphire Rapids
(Intel Xeon 4th generation) brings AMX (tiles, ``tdpbf16ps``). Its extensions are those of
LLVM's ``sapphirerapids`` that :data:`ISA_FLAGS` names, so code built for it is refused on a
machine lacking any. Unlike the levels, no prebuilt library is made for them by default:
they exist so that such code can be compiled and inspected anywhere (``cpu:sapphirerapids``)
and run where the host has it."""


def named_isa(level: str) -> tuple[str, ...]:
    """The extensions of a level of :data:`ISA_LEVELS` or a CPU of :data:`ISA_CPUS`."""
    return ISA_LEVELS[level] if level in ISA_LEVELS else ISA_CPUS[level]


def check_isa_level(level: str) -> None:
    """Raise ``ValueError`` unless ``level`` is ``"host"`` or a level of
    :data:`ISA_LEVELS` (or a CPU of :data:`ISA_CPUS`) this machine can run (what running
    kernels built for it needs)."""
    if level == "host":
        return
    if level not in ISA_LEVELS and level not in ISA_CPUS:
        raise ValueError(f"expected host or one of {', '.join([*ISA_LEVELS, *ISA_CPUS])}")
    if platform.machine() not in ("x86_64", "AMD64"):
        raise ValueError(f"{level} is an x86-64 level and this machine is "
                         f"{platform.machine()}")
    if missing := sorted(set(named_isa(level)) - set(host_isa())):
        raise ValueError(f"this CPU lacks {' '.join(missing)} of {level}, so code built for "
                         "it could not run here")


def _cpu_model() -> str:
    info = _cpuinfo()
    keys = ("vendor_id", "cpu family", "model", "CPU implementer", "CPU part")
    return ",".join(f"{k}={info[k]}" for k in keys if k in info)


def _cpu_vector_bits() -> int:
    return _vector_bits(host_isa())


def _vector_bits(isa: tuple[str, ...]) -> int:
    flags = set(isa)
    if "avx512f" in flags:
        return 512
    return 256 if "avx2" in flags else 128


@functools.cache
def _version(dist: str) -> str:
    try:
        return f"{dist} {importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{dist} unknown"


def _cpu(level: str = "host") -> Target:
    """The host CPU, or the CPUs of an ISA ``level``: code for a level this machine lacks
    can be compiled and inspected, not run (:func:`check_isa_level` says)."""
    isa = host_isa() if level == "host" else named_isa(level)
    bits = _cpu_vector_bits() if level == "host" else _vector_bits(isa)
    # A level's code is compiled for the level's generic CPU, whatever the host's model:
    # leaving the model out of its key lets code built on one machine (``jaxtile
    # prebuild``) be found on every machine of the level.
    model = _cpu_model() if level == "host" else ""
    emulated = level == "host" and AMX_EMULATION and "amx_tile" in isa
    caps = CpuCaps(platform.machine(), isa, model, bits, level, emulated)
    return Target("cpu" if level == "host" else f"cpu:{level}", "cpu", caps,
                  _version("apache-tvm"))


_AMPERE_MMA = (("m16n8k16", "f16"), ("m16n8k16", "bf16"), ("m16n8k8", "tf32"))
_TURING_MMA = (("m16n8k8", "f16"),)
_KIB = 1024
_CUDA: dict[str, dict] = {
    # Turing: no cp.async, no bf16 or tf32 mma.sync, m16n8k8 only for f16.
    "sm_75": dict(max_smem_bytes=64 * _KIB, async_copy=False, mma_shapes=_TURING_MMA),
    "sm_80": dict(max_smem_bytes=163 * _KIB),  # A100
    "sm_86": dict(max_smem_bytes=99 * _KIB),  # RTX 30xx, A40
    "sm_87": dict(max_smem_bytes=163 * _KIB),  # Jetson Orin
    "sm_89": dict(max_smem_bytes=99 * _KIB),  # RTX 40xx, L4, L40
    "sm_90": dict(max_smem_bytes=227 * _KIB, tma=True),  # H100, H200
    "sm_90a": dict(max_smem_bytes=227 * _KIB, tma=True, wgmma=True, setmaxnreg=True),
    "sm_100": dict(max_smem_bytes=227 * _KIB, tma=True),  # B200
    "sm_100a": dict(max_smem_bytes=227 * _KIB, tma=True, tcgen05=True),
    "sm_103": dict(max_smem_bytes=227 * _KIB, tma=True),  # B300
    "sm_120": dict(max_smem_bytes=99 * _KIB, tma=True),  # RTX 50xx, RTX PRO 6000
    "sm_121": dict(max_smem_bytes=99 * _KIB, tma=True),  # DGX Spark
}
"""Each CUDA architecture jaxtile knows, by its ``sm_XY[a]`` name: what differs from an
Ampere default (:func:`_cuda_caps`). An ``a`` name is its own target."""


def _cuda_caps(arch: str) -> CudaCaps:
    """The capabilities of ``arch`` (a key of :data:`_CUDA`): Ampere's, changed by its row."""
    defaults = dict(sm=int(arch[3:].rstrip("a")), arch_specific=arch.endswith("a"),
                    warp_size=32, max_threads_per_block=1024, static_smem_bytes=48 * _KIB,
                    smem_banks=32, bank_bytes=4, async_copy=True, ldmatrix=True,
                    mma_shapes=_AMPERE_MMA, wgmma=False, tcgen05=False, tma=False)
    return CudaCaps(**{**defaults, **_CUDA[arch]})


def missing_for_lowering(caps: CudaCaps) -> list[str]:
    """What the CUDA lowering needs that ``caps`` lack (empty for sm_80 and later): copy
    pipelines are made of ``cp.async``, the gemm's tensor-core path of Ampere's ``mma.sync``
    shapes."""
    missing = []
    if not caps.async_copy:
        missing.append("cp.async (asynchronous global -> shared copies)")
    if absent := [f"{shape} on {dtype}" for shape, dtype in _AMPERE_MMA
                  if (shape, dtype) not in caps.mma_shapes]:
        missing.append(f"mma.sync {', '.join(absent)}")
    return missing


TOOLCHAINS: dict[str, Callable[[], str]] = {}
"""Target kind -> the identity of the toolchain that compiles for it (:attr:`Target.toolchain`),
for the kinds whose backend knows it: ``compiler/__init__.py`` registers CUDA's
(``cuda/fingerprint.py``), so that this module, which every tier imports, imports no backend."""


def _cuda(arch: str) -> Target:
    caps = _cuda_caps(arch)
    if missing := missing_for_lowering(caps):
        usable = [a for a in _CUDA if not missing_for_lowering(_cuda_caps(a))]
        raise KernelError(f"target cuda:{arch} lacks what jaxtile's CUDA lowering needs: "
                          f"{'; '.join(missing)}. CUDA kernels are compiled for "
                          f"{', '.join(usable)}; on an older GPU run them on the CPU "
                          "(jax.default_device(jax.devices('cpu')[0]))")
    return Target(f"cuda:{arch}", "cuda", caps, TOOLCHAINS["cuda"]())


def _mfma(m: int, n: int, k: int, operand: str, builtin_suffix: str,
          gfx942_spelling: bool) -> MfmaShape:
    """The instruction computing ``m x n x k`` on ``operand``: clang's builtin is
    ``__builtin_amdgcn_mfma_f32_<m>x<n>x<k><builtin_suffix>``; gfx940 and later spell the
    16-bit mnemonics with an underscore before the operand type and without ``_1k``."""
    shape = f"{m}x{n}x{k}"
    builtin = f"__builtin_amdgcn_mfma_f32_{shape}{builtin_suffix}"
    if not gfx942_spelling or builtin_suffix.startswith("_"):
        instruction = f"v_mfma_f32_{shape}{builtin_suffix}"
    else:
        instruction = f"v_mfma_f32_{shape}_{operand}"
    return MfmaShape(m, n, k, operand, builtin, instruction)


def _cdna_mfma(gfx942: bool) -> tuple[MfmaShape, ...]:
    """CDNA2's f16 and bf16 (the ``_1k`` forms: 4 bf16 per lane and register pair, like
    f16) matrix instructions into float32, and what CDNA3 adds: xf32 and float8."""
    shapes = [_mfma(32, 32, 8, "f16", "f16", gfx942), _mfma(16, 16, 16, "f16", "f16", gfx942),
              _mfma(32, 32, 8, "bf16", "bf16_1k", gfx942),
              _mfma(16, 16, 16, "bf16", "bf16_1k", gfx942)]
    if gfx942:
        shapes += [_mfma(32, 32, 4, "xf32", "_xf32", True), _mfma(16, 16, 8, "xf32", "_xf32", True),
                   _mfma(32, 32, 16, "fp8", "_fp8_fp8", True),
                   _mfma(16, 16, 32, "fp8", "_fp8_fp8", True),
                   _mfma(32, 32, 16, "bf8", "_bf8_bf8", True),
                   _mfma(16, 16, 32, "bf8", "_bf8_bf8", True)]
    return tuple(shapes)


HIP_ARCHS = ("gfx90a", "gfx942")
"""The AMD architectures jaxtile knows: CDNA2 (MI210, MI250X) and CDNA3 (MI300X, MI300A,
MI325X)."""


def _hip_caps(gfx: str) -> HipCaps:
    """The capabilities of ``gfx``: both generations share the wave size, LDS, register
    files and occupancy limits; CDNA3 adds matrix instructions."""
    return HipCaps(gfx, warp_size=64, max_threads_per_block=1024, lds_bytes=64 * _KIB,
                   lds_banks=32, lds_bank_bytes=4, mfma=_cdna_mfma(gfx == "gfx942"),
                   vgprs=512, arch_vgprs=256, agprs=256, vgpr_granule=8, sgprs=800,
                   max_sgprs=102, max_waves_per_simd=8, simds_per_cu=4,
                   buffer_loads_zero_out_of_range=True)


def _hip(gfx: str) -> Target:
    return Target(f"hip:{gfx}", "hip", _hip_caps(gfx), TOOLCHAINS["hip"]())


KNOWN = ("cpu", *(f"cpu:{level}" for level in (*ISA_LEVELS, *ISA_CPUS)),
         *(f"cuda:{arch}" for arch in _CUDA),
         *(f"hip:{g}" for g in HIP_ARCHS))


def parse_target(name: str = "cpu") -> Target:
    """The target called ``name`` (one of :data:`KNOWN`); ``"cpu"`` is this machine,
    ``"cpu:x86-64-v3"`` this machine narrowed to AVX2 (see :data:`ISA_LEVELS`).

    >>> parse_target("cuda:sm_80").caps.warp_size
    32
    """
    if not isinstance(name, str):
        raise KernelError(f"target must be a string such as 'cpu' or 'cuda:sm_80', got "
                          f"{name!r}; known targets: {', '.join(KNOWN)}")
    if name == "cpu":
        return _cpu()
    if name.startswith("cpu:") and (name[4:] in ISA_LEVELS or name[4:] in ISA_CPUS):
        return _cpu(name[4:])
    if name.startswith("cuda:") and name[5:] in _CUDA:
        return _cuda(name[5:])
    m = re.fullmatch(r"hip:(gfx\w+)", name)
    if m and m.group(1) in HIP_ARCHS:
        return _hip(m.group(1))
    raise KernelError(f"unknown target {name!r}; known targets: {', '.join(KNOWN)}")


def cuda_target_for(compute_capability: str, *, present: bool = False) -> Target:
    """The target for a GPU of ``compute_capability`` (``"9.0"``): its plain ``sm_XY``,
    which the cubin is compiled for and whose PTX runs on every later GPU. A GPU newer than
    every known architecture gets the highest plain one at or below it: the driver compiles
    that target's PTX for it (the CUDA handler's fallback).

    ``present``: the code runs on this very GPU (a lowering for the devices at hand, not an
    export), so its architecture-specific target, where jaxtile has one for exactly this
    compute capability (``sm_90a`` for 9.0: wgmma, ``setmaxnreg``), is chosen instead. Its
    code runs on that architecture alone, which is why an export, whose program may meet any
    later GPU, keeps the plain target."""
    major, _, minor = compute_capability.partition(".")
    try:
        sm = int(major) * 10 + int(minor or 0)
    except ValueError:
        raise KernelError(f"bad CUDA compute capability {compute_capability!r}") from None
    if present and f"sm_{sm}a" in _CUDA:
        return _cuda(f"sm_{sm}a")
    plain = [a for a in _CUDA if not a.endswith("a") and int(a[3:]) <= sm]
    if not plain:
        raise KernelError(f"a GPU of compute capability {compute_capability} is older than "
                          f"every CUDA target jaxtile knows ({', '.join(_CUDA)})")
    return _cuda(max(plain, key=lambda a: int(a[3:])))


def for_platform(platform_name: str, compute_capability: str | None = None, *,
                 present: bool = False) -> Target:
    """The target a JAX platform compiles for: ``cpu`` is the host; ``cuda`` needs the
    device's compute capability (e.g. ``"9.0"``, see :func:`cuda_target_for`, which also
    says what ``present`` changes); ``rocm`` the device's gfx name."""
    if platform_name == "cpu":
        return parse_target("cpu")
    if platform_name == "cuda":
        return cuda_target_for(compute_capability or "8.0",
                               present=present and compute_capability is not None)
    if platform_name == "rocm":
        # JAX's ROCm devices name their ISA with its features ("gfx942:sramecc+:xnack-").
        return parse_target(f"hip:{(compute_capability or 'gfx90a').split(':')[0]}")
    raise KernelError(f"jaxtile has no target for the platform {platform_name!r}")
