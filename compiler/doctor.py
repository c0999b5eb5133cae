"""``jaxtile doctor``: what this machine has for each backend, and what to do where
something is missing.

Every check asks the module that uses the tool how it finds it (the CPU backend's TVM, and
whether it needs ``ld``: only where the FFI cannot link objects itself; the emulator's C++
compiler, NVRTC's loader, nvcc's and the AMD clang's search, the host ISA the CPU target is
keyed on), so the answer is the one a compile would get.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import importlib.metadata
import os
import platform
import shutil
import subprocess
from collections.abc import Callable

from . import cache, cache_admin, target


@dataclasses.dataclass(frozen=True)
class Check:
    """One finding: ``ok`` False means the feature ``name`` is unavailable here."""

    name: str
    ok: bool
    detail: str
    advice: str = ""
    """What to do about it (only where not ``ok``)."""
    required: bool = False
    """Whether jaxtile's CPU path needs it (the others enable one backend each)."""


def _dist(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_line(cmd: list[str], last: bool = False) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown version"
    lines = out.splitlines()
    return (lines[-1] if last else lines[0]) if lines else "unknown version"


def _cpu_backend() -> Check:
    tvm_version = _dist("apache-tvm")
    if tvm_version is None:
        return Check("CPU backend (TVM/LLVM)", False, "apache-tvm is not installed",
                     "pip install jaxtile's dependencies (pip install -e .)", True)
    from .cpu import tir_emit

    llvm = tir_emit.tvm.target.codegen.llvm_version_major()
    return Check("CPU backend (TVM/LLVM)", True,
                 f"apache-tvm {tvm_version}, LLVM {llvm}, host CPU {tir_emit.host_cpu()}",
                 required=True)


def _cpu_isa() -> Check:
    isa = target.host_isa()
    note = target.amx_note()
    return Check("CPU ISA", True, f"{platform.machine()}: {' '.join(isa) or 'baseline only'}"
                 + (f" ({note})" if note else ""), required=True)


def _bf16_gemm() -> Check:
    """The path this CPU's bfloat16 GEMMs (float32 accumulators) take."""
    caps = target.parse_target("cpu").caps
    if caps.amx_bf16:
        how = "AMX tiles (tdpbf16ps), once a self-check in a child process has passed"
    elif caps.bf16_dot:
        how = "vdpbf16ps (AVX512-BF16)"
    elif "avx512_bf16" in caps.isa:
        how = ("float32 FMAs on widened operands: this CPU has vdpbf16ps, but on Intel's "
               "cores two FMA ports outrun its one")
    else:
        how = "float32 FMAs on widened operands"
    return Check("bfloat16 GEMM", True, how)


def _linker() -> Check:
    from jaxtile import _ffi

    ld = shutil.which("ld")
    if _ffi.CPU_LINKS_OBJECTS:
        # The FFI links CPU kernels' objects itself (ffi/cpu/elf_object.h).
        where = f"{ld} is there" if ld else "none on PATH"
        return Check("linker (ld)", True, f"not needed: CPU kernels are linked in process "
                     f"({where})")
    if ld is None:
        return Check("linker (ld)", False, "ld is not on PATH",
                     "install binutils (apt-get install binutils): CPU kernels are linked "
                     "with ld -shared", True)
    return Check("linker (ld)", True, f"{ld}: {_first_line([ld, '--version'])}", required=True)


def _cxx() -> Check:
    from .emulator import build

    try:
        cxx = build.cxx_compiler()
    except build.ToolchainError as e:
        return Check("C++ compiler (CUDA emulator)", False, "none found", str(e))
    return Check("C++ compiler (CUDA emulator)", True, f"{cxx}: {_first_line([cxx, '--version'])}")


def _nvrtc() -> Check:
    from .cuda import nvrtc

    if not nvrtc.available():
        return Check("NVRTC", False, "libnvrtc not found",
                     "pip install 'jaxtile[cuda]' (the nvidia-cuda-nvrtc wheel) or install "
                     "the CUDA toolkit; without NVRTC or nvcc CUDA kernels cannot compile")
    version = ".".join(map(str, nvrtc.version() or ()))
    return Check("NVRTC", True, f"{version} at {nvrtc.library_path()}")


def _nvcc() -> Check:
    from .cuda import fingerprint, toolchain

    nvcc = toolchain.nvcc_path()
    chosen = fingerprint.choose_compiler()
    if nvcc is None:
        return Check("nvcc", False, f"not found; CUDA kernels compile with {chosen}",
                     "install the CUDA toolkit or set $NVCC / $CUDA_HOME for ptxas reports "
                     "(Lowered.ptxas) and as a fallback compiler")
    version = _first_line([nvcc, "--version"], last=True)
    return Check("nvcc", True, f"{nvcc}: {version}; CUDA kernels compile with {chosen}")


def _amd() -> Check:
    from .hip import toolchain as hip_toolchain

    clang = hip_toolchain.clang_path()
    note = "; hip:* targets lower and compile, and run on ROCm (jaxtile[rocm])"
    if clang is None:
        return Check("AMD toolchain (clang)", False, "no clang >= 17 for AMD GPUs" + note,
                     hip_toolchain.INSTALL_HINT)
    return Check("AMD toolchain (clang)", True, f"{clang}: {hip_toolchain.identity()}" + note)


def _hip_runtime() -> Check:
    # Asks the ROCm handler's own loader (ffi/rocm/runtime.cc), as the first launch would.
    from jaxtile import _ffi

    why = _ffi.rocm_runtime_error()
    if not why:
        return Check("AMD HIP runtime", True, "libamdhip64 loads: the ROCm handler can run "
                     "kernels (with JAX's ROCm plugin, jaxtile[rocm])")
    return Check("AMD HIP runtime", False, why,
                 "on a machine with an AMD GPU install ROCm 7 and pip install "
                 "'jaxtile[rocm]'; elsewhere kernels run on the CPU")


def _gpu_driver() -> Check:
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        line = _first_line([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"])
        return Check("NVIDIA GPU driver", True, line)
    lib = ctypes.util.find_library("cuda")
    if lib is not None:
        return Check("NVIDIA GPU driver", True, f"{lib} (nvidia-smi not on PATH)")
    return Check("NVIDIA GPU driver", False, "no libcuda and no nvidia-smi",
                 "kernels run on the CPU (or CUDA code in the emulator: "
                 "jt.set_backend('cuda-emulator')); install the NVIDIA driver to run on a GPU")


def _jax() -> Check:
    plugins = sorted(ep.name for ep in importlib.metadata.entry_points(group="jax_plugins"))
    detail = (f"jax {_dist('jax')}, jaxlib {_dist('jaxlib')}; plugins: "
              f"{', '.join(plugins) or 'none'}")
    if not plugins:
        return Check("JAX and its plugins", False, detail,
                     "for NVIDIA GPUs: pip install 'jax[cuda12]' (or cuda13)")
    return Check("JAX and its plugins", True, detail)


def _cache() -> Check:
    root = cache.cache_dir()
    if not root.exists():
        return Check("kernel cache", True, f"{root} (not created yet)")
    if not root.is_dir():
        return Check("kernel cache", False, f"{root} is not a directory",
                     "set JAXTILE_CACHE_DIR to a directory (kernels otherwise recompile in "
                     "every process)")
    if not os.access(root, os.W_OK):
        return Check("kernel cache", False, f"{root} is not writable",
                     "set JAXTILE_CACHE_DIR to a writable directory (kernels otherwise "
                     "recompile in every process)")
    found = cache_admin.entries(root)
    bad = sum(1 for e in found if e.problem)
    size = sum(e.size for e in found)
    detail = f"{root}: {len(found)} entries, {size / 2**20:.1f} MiB, {bad} damaged"
    if bad:
        return Check("kernel cache", False, detail,
                     "damaged entries are rebuilt on use; `jaxtile cache verify` lists them")
    return Check("kernel cache", True, detail)


CHECKS: tuple[Callable[[], Check], ...] = (
    _cpu_backend, _cpu_isa, _bf16_gemm, _linker, _cxx, _nvrtc, _nvcc, _amd, _hip_runtime,
    _gpu_driver, _jax, _cache)


def run() -> list[Check]:
    """Every check, in the order above."""
    return [check() for check in CHECKS]
