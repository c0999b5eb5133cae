"""Recording stand-ins for the GPU vendors' libraries (``cuda/fake_libcuda.c``,
``rocm/fake_libamdhip64.c``): build one, run a handler's scenarios against it in a fresh
process, and read back what each scenario asked of it.

A scenario script takes the scenarios as JSON in ``argv[1]``, writes ``== <name>`` into the
stand-in's log before each (the stand-in then appends one line per call) and prints the
outcomes as JSON on its last line. (Importable from ``tests/ffi/*/`` because
``tests/ffi/conftest.py`` puts this directory on ``sys.path``, as pytest does for a conftest.)"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
C_COMPILER = shutil.which("cc") or shutil.which("gcc") or shutil.which("g++")
needs_c_compiler = pytest.mark.skipif(C_COMPILER is None,
                                      reason="no C compiler to build the stand-in library")


def build(source: Path, library: Path) -> Path:
    """``source`` compiled into the shared library ``library`` (``fake_driver_log.h``, what
    the stand-ins share, from this directory)."""
    subprocess.run([C_COMPILER, "-shared", "-fPIC", "-O1", f"-I{HERE}", "-o", str(library),
                    str(source)], check=True, capture_output=True)
    return library


def run(script: str, cases: list, env: dict[str, str],
        log: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """``(outcomes, calls)``: runs ``script`` on ``cases`` with the environment ``env``;
    ``calls`` maps each scenario to the lines the stand-in logged to ``log`` during it."""
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    calls: dict[str, list[str]] = {}
    name = None
    for line in log.read_text().splitlines() if log.exists() else ():
        if line.startswith("== "):
            name = line[3:]
            calls[name] = []
        else:
            calls.setdefault(name, []).append(line)
    return results, calls
