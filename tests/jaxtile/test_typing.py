"""Issue 19, point 20: the public API is typed, and mypy --strict says so.

mypy (pinned in the ``test`` extra, configured in ``pyproject.toml``) checks the modules that
make the public API, and ``typing_usage.py``: code written against the API whose
``assert_type`` calls fail when a public function's result degrades to ``Any`` or a parameter
stops accepting what users pass.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ["jaxtile/__init__.py", "jaxtile/language.py", "jaxtile/kernel.py",
           "jaxtile/_typing.py", "jaxtile/_stats.py", "jaxtile/autotune.py",
           "tests/jaxtile/typing_usage.py"]


def test_public_api_passes_mypy_strict():
    proc = subprocess.run([sys.executable, "-m", "mypy", *CHECKED], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert "No module named mypy" not in proc.stderr, \
        "mypy is missing: install the test extra (pip install -e '.[test]')"
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_package_is_marked_typed():
    import jaxtile

    assert (Path(jaxtile.__file__).parent / "py.typed").is_file()

