"""jaxtile's import of TVM (compiler/tvm_import.py) leaves the state a plain import does.

Each import runs in a fresh process, with JAX imported first as in a user's program.
"""

import json
import subprocess
import sys
import textwrap

import pytest

_DUMP_STATE = textwrap.dedent("""
    import json, sys
    import tvm, tvm.relax, tvm_ffi
    from tvm.ir import _ffi_api as ir_api

    def describe(value):
        if value is None or isinstance(value, str):
            return value
        return "function" if isinstance(value, tvm_ffi.Function) else str(value)

    keys = ["TScriptPrinterName", "TCallEffectKind", "TGlobalSymbol", "FLegalize",
            "FPrimalGradient", "TVectorizable"]
    ops = sorted(str(name) for name in tvm.ir.Op.list_op_names())
    attrs = {op: [describe(tvm.ir.Op.get(op).get_attr(key)) for key in keys] for op in ops}
    try:
        tvm.ir.Op.get("jaxtile.no_such_op")
        unknown_op = "found"
    except Exception as error:
        unknown_op = type(error).__name__
    disco_attr = tvm.runtime.disco is None
    import tvm.runtime.disco
    print(json.dumps({
        "ops": attrs,
        "global_funcs": sorted(tvm_ffi.registry.list_global_func_names()),
        "disco_was_none": disco_attr,
        "disco_importable": hasattr(tvm.runtime.disco, "Session"),
        "unknown_op": unknown_op,
        "tvm_modules": sorted(m for m in sys.modules if m.startswith("tvm.")
                              and not m.startswith(("tvm.relax", "tvm.runtime.disco"))),
        "shims_removed": {
            "init_ffi_api": tvm_ffi.init_ffi_api is tvm_ffi.registry.init_ffi_api
                            and tvm_ffi.registry.init_ffi_api.__module__ == "tvm_ffi.registry",
            "list_names": tvm_ffi.registry.list_global_func_names.__module__
                          == "tvm_ffi.registry",
            "get_op": isinstance(ir_api.GetOp, tvm_ffi.Function),
            "register_op_attr": isinstance(ir_api.RegisterOpAttr, tvm_ffi.Function),
        },
    }))
""")


def _state_after(import_line: str) -> dict:
    code = f"import jax\n{import_line}\n{_DUMP_STATE}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def states():
    return (_state_after("import tvm"), _state_after("import jaxtile.compiler.cpu"))


def test_same_operators_and_attributes(states):
    plain, ours = states
    assert plain["ops"].keys() == ours["ops"].keys()
    differing = {op: (plain["ops"][op], ours["ops"][op]) for op in plain["ops"]
                 if plain["ops"][op] != ours["ops"][op]}
    assert not differing
    # The printer names TVM's import registers (and the one it fails to register twice)
    # are all there.
    assert ours["ops"]["tirx.s_tir.ldg32"][0] == "s_tir.ldg32"
    assert sum(attrs[0] is not None for attrs in ours["ops"].values()) > 100


def test_same_global_functions_and_modules(states):
    plain, ours = states
    assert plain["global_funcs"] == ours["global_funcs"]
    assert len(ours["global_funcs"]) > 1000
    assert set(plain["tvm_modules"]) - set(ours["tvm_modules"]) <= {"tvm.runtime.disco"}


def test_disco_absent_then_importable_as_after_plain_import(states):
    plain, ours = states
    for state in (plain, ours):
        assert state["disco_was_none"] and state["disco_importable"]


def test_shims_are_removed_after_import(states):
    _, ours = states
    assert ours["shims_removed"] == dict.fromkeys(ours["shims_removed"], True)
    assert ours["unknown_op"] != "found"


_RACE = """
import sys, threading, time
from jaxtile.compiler import tvm_import
first = threading.Thread(target=tvm_import.import_tvm)
first.start()
while "tvm" not in sys.modules:   # the first thread's import has begun: tvm is half made
    time.sleep(0.0005)
tvm = tvm_import.import_tvm()
complete = hasattr(tvm, "tirx") and "tvm.s_tir" in sys.modules
first.join()
print("complete" if complete else "partial")
"""


def test_a_second_thread_waits_for_the_import_in_flight():
    # Builds run on compile threads: a second caller must not get the module TVM is still
    # initialising in the first (it lacks tvm.tirx then: an AttributeError in the build).
    proc = subprocess.run([sys.executable, "-c", _RACE], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "complete"
