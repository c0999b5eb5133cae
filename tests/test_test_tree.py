"""The test tree's own rule: every Python file under ``tests/`` has a basename of its own.

The folders have no ``__init__.py``, so pytest imports each test file under its basename
(rootdir import mode), and helper modules (``cuda_kernels.py``, ``ws_gemm.py``) are imported
by name from folders on ``sys.path``. A second file of the same name is refused when the whole
suite is collected ("import file mismatch"), which a run of one file or folder never shows.
"""

import collections
from pathlib import Path

TESTS = Path(__file__).parent


def test_every_file_under_tests_has_a_basename_of_its_own():
    by_name = collections.defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name not in ("conftest.py", "__init__.py") and "__pycache__" not in path.parts:
            by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
