"""Which CUDA compiler is used here and its identity, for the content key.

Light to import (no compiler is loaded until asked): ``target.py`` puts
:func:`toolchain_fingerprint` into every CUDA target's description.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import re
import subprocess

from ..emulator.build import DEVICE_INCLUDE, device_headers
from ..errors import KernelError
from . import nvrtc, toolchain

COMPILERS = ("auto", "nvrtc", "nvcc")
"""Which compiler CUDA kernels are compiled with: ``auto`` is NVRTC where it loads, else
nvcc. ``$JAXTILE_CUDA_COMPILER`` sets the default."""


def choose_compiler(compiler: str | None = None) -> str:
    """``nvrtc`` or ``nvcc``: ``compiler`` or ``$JAXTILE_CUDA_COMPILER``, ``auto`` resolved."""
    compiler = compiler or os.environ.get("JAXTILE_CUDA_COMPILER") or "auto"
    if compiler not in COMPILERS:
        raise KernelError(f"unknown CUDA compiler {compiler!r}; expected one of {COMPILERS}")
    if compiler == "auto":
        return "nvrtc" if nvrtc.available() else "nvcc"
    return compiler


@functools.cache
def header_digest() -> str:
    """sha256 of the device header (every file's path and bytes)."""
    digest = hashlib.sha256()
    for path in device_headers(DEVICE_INCLUDE):
        digest.update(path.relative_to(DEVICE_INCLUDE).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def _version(which: str) -> str:
    if which == "nvrtc":
        numbers = nvrtc.version()
        dist = "toolkit"
        if numbers and numbers[0] in nvrtc.DISTRIBUTIONS:
            try:
                dist = importlib.metadata.version(nvrtc.DISTRIBUTIONS[numbers[0]])
            except importlib.metadata.PackageNotFoundError:
                pass
        return f"{'.'.join(map(str, numbers))} ({dist})" if numbers else "none"
    nvcc = toolchain.nvcc_path()
    if nvcc is None:
        return "none"
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip()
    # The last line names the exact build, e.g. "Build cuda_13.0.r13.0/compiler.36424714_0".
    return out.splitlines()[-1] if out else "unknown"


def cuda_major(compiler: str | None = None) -> int | None:
    """The CUDA major version of the compiler that would be used (``compiler`` as for
    :func:`choose_compiler`); None where there is none. ptxas' figures are per toolkit: the
    tests' and benchmarks' budgets are looked up by it."""
    which = choose_compiler(compiler)
    if which == "nvrtc":
        numbers = nvrtc.version()
        return numbers[0] if numbers else None
    m = re.search(r"cuda_(\d+)\.", _version("nvcc"))
    return int(m.group(1)) if m else None


def toolchain_fingerprint(compiler: str | None = None) -> str:
    """The identity of what compiles CUDA here: the compiler that would be used, its
    version and the device header's digest. A change in any of them changes the content
    key, so a cached cubin is never reused across toolchains."""
    which = choose_compiler(compiler)
    return f"{which} {_version(which)}; device.h {header_digest()}"
