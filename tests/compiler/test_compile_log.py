"""Long work says so: a progress line on a terminal's stderr, none on a pipe."""

import io
import logging
import os
import pty
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import cache, compile_log
from jaxtile.compiler.emulator import build as emulator_build

# The module is loaded from its file: importing the package would import JAX (seconds).
_SLOW_STEP = textwrap.dedent(f"""
    import importlib.util, sys, time
    spec = importlib.util.spec_from_file_location("compile_log", {compile_log.__file__!r})
    compile_log = sys.modules["compile_log"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compile_log)
    with compile_log.progress("slow step", after=0.2):
        time.sleep(0.6)
    with compile_log.progress("quick step", after=5):
        pass
    print("finished", flush=True)
""")


def _run_with_stderr(stderr_fd: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _SLOW_STEP], stdout=subprocess.PIPE,
                          stderr=stderr_fd, timeout=120)


def test_progress_line_on_a_terminal():
    controller, terminal = pty.openpty()
    try:
        proc = _run_with_stderr(terminal)
        os.close(terminal)
        terminal = -1
        seen = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # Linux: EIO once the terminal's last writer is gone
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if terminal >= 0:
            os.close(terminal)
        os.close(controller)
    assert proc.returncode == 0 and proc.stdout == b"finished\n"
    text = seen.decode()
    assert text.startswith("jaxtile: slow step... done (") and text.rstrip().endswith(" s)")
    assert "quick step" not in text


def test_no_progress_line_on_a_pipe():
    proc = _run_with_stderr(subprocess.PIPE)
    assert proc.returncode == 0 and proc.stdout == b"finished\n"
    assert b"slow step" not in proc.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    cache.clear_memory()
    yield tmp_path
    cache.clear_memory()


def _terminal(monkeypatch) -> _Terminal:
    # Set in the test's body: pytest's own capture replaces sys.stderr between phases.
    stream = _Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def test_a_long_compile_shows_progress(fresh_cache, monkeypatch):
    # Every compile counts as long, so the tiny kernel shows the line.
    monkeypatch.setattr(compile_log, "PROGRESS_AFTER", 0.0)

    @jt.kernel
    def progress_double(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] + x[...]
        return out

    terminal = _terminal(monkeypatch)
    x = jnp.arange(4, dtype=jnp.float32)
    np.testing.assert_allclose(progress_double(x), np.arange(4) * 2.0)
    assert terminal.getvalue().startswith("jaxtile: compiling progress_double for cpu... done (")


def test_emulator_runtime_build_shows_progress(fresh_cache, monkeypatch, caplog):
    def fake_compiler(cmd, what):
        out = cmd[cmd.index("-o") + 1]
        with open(out, "wb") as f:
            f.write(b"not a real library")

    monkeypatch.setattr(emulator_build, "_run", fake_compiler)
    terminal = _terminal(monkeypatch)
    caplog.set_level(logging.INFO, logger="jaxtile")
    path = emulator_build.runtime_library()
    assert [r.getMessage() for r in caplog.records] == [
        f"building the CUDA emulator runtime {path}"]
    assert path.exists() and path.is_relative_to(fresh_cache)
    assert terminal.getvalue().startswith(
        "jaxtile: building the CUDA emulator's runtime (once)... done (")


def test_a_failed_step_says_so(monkeypatch):
    terminal = _terminal(monkeypatch)
    with pytest.raises(RuntimeError), compile_log.progress("doomed step", after=0):
        raise RuntimeError("compiler crashed")
    assert terminal.getvalue().startswith("jaxtile: doomed step... failed (")
