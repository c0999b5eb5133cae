"""The training examples run at a small size, succeed, and would fail on a mismatch."""

import importlib
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@pytest.mark.parametrize("script, framework", [("flax_train.py", "flax"),
                                               ("equinox_train.py", "equinox")])
def test_example_trains_and_matches_jnp(script, framework):
    pytest.importorskip("optax")
    pytest.importorskip(framework)
    # The child inherits the test session's JAXTILE_CACHE_DIR (see conftest.py).
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--small",
                           "--steps", "10"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("OK: losses decreased"), proc.stdout
    assert sum(line.startswith(f"{framework}: ") for line in lines) == 1 + 10 + 1


@pytest.mark.parametrize("ours, status", [
    ([2.0, 1.5, 1.0], 0),
    ([2.0, 1.5, 1.001], 1),        # off by 1e-3 at the last step
    ([2.0, 2.5, 3.0], 1),          # matches, but the loss rose
])
def test_compare_decides_the_exit_status(capsys, monkeypatch, ours, status):
    monkeypatch.syspath_prepend(EXAMPLES)
    tb = importlib.import_module("_transformer")
    theirs = [2.0, 2.5, 3.0] if ours[-1] == 3.0 else [2.0, 1.5, 1.0]
    seconds = [1.0, 0.01, 0.01]
    assert tb.compare("x", {"jaxtile": (ours, seconds), "jnp": (theirs, seconds)}, 1e-4) == status
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("OK:" if status == 0 else "FAILED:")
