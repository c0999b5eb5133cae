"""SASS instruction counts of a cubin, through cuobjdump (and the nvdisasm it runs).

Both come from the ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels (the
``jaxtile[cuda]`` extra) or from the CUDA toolkit next to nvcc; without them the counts are
simply unavailable (None), since nothing else needs them.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from .toolchain import nvcc_path

# An instruction line: /*0a10*/  [@P0 | @!PT ...]  OPCODE[.modifiers] ...
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def _tool_dirs() -> list[Path]:
    """Where cuobjdump may be: the wheels' ``nvidia/cu*/bin``, then the toolkit's bin."""
    dirs = []
    for entry in sys.path:
        base = Path(entry) / "nvidia"
        if base.is_dir():
            dirs += sorted(base.glob("cu*/bin")) + sorted(base.glob("cuda_cuobjdump/bin"))
    nvcc = nvcc_path()
    if nvcc:
        dirs.append(Path(nvcc).resolve().parent)
    return dirs


def cuobjdump_path() -> tuple[str, list[Path]] | None:
    """cuobjdump and the directories to put on PATH for it (nvdisasm); None if missing."""
    dirs = _tool_dirs()
    for d in dirs:
        if (d / "cuobjdump").exists():
            return str(d / "cuobjdump"), dirs
    return None


def sass_counts(cubin: bytes) -> dict[str, int] | None:
    """Executed-opcode counts (predicated-off ``@!PT`` padding excluded) of every kernel in
    ``cubin``, or None when cuobjdump / nvdisasm is not installed."""
    found = cuobjdump_path()
    if found is None:
        return None
    tool, dirs = found
    env = dict(os.environ, PATH=os.pathsep.join([*map(str, dirs), os.environ.get("PATH", "")]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True,
                              env=env)
    if proc.returncode != 0:
        return None
    counts: collections.Counter[str] = collections.Counter()
    for m in _INSTR.finditer(proc.stdout):
        if m.group(1) and m.group(1).strip() == "@!PT":
            continue
        counts[m.group(2)] += 1
    return dict(counts)
