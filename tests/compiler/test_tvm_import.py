"""jaxtile's import of TVM (compiler/tvm_import.py) leaves the state a plain import does.

Each import runs in a fresh process, with JAX imported first as in a user's program.
"""

import json
import os
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


def _run(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != AUTOLOAD}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False, env={**environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def _state_after(import_line: str, **env: str) -> dict:
    return json.loads(_run(f"import jax\n{import_line}\n{_DUMP_STATE}", **env))


AUTOLOAD = "TVM_DEVICE_BACKEND_AUTOLOAD"


# What a plain `import tvm` does that jaxtile's import leaves out: importing tvm.s_tir and
# loading the device backends (the tests at the end of this file check that they are left
# out).
_LOAD_BACKENDS = ("import jaxtile.compiler.cpu\n"
                  "import tvm.s_tir\n"
                  "from tvm.backend._autoload_backends import _load_builtin_backends\n"
                  "_load_builtin_backends()")


@pytest.fixture(scope="module")
def states():
    return (_state_after("import tvm"), _state_after(_LOAD_BACKENDS))


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
complete = hasattr(tvm, "tirx") and hasattr(tvm, "target") and "tvm.tirx.transform" in sys.modules
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


_BACKENDS = """
import os, sys
{first}
import jaxtile.compiler.cpu
print(int("tvm.tirx.cuda" in sys.modules), int("TVM_DEVICE_BACKEND_AUTOLOAD" in os.environ))
"""


@pytest.mark.parametrize("first, env, loaded", [
    ("", {}, "0"),                                         # left out, the variable restored
    ("", {AUTOLOAD: "1"}, "1"),                            # the user's setting holds
    ("import tvm", {}, "1"),                               # so does the user's own import
])
def test_device_backends_are_left_out_unless_the_user_wants_them(first, env, loaded):
    assert _run(_BACKENDS.format(first=first), **env) == f"{loaded} {int(bool(env))}"


def test_a_cpu_kernel_compiles_and_runs_without_the_device_backends(tmp_path):
    code = textwrap.dedent("""
        import sys
        import jax.numpy as jnp, numpy as np
        import jaxtile as jt

        @jt.kernel
        def double(x):
            out = jt.empty(x.shape, x.dtype)
            i = jt.grid(jt.cdiv(x.shape[0], 8))
            t = jt.fragment((8,), x.dtype)
            jt.copy(x.at[i * 8], t)
            t[...] = t[...] * 2
            jt.copy(t, out.at[i * 8])
            return out

        x = jnp.arange(21, dtype=jnp.float32)
        np.testing.assert_array_equal(np.asarray(double(x)), 2 * np.arange(21))
        print(int("tvm" in sys.modules), int("tvm.tirx.cuda" in sys.modules))
    """)
    assert _run("import jax\n" + code, JAXTILE_CACHE_DIR=str(tmp_path)) == "1 0"


def test_disco_is_importable_without_the_device_backends():
    # TVM's backend loading also opens libtvm_runtime_extra, which tvm.runtime.disco needs;
    # the import opens it itself when it leaves the backends out.
    code = ("import jaxtile.compiler.cpu, sys\nimport tvm.runtime.disco\n"
            "print(int(hasattr(tvm.runtime.disco, 'Session')),"
            " int('tvm.tirx.cuda' in sys.modules))")
    assert _run(code) == "1 0"
