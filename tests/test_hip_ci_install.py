""".ci/install-hip-toolchain, which CI runs before the tests: it installs clang-19 and lld-19
where either is missing, does nothing where both are there, and fails with the command that
reproduces the failure. Run here with stand-ins for apt-get and the compilers on PATH."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "install-hip-toolchain"


def _run(tmp_path, *, have=(), apt_fails=False):
    """The script with a PATH of stand-ins only: ``have`` names the compilers present;
    apt-get records its arguments (and fails if asked)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("mktemp", "tail", "rm"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    for tool in have:
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    calls = tmp_path / "apt-calls"
    (bin_dir / "apt-get").write_text(
        f'#!{shutil.which("sh")}\necho "$*" >> {calls}\necho "apt-get says: $*"\n'
        + ("exit 100\n" if apt_fails else "exit 0\n"))
    (bin_dir / "apt-get").chmod(0o755)
    proc = subprocess.run([shutil.which("bash"), str(SCRIPT)], capture_output=True, text=True,
                          env={"PATH": str(bin_dir)})
    return proc, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("have", [(), ("clang-19",), ("ld.lld-19",)])
def test_installs_what_is_missing(tmp_path, have):
    proc, calls = _run(tmp_path, have=have)
    assert proc.returncode == 0, proc.stderr
    assert calls == ["update -q", "install -y -q clang-19 lld-19"]


def test_nothing_to_do_where_both_are_there(tmp_path):
    proc, calls = _run(tmp_path, have=("clang-19", "ld.lld-19"))
    assert proc.returncode == 0 and calls == [] and proc.stdout == ""


def test_a_failed_install_says_how_to_reproduce(tmp_path):
    proc, calls = _run(tmp_path, apt_fails=True)
    assert proc.returncode == 1 and calls == ["update -q"]
    assert "apt-get says: update -q" in proc.stderr  # the log's tail
    assert "reproduce with:\n  apt-get update && apt-get install -y clang-19 lld-19" in \
        proc.stderr
