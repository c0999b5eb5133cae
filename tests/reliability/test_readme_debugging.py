"""The README's "Debugging and tuning" walkthrough works as written: its Python snippets run,
its shell commands exit 0, and what it says the tools show is what they show."""

import gzip
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE_DIR = "/tmp/jaxtile-trace"


def _section() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Debugging and tuning"):]
    return section[:section.index("\n## ", 1)]


def _python_blocks(emulator: bool) -> str:
    """The section's Python snippets in order, with or without the one that switches to the
    emulator (whose first use builds its runtime: half a minute)."""
    blocks = re.findall(r"```python\n(.*?)```", _section(), re.S)
    assert len(blocks) >= 4, blocks
    return "\n".join(b for b in blocks if emulator or "cuda-emulator" not in b)


def _run_snippets(tmp_path: Path, emulator: bool) -> subprocess.CompletedProcess:
    # From a copy of the repository root's view: examples/ is there, and the files the
    # snippets write (x_s.svg, the trace) land in tmp_path.
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    code = _python_blocks(emulator).replace(TRACE_DIR, str(tmp_path / "trace"))
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_walkthrough_snippets_run_and_show_what_the_readme_says(tmp_path):
    proc = _run_snippets(tmp_path, emulator=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "#mma(m16n8k16, warps 2x2)" in proc.stdout          # lowered_ir's layouts
    assert "shared memory" in proc.stdout                     # gpu.shared_memory
    assert "<svg" in (tmp_path / "x_s.svg").read_text()
    # Logging at DEBUG and jt.stats() report the kernel's build.
    assert re.search(r"jaxtile:(compil|cache hit).*linear_act", proc.stderr), proc.stderr
    assert re.search(r"KernelStats\(compiles=\d+", proc.stdout), proc.stdout
    # The trace holds the range under the name the README shows.
    shown = re.search(r"`(linear_act_bf16_[\w]+?)_\.\.\.`", _section()).group(1)
    readable = re.search(r"`(linear_act\(bf16\[256,96\][^`]*)`", _section()).group(1)
    trace, = (tmp_path / "trace").rglob("*.trace.json.gz")
    names = {e.get("name", "") for e in json.loads(gzip.decompress(trace.read_bytes()))
             ["traceEvents"]}
    assert any(n.startswith(shown) for n in names), sorted(names)
    assert any(n.startswith(re.sub(r"[^\w.-]", "_", readable)) for n in names), readable


def _commands() -> list[list[str]]:
    block = re.search(r"\*\*The same from a shell\*\*.*?```\n(.*?)```", _section(), re.S)
    lines = block.group(1).replace("\\\n", " ").splitlines()
    commands = [shlex.split(line) for line in lines if line.strip()]
    assert all(c[0] == "jaxtile" for c in commands), commands
    return commands


@pytest.mark.slow
@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(c[:2]))
def test_the_walkthrough_commands_exit_0(command):
    proc = subprocess.run([sys.executable, "-m", "jaxtile", *command[1:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_the_walkthrough_runs_on_the_emulator_too(tmp_path):
    proc = _run_snippets(tmp_path, emulator=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Built for CUDA and run emulated (or found in the cache, built so earlier).
    assert re.search(r"linear_act (for|on) cuda:sm_80", proc.stderr), proc.stderr
