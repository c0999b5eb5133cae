"""nvcc: compiling CUDA text written against jaxtile/device.h into a cubin, with ptxas' report.

No GPU or driver is needed: nvcc only compiles. The register / spill / shared-memory figures
of ``-Xptxas -v`` are parsed per kernel, for tests and benchmarks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..emulator.build import DEVICE_INCLUDE, ToolchainError

# Architectures the device header targets; sm_90a enables the sm_90 architecture-specific
# instructions (wgmma, setmaxnreg) next to everything sm_80 has.
ARCHS = ("sm_80", "sm_90a")


@dataclass(frozen=True)
class PtxasReport:
    """ptxas' resource usage of one kernel."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    shared_bytes: int


@dataclass(frozen=True)
class Cubin:
    """A compiled cubin, the per-kernel ptxas reports (by kernel name) and the PTX the
    cubin was assembled from."""

    arch: str
    data: bytes
    kernels: dict[str, PtxasReport]
    log: str
    ptx: bytes = b""


def nvcc_path() -> str | None:
    """The nvcc to use: ``$NVCC``, then PATH, then ``$CUDA_HOME/bin``; None if there is none."""
    if os.environ.get("NVCC") and shutil.which(os.environ["NVCC"]):
        return shutil.which(os.environ["NVCC"])
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return None


_FUNC = re.compile(r"Function properties for (\S+)")
_USED = re.compile(r"Used (\d+) registers")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> dict[str, PtxasReport]:
    """Per-kernel figures from ``-Xptxas -v`` output."""
    reports: dict[str, PtxasReport] = {}
    name = None
    frame = (0, 0, 0)
    for line in log.splitlines():
        if m := _FUNC.search(line):
            name = m.group(1)
            frame = (0, 0, 0)
        elif m := _FRAME.search(line):
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif name and (m := _USED.search(line)):
            smem = _SMEM.search(line)
            reports[name] = PtxasReport(
                registers=int(m.group(1)),
                spill_stores=frame[1],
                spill_loads=frame[2],
                stack_frame=frame[0],
                shared_bytes=int(smem.group(1)) if smem else 0,
            )
            name = None
    return reports


def compile_cubin(source: str, arch: str = "sm_80", *, file: str = "kernel.cu") -> Cubin:
    """Compile `source` with ``nvcc -cubin -arch=<arch> -Xptxas -v`` against the device header.

    Raises ToolchainError when nvcc is missing or rejects the source (with its messages).
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise ToolchainError(
            "nvcc was not found (tried $NVCC, PATH, $CUDA_HOME/bin): install the CUDA toolkit "
            "to compile CUDA kernels"
        )
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / file
        src.write_text(source)
        out = Path(tmp) / "kernel.cubin"
        # --keep leaves the PTX (<stem>.ptx) in the folder, at no extra cost.
        cmd = [nvcc, "-cubin", f"-arch={arch}", "-std=c++17", "-O3", "-Xptxas", "-v",
               f"-I{DEVICE_INCLUDE}", "--keep", "--keep-dir", tmp, "-o", str(out), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise ToolchainError(f"nvcc -arch={arch} failed on '{file}':\n{log.strip()}")
        ptx = src.with_suffix(".ptx")
        return Cubin(arch, out.read_bytes(), parse_ptxas(log), log,
                     ptx.read_bytes() if ptx.exists() else b"")
