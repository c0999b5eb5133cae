"""SASS instruction counts of a cubin, through ``cuobjdump -sass``.

cuobjdump comes from the ``nvidia-cuda-cuobjdump`` wheel (``pip install jaxtile[cuda]``), or
sits next to nvcc in a full CUDA toolkit; it disassembles through nvdisasm, which it looks for
beside itself (the ``nvidia-cuda-nvdisasm`` wheel puts both in one folder). Tests and
benchmarks use the counts to check that a kernel really uses the instructions it was written
for (HMMA, LDSM, LDGSTS).
"""

from __future__ import annotations

import collections
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .toolchain import nvcc_path

# A SASS line: /*0080*/  @!P0 HMMA.16816.F32 R4, R8, R12, R4 ;
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def cuobjdump_path() -> str | None:
    """The cuobjdump to use, with an nvdisasm beside it or on PATH: the pip wheels', then
    the one next to nvcc, then PATH's; None if there is none."""
    folders = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        folders.append(Path(root, "cu13", "bin"))
    if nvcc := nvcc_path():
        folders.append(Path(nvcc).resolve().parent)
    if found := shutil.which("cuobjdump"):
        folders.append(Path(found).parent)
    for folder in folders:
        tool = folder / "cuobjdump"
        disassembler = (folder / "nvdisasm").exists() or shutil.which("nvdisasm")
        if tool.exists() and os.access(tool, os.X_OK) and disassembler:
            return str(tool)
    return None


def disassemble(cubin: bytes) -> str:
    """``cuobjdump -sass`` of a cubin; RuntimeError when cuobjdump is absent or fails."""
    tool = cuobjdump_path()
    if tool is None:
        raise RuntimeError("cuobjdump was not found: pip install 'jaxtile[cuda]' (the "
                           "nvidia-cuda-cuobjdump and -nvdisasm wheels) or install the CUDA "
                           "toolkit")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "kernel.cubin")
        path.write_bytes(cubin)
        folder = str(Path(tool).parent)
        env = {**os.environ, "NVDISASM_PATH": folder,
               "PATH": folder + os.pathsep + os.environ.get("PATH", "")}
        proc = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True,
                              env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def sass_counts(cubin: bytes) -> dict[str, int]:
    """How often each SASS opcode (without its modifiers: ``HMMA``, ``LDSM``) occurs."""
    counts = collections.Counter(m.group(1) for m in _INSTRUCTION.finditer(disassemble(cubin)))
    return dict(counts)
