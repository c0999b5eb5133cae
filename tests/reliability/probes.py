"""Helpers for the reliability probes: child processes for probes that could crash.

A probe that could crash the process (a segfault, an abort, an exhausted resource) runs in a
subprocess through :func:`run_python`, so that a regression fails that test instead of
killing the whole test run.
"""

import os
import subprocess
import sys
import textwrap


def run_python(script: str, *, env: dict[str, str] | None = None, timeout: float = 300,
               preamble: str = "") -> subprocess.CompletedProcess:
    """Run ``script`` (dedented) in a fresh interpreter; returns the finished process with
    text stdout/stderr. ``env`` entries are added to this process's environment, and a
    value of None removes a variable."""
    full_env = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    code = textwrap.dedent(preamble) + textwrap.dedent(script)
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def assert_ran(proc: subprocess.CompletedProcess) -> None:
    """Fail with the child's stderr unless it exited normally with status 0."""
    assert proc.returncode == 0, (
        f"the child process exited with status {proc.returncode} (negative: killed by "
        f"signal {-proc.returncode})\n--- stderr ---\n{proc.stderr[-4000:]}")
