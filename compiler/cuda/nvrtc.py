"""NVRTC through ctypes: CUDA source to cubin in this process, with ptxas' report.

The library comes from the ``nvidia-cuda-nvrtc`` wheel (``pip install jaxtile[cuda]``), else
from a CUDA toolkit (``$CUDA_HOME/lib64``, the loader's path). It is opened on first use
only, so that importing jaxtile never needs it. ``-Xptxas -v`` has an NVRTC spelling
(``--ptxas-options=-v``); its report lands in the program log, which
:func:`toolchain.parse_ptxas` reads like nvcc's.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

_SONAMES = ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")


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


def _candidates() -> list[str]:
    """Paths to try, best first: the pip wheel's, the toolkit's, then bare sonames."""
    found = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13/lib", "cuda_nvrtc/lib"):
            found += [str(p) for name in _SONAMES if (p := Path(root, sub, name)).exists()]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if home := os.environ.get(var):
            found += [str(p) for name in _SONAMES if (p := Path(home, "lib64", name)).exists()]
    found += [str(p) for name in _SONAMES if (p := Path("/usr/local/cuda/lib64", name)).exists()]
    return found + list(_SONAMES)


@functools.cache
def _library() -> ctypes.CDLL | None:
    for path in _candidates():
        try:
            # NVRTC dlopens its builtins library by soname, which the wheel's directory is
            # not on the loader's path for: load it first, by file, so that the name resolves.
            for builtins in sorted(Path(path).parent.glob("libnvrtc-builtins.so.*")):
                ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    return None


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
        raise RuntimeError("NVRTC was not found: pip install 'jaxtile[cuda]'")
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
