"""The CUDA backend's compilation: Tile IR or CUDA source to a launchable cubin.

:func:`compile_to_library` is the CUDA backend as ``build.py`` calls it: the GPU code
generator's source (``gpu/codegen/lower.py``) with its launch configuration, compiled.
:func:`compile_kernel` compiles ``.cu`` text written against ``jaxtile/device.h`` for a CUDA
target with NVRTC in this process (``pip install jaxtile[cuda]``) or, where NVRTC is absent,
with nvcc on PATH; both report ptxas' register, spill and shared-memory figures. A rejected
source raises a KernelError with the compiler's log and a command that reproduces it (the
source is written to a file for that). ``fingerprint.toolchain_fingerprint`` identifies the
compiler and the device header; ``target.describe()`` holds it, so it is in every content
key.
"""

from __future__ import annotations

import hashlib
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import cache, ir, sizes
from ..emulator.build import DEVICE_INCLUDE, ToolchainError
from ..errors import KernelError
from ..gpu.launch import Launch, dimension, launch_grid, tensor_map
from ..target import Target
from . import nvrtc, toolchain
from .fingerprint import choose_compiler
from .toolchain import PtxasReport

if TYPE_CHECKING:
    from ..gpu.codegen.lower import GpuKernel
    from ..gpu.tma import TensorMap

_FLAGS = ("-std=c++17", "-O3")  # nvcc's, as toolchain.compile_cubin passes them
ALIGNMENT = 16
"""Byte alignment generated CUDA code may assume of every buffer (XLA's GPU buffers are
aligned far more; 16 bytes is what 128-bit vector accesses need)."""


@dataclass(frozen=True)
class CompiledCuda:
    """A cubin ready to launch, with what ptxas reported and how it was made."""

    cubin: bytes
    ptx: bytes
    """The PTX of a cubin for a family-portable architecture (sm_80), which the driver
    compiles where the cubin cannot run (a newer GPU); empty for an architecture-specific
    one (sm_90a), whose PTX runs nowhere else either."""
    kernel_name: str
    """The kernel's (``extern "C"``) symbol in the cubin."""
    arch: str
    launch: Launch
    ptxas: PtxasReport
    compiler: str
    """``nvrtc`` or ``nvcc``."""
    log: str
    seconds: float
    """Wall time of the compilation."""

    def store(self, key: str) -> cache.Entry:
        """Put the cubin, followed by its PTX, into the build cache under ``key`` (kind
        ``cuda-cubin``)."""
        # A grid computed from the shapes is no number of blocks (Entry.launched_with sets
        # one per call, for the key).
        blocks = self.launch.num_blocks if sizes.is_static(self.launch.grid) else 1
        return cache.store(key, self.cubin + self.ptx, self.kernel_name,
                           blocks, alignment=ALIGNMENT, kind=cache.CUDA_CUBIN,
                           launch=self.launch.encode(), ptx_bytes=len(self.ptx))


def arch_of(target: Target) -> str:
    """The ``sm_XY`` a target compiles for; ``sm_XYa`` for an architecture-specific target
    (sm_90a: wgmma, setmaxnreg), whose PTX runs on that architecture only."""
    caps = target.caps
    return f"sm_{caps.sm}{'a' if caps.arch_specific else ''}"


def _repro(source: str, kernel_name: str, arch: str) -> str:
    """Write ``source`` where it stays and return the nvcc command that recompiles it."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    for folder in (cache.cache_dir() / "repro", Path(tempfile.gettempdir()) / "jaxtile-repro"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{kernel_name}-{digest}.cu"
            path.write_text(source)
            break
        except OSError:
            continue
    else:
        return "(could not write the source to a file)"
    cmd = ["nvcc", "-cubin", f"-arch={arch}", *_FLAGS, "-Xptxas", "-v", f"-I{DEVICE_INCLUDE}",
           "-o", "/dev/null", str(path)]
    return shlex.join(cmd)


def _nvrtc(source: str, file: str, arch: str) -> str | tuple[bytes, bytes, str]:
    # NVRTC optimises device code fully by default and has no -O flag.
    options = [f"-arch={arch}", "-std=c++17", "--ptxas-options=-v", f"-I{DEVICE_INCLUDE}"]
    try:
        result = nvrtc.compile_cubin(source, file, options)
    except nvrtc.NvrtcError as e:
        return f"NVRTC: {e}\n{e.log.strip()}"
    return result.cubin, result.ptx, result.log


def _nvcc(source: str, file: str, arch: str) -> str | tuple[bytes, bytes, str]:
    try:
        cubin = toolchain.compile_cubin(source, arch, file=file)
    except ToolchainError as e:
        return str(e)
    return cubin.data, cubin.ptx, cubin.log


def _generate(kernel: ir.Kernel, target: Target) -> GpuKernel:
    # The code generator is imported on the first compile: importing jaxtile imports this
    # module (the primitives use arch_of), and need not load it.
    from ..gpu.codegen.lower import generate

    return generate(kernel, target)


def source(kernel: ir.Kernel, target: Target) -> str:
    """The CUDA source of ``kernel`` (after the CUDA passes), for inspection."""
    return _generate(kernel, target).source


def compile_to_library(kernel: ir.Kernel, target: Target) -> CompiledCuda:
    """Generate ``kernel``'s CUDA code and compile it to a cubin (NVRTC, else nvcc) with its
    launch configuration: one block per grid block, the buffers passed in order."""
    code = _generate(kernel, target)
    grid = code.num_blocks or launch_grid(code.grid_size, code.size_params)
    launch = Launch((grid, 1, 1), (code.threads, 1, 1), code.shared_bytes,
                    tuple(f"b{i}" for i in range(len(code.params))) +
                    tuple(dimension(i, d) for _, i, d in code.size_params) +
                    tuple(_tensor_map(kernel, code, m) for m in code.tensor_maps))
    return compile_kernel(code.source, code.symbol, target, launch, file=f"{kernel.name}.cu")


def _tensor_map(kernel: ir.Kernel, code: GpuKernel, m: TensorMap) -> str:
    """The launch parameter of tensor map ``m``: its buffer's static shape (TMA copies only
    static shapes, :func:`..gpu.tma.tma_box`) and element size, the box and swizzle."""
    buf = kernel.params[m.buffer]
    return tensor_map(m.buffer, np.dtype(code.params[m.buffer][1]).itemsize,
                      [int(d) for d in reversed(buf.shape)], m.box, m.swizzle)


def compile_kernel(source: str, kernel_name: str, target: Target, launch: Launch, *,
                   compiler: str | None = None, file: str | None = None) -> CompiledCuda:
    """Compile ``source`` for ``target`` and check that ``kernel_name`` fits ``launch``.

    ``compiler`` picks NVRTC or nvcc (see :data:`COMPILERS`); ``file`` names the source in
    messages (default ``<kernel_name>.cu``). Raises KernelError naming the kernel: with the
    compiler's log and a repro command when the source is rejected, or when the launch needs
    more threads or shared memory than the target has.
    """
    if target.kind != "cuda":
        raise KernelError(f"compile_kernel compiles for CUDA targets, not {target.name}")
    arch = arch_of(target)
    which = choose_compiler(compiler)
    present = nvrtc.available() if which == "nvrtc" else toolchain.nvcc_path() is not None
    if not present:
        raise KernelError(
            f"kernel '{kernel_name}': no CUDA compiler ({which} was not found): "
            f"{nvrtc.missing()}, or put nvcc on PATH")
    if which == "nvrtc" and target.caps.sm not in nvrtc.supported_archs():
        major = nvrtc.jax_cuda_major() or max(nvrtc.EXTRAS)
        raise KernelError(
            f"kernel '{kernel_name}': NVRTC {'.'.join(map(str, nvrtc.version() or ()))} cannot "
            f"compile for {arch} (it knows sm_{', sm_'.join(map(str, nvrtc.supported_archs()))}"
            f"): install a newer release, pip install --upgrade '{nvrtc.EXTRAS[major]}'")
    file = file or f"{kernel_name}.cu"
    start = time.perf_counter()
    result = (_nvrtc if which == "nvrtc" else _nvcc)(source, file, arch)
    seconds = time.perf_counter() - start
    if isinstance(result, str):
        raise KernelError(
            f"kernel '{kernel_name}': CUDA compilation for {arch} failed ({which}):\n"
            f"{result.strip()}\nTo reproduce: {_repro(source, kernel_name, arch)}")
    cubin, ptx, log = result
    if arch.endswith("a"):
        ptx = b""
    report = toolchain.parse_ptxas(log).get(kernel_name)
    if report is None:
        raise KernelError(f"kernel '{kernel_name}': the compiled {file} has no kernel of that "
                          "name (it must be declared JT_KERNEL, i.e. extern \"C\" __global__)")
    _check_fits(kernel_name, target, launch, report)
    return CompiledCuda(cubin, ptx, kernel_name, arch, launch, report, which, log, seconds)


def _check_fits(name: str, target: Target, launch: Launch, report: PtxasReport) -> None:
    caps = target.caps
    if launch.threads > caps.max_threads_per_block:
        raise KernelError(f"kernel '{name}': {launch.threads} threads per block exceed the "
                          f"{caps.max_threads_per_block} of {target.name}")
    smem = report.shared_bytes + launch.dynamic_smem
    if smem > caps.max_smem_bytes:
        raise KernelError(f"kernel '{name}': {smem} bytes of shared memory per block "
                          f"({report.shared_bytes} static + {launch.dynamic_smem} dynamic) "
                          f"exceed the {caps.max_smem_bytes} {target.name} allows")
