"""clang for AMD GPUs: compiling HIP text written against jaxtile/device.h into a code object.

No ROCm install and no GPU are needed: a clang with the AMDGPU backend and lld (Debian's
``clang-19`` and ``lld-19``) compiles ``-x hip --cuda-device-only -nogpuinc -nogpulib``, so
the device header (``device_hip.h``) brings everything itself. A compile to assembly, whose
``.amdhsa_*`` directives and metadata :mod:`.resources` reads, then assembling and linking
that assembly give the code object (an ELF for the HSA runtime's module loader).

The compiler is ``$JAXTILE_HIP_CLANG`` if set, else the newest ``clang-N`` (N >= 17, the
first to know gfx942) on ``PATH``, else ``/usr/lib/llvm-N/bin/clang``.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..emulator.build import DEVICE_INCLUDE, ToolchainError, device_headers
from .resources import KernelResources, parse_assembly

ARCHS = ("gfx90a", "gfx942")
"""The offload architectures the device header targets."""

MIN_CLANG = 17
"""The oldest clang whose AMDGPU backend knows gfx942."""

INSTALL_HINT = ("install Debian's clang-19 and lld-19 (apt-get install -y clang-19 lld-19), "
                "or point $JAXTILE_HIP_CLANG at a clang >= 17 with the AMDGPU target and lld")


@dataclass(frozen=True)
class CodeObject:
    """A compiled HIP module: the code object's bytes, its assembly and each kernel's
    resource figures (by kernel name)."""

    arch: str
    data: bytes
    assembly: str
    kernels: dict[str, KernelResources]
    log: str


@functools.cache
def _major(clang: str) -> int | None:
    """The major version of ``clang`` from ``--version``, None if it does not run (asked
    once per process, not once per compile)."""
    try:
        out = subprocess.run([clang, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"clang version (\d+)\.", out)
    return int(m.group(1)) if m else None


@functools.cache
def clang_path() -> str | None:
    """The clang that compiles HIP for AMD GPUs here, or None (see the module docstring)."""
    env = os.environ.get("JAXTILE_HIP_CLANG")
    if env:
        return shutil.which(env)
    candidates = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        candidates += glob.glob(os.path.join(d, "clang-[0-9]*"))
    candidates += glob.glob("/usr/lib/llvm-[0-9]*/bin/clang")
    best: tuple[int, str] | None = None
    for path in candidates:
        m = re.search(r"(?:clang-|llvm-)(\d+)", path)
        if not m or int(m.group(1)) < MIN_CLANG or not os.access(path, os.X_OK):
            continue
        if best is None or int(m.group(1)) > best[0]:
            best = (int(m.group(1)), path)
    return best[1] if best else None


HEADERS = tuple(p.name for p in device_headers(leave_out=("device_ptx.h",)))
"""The device-header files a HIP compile may read (``jaxtile/`` in :data:`DEVICE_INCLUDE`):
all but the NVIDIA implementation, so that a header a generated kernel includes only
sometimes (``tile_gemm.h``, ``float8.h``) still changes the content key when it changes."""


@functools.cache
def header_digest() -> str:
    """sha256 of :data:`HEADERS` (names and bytes): a changed header is a new toolchain."""
    digest = hashlib.sha256()
    for name in HEADERS:
        digest.update(name.encode() + b"\0" + (DEVICE_INCLUDE / "jaxtile" / name).read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def identity() -> str:
    """What compiles HIP here, for the target's ``toolchain`` field (part of every content
    key): the first line of ``clang --version`` (``"no HIP compiler"`` where there is none:
    code can still be generated and inspected, not compiled) and the device headers'
    digest."""
    clang = clang_path()
    version = "no HIP compiler"
    if clang is not None:
        try:
            out = subprocess.run([clang, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
            version = out.splitlines()[0].strip() if out.strip() else version
        except (OSError, subprocess.TimeoutExpired):
            pass
    return f"{version}; device header {header_digest()}"


def _require_clang() -> str:
    clang = clang_path()
    if clang is None:
        raise ToolchainError(f"no clang for AMD GPUs was found: {INSTALL_HINT}")
    major = _major(clang)
    if major is None or major < MIN_CLANG:
        raise ToolchainError(f"{clang} is not a clang >= {MIN_CLANG} (found version "
                             f"{major}): {INSTALL_HINT}")
    return clang


def compile_hip(source: str, arch: str = "gfx942", *, file: str = "kernel.hip",
                defines: tuple[str, ...] = ()) -> CodeObject:
    """Compile ``source`` for ``arch`` (one of :data:`ARCHS`) against the device header.

    Raises ToolchainError when the compiler is missing or rejects the source, with its
    messages and the command that reproduces the failure.
    """
    if arch not in ARCHS:
        raise ToolchainError(f"unknown AMD architecture {arch!r}; expected one of {ARCHS}")
    clang = _require_clang()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / file
        src.write_text(source)
        asm, out = Path(tmp) / "kernel.s", Path(tmp) / "kernel.co"
        # Two steps, each one compiler process: the device compile to assembly (which
        # :mod:`.resources` reads), then assembling and linking it into the code object (an
        # ELF for the HSA runtime's loader). This is the path -save-temps takes to keep the
        # assembly, without its preprocessing and bitcode round trips: a third less CPU time
        # for attention's kernel, the same instructions.
        compile_cmd = [clang, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only",
                       "-nogpuinc", "-nogpulib", "-std=c++17", "-O3", f"-I{DEVICE_INCLUDE}",
                       *(f"-D{d}" for d in defines), "-S", "-o", str(asm), str(src)]
        link_cmd = [clang, "-x", "assembler", "-target", "amdgcn-amd-amdhsa", f"-mcpu={arch}",
                    "-o", str(out), str(asm)]
        log = ""
        for cmd in (compile_cmd, link_cmd):
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
            log += proc.stdout + proc.stderr
            if proc.returncode != 0:
                repro = " ".join(file if c == str(src) else Path(c).name if c.startswith(tmp)
                                 else c for c in cmd)
                raise ToolchainError(f"clang --offload-arch={arch} failed on '{file}':\n"
                                     f"{log.strip()}\n(reproduce with: {repro})")
        text = asm.read_text()
        return CodeObject(arch, out.read_bytes(), text, parse_assembly(text), log)
