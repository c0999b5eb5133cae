"""Finding 12: environment variables parse strictly, and an ignored value warns once."""

import os

import pytest
from probes import assert_ran, run_python

_REPORT = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import os
    import jaxtile as jt
    from jaxtile import _ffi
    from jaxtile import _config
    _config.get("JAXTILE_INTERPRET"), _config.get("JAXTILE_NUM_THREADS")   # read again
print("interpret", jt.interpret_by_default())
print("threads", _ffi.num_threads())
print("cpus", len(os.sched_getaffinity(0)))
for w in caught:
    print("WARNING", w.message)
"""


def _report(**env):
    proc = run_python(_REPORT, env={"JAXTILE_INTERPRET": None, "JAXTILE_NUM_THREADS": None,
                                    **env})
    assert_ran(proc)
    lines = proc.stdout.splitlines()
    values = dict(line.split(" ", 1) for line in lines if not line.startswith("WARNING"))
    warned = [line for line in lines if line.startswith("WARNING")]
    return values, warned


@pytest.mark.parametrize("text,on", [("1", True), ("true", True), ("Yes", True), ("on", True),
                                     ("0", False), ("false", False), ("off", False),
                                     ("no", False), ("", False)])
def test_interpret_flag(text, on):
    values, warned = _report(JAXTILE_INTERPRET=text)
    assert values["interpret"] == str(on)
    assert warned == []


def test_invalid_interpret_flag_warns_once_and_is_off():
    values, warned = _report(JAXTILE_INTERPRET="maybe")
    assert values["interpret"] == "False"
    assert len(warned) == 1 and "JAXTILE_INTERPRET='maybe'" in warned[0]


@pytest.mark.parametrize("text", ["0", "-1", "abc", "4 ", " 4", "2.0", "1000"])
def test_invalid_thread_counts_warn_once_and_use_the_cpus(text):
    values, warned = _report(JAXTILE_NUM_THREADS=text)
    assert values["threads"] == values["cpus"]
    assert len(warned) == 1 and f"JAXTILE_NUM_THREADS={text!r}" in warned[0], warned


def test_valid_thread_count():
    n = min(3, 4 * len(os.sched_getaffinity(0)))
    values, warned = _report(JAXTILE_NUM_THREADS=str(n))
    assert values["threads"] == str(n) and warned == []
