"""NVRTC through ctypes: CUDA source to cubin in this process, with ptxas' report.

The library comes from the NVRTC wheel of the CUDA major version the installed JAX CUDA
plugin uses (``jaxtile[cuda13]`` with ``jax[cuda13]``, ``jaxtile[cuda12]`` with
``jax[cuda12]``; the newest where JAX has no CUDA plugin), else from a CUDA toolkit
(``$CUDA_HOME/lib64``, the loader's path). It is opened on first use
only, so that importing jaxtile never needs it. ``-Xptxas -v`` has an NVRTC spelling
(``--ptxas-options=-v``); its report lands in the program log, which
:func:`toolchain.parse_ptxas` reads like nvcc's.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

_WHEEL_DIRS = {13: "cu13/lib", 12: "cuda_nvrtc/lib"}
"""Where each CUDA major's NVRTC wheel puts the library inside the ``nvidia`` namespace
package: ``nvidia-cuda-nvrtc`` 13.x (``jaxtile[cuda13]``), ``nvidia-cuda-nvrtc-cu12``
(``jaxtile[cuda12]``)."""
DISTRIBUTIONS = {13: "nvidia-cuda-nvrtc", 12: "nvidia-cuda-nvrtc-cu12"}
EXTRAS = {13: "jaxtile[cuda13]", 12: "jaxtile[cuda12]"}


def jax_cuda_major() -> int | None:
    """The CUDA major version of the JAX CUDA plugin installed here (``jax[cuda13]`` installs
    ``jax-cuda13-plugin``, ``jax[cuda12]`` ``jax-cuda12-plugin``); None without one. Kernels
    are compiled by the NVRTC of that major: the driver JAX runs on accepts its cubins."""
    for major in sorted(_WHEEL_DIRS, reverse=True):
        try:
            importlib.metadata.version(f"jax-cuda{major}-plugin")
            return major
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


class NvrtcError(RuntimeError):
    """NVRTC rejected a program: the message holds its log."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class NvrtcResult:
    """A cubin, the PTX it was assembled from, and NVRTC's log (ptxas' report included)."""

    cubin: bytes
    ptx: bytes
    log: str


def _candidates(majors: tuple[int, ...]) -> list[str]:
    """Paths of NVRTC libraries of these CUDA majors to try, best first: the pip wheel's,
    the toolkit's, then bare sonames (the loader's path)."""
    names = [f"libnvrtc.so.{m}" for m in majors]
    found = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for m in majors:
            if (p := Path(root, _WHEEL_DIRS[m], f"libnvrtc.so.{m}")).exists():
                found.append(str(p))
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    for home in filter(None, homes):
        found += [str(p) for name in names if (p := Path(home, "lib64", name)).exists()]
    return found + names


def _open(path: str) -> ctypes.CDLL | None:
    try:
        # NVRTC dlopens its builtins library by soname, which the wheel's directory is
        # not on the loader's path for: load it first, by file, so that the name resolves.
        for builtins in sorted(Path(path).parent.glob("libnvrtc-builtins.so.*")):
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


@functools.cache
def _library() -> ctypes.CDLL | None:
    wanted = jax_cuda_major()
    majors = (wanted,) if wanted else tuple(sorted(_WHEEL_DIRS, reverse=True))
    for path in _candidates(majors):
        if (lib := _open(path)) is not None:
            return lib
    return None


def missing() -> str:
    """Why there is no NVRTC here and what to install (for messages)."""
    wanted = jax_cuda_major()
    if wanted is None:
        return "NVRTC was not found: pip install 'jaxtile[cuda]' (CUDA 13; 'jaxtile[cuda12]' " \
               "for CUDA 12)"
    return (f"NVRTC {wanted} was not found, and JAX here runs on CUDA {wanted} "
            f"(jax-cuda{wanted}-plugin): pip install '{EXTRAS[wanted]}'")


def available() -> bool:
    """Whether an NVRTC library can be loaded here."""
    return _library() is not None


def library_path() -> str | None:
    """The file of the NVRTC library in use, for messages and the toolchain fingerprint."""
    lib = _library()
    return None if lib is None else lib._name


def version() -> tuple[int, int] | None:
    """NVRTC's (major, minor) version, or None where there is no NVRTC."""
    lib = _library()
    if lib is None:
        return None
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """The architectures (``sm_XY`` as XY) this NVRTC can compile for; empty without one."""
    lib = _library()
    if lib is None:
        return ()
    n = ctypes.c_int()
    _check(lib, lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
    archs = (ctypes.c_int * n.value)()
    _check(lib, lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
    return tuple(archs)


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        raise NvrtcError(f"{what} failed: {lib.nvrtcGetErrorString(status).decode()}", "")


def compile_cubin(source: str, file: str, options: list[str]) -> NvrtcResult:
    """Compile ``source`` (named ``file`` in messages) to a cubin with NVRTC ``options``
    (which must name a real architecture, e.g. ``-arch=sm_80``).

    Raises NvrtcError (its ``log`` holds NVRTC's messages) on a rejected program, and
    RuntimeError when there is no NVRTC.
    """
    lib = _library()
    if lib is None:
        raise RuntimeError(missing())
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), file.encode(), 0,
                                       None, None), "nvrtcCreateProgram")
    try:
        argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        status = lib.nvrtcCompileProgram(prog, len(options), argv)
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLog")
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.value.decode(errors="replace")
        if status != 0:
            raise NvrtcError(f"{lib.nvrtcGetErrorString(status).decode()}", log)
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        _check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return NvrtcResult(cubin.raw, ptx.value, log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
