"""An exported artifact run where jaxtile was never imported: the error users see, and the
documentation of that error (README, ``jaxtile.export``) telling them to ``import jaxtile``."""

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp

import jaxtile as jt
import jaxtile.export

MESSAGE = "No FFI handler registered for jaxtile_cpu_exported_call"
README = pathlib.Path(__file__).resolve().parents[2] / "README.md"

# Deserialises the artifact at argv[1] and calls it; with argv[2] == "import", imports
# jaxtile first. Prints the outputs' sum or the error.
_RUNNER = r"""
import sys
if sys.argv[2] == "import":
    import jaxtile  # noqa: F401
import jax, numpy as np
with open(sys.argv[1], "rb") as f:
    exported = jax.export.deserialize(bytearray(f.read()))
try:
    print("sum", float(np.sum(exported.call(np.ones((4, 8), np.float32)))))
except Exception as e:
    print("error", type(e).__name__, e)
"""


def _run(path, mode):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _RUNNER, str(path), mode], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_artifact_without_import_fails_as_documented(tmp_path):
    spec = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    exported = jax.export.export(jax.jit(jt.ops.softmax), disabled_checks=jt.export_checks())(spec)
    path = tmp_path / "softmax.bin"
    path.write_bytes(exported.serialize())

    without = _run(path, "no-import")
    assert without.startswith("error") and MESSAGE in without, without
    with_import = _run(path, "import")
    assert with_import.split() == ["sum", "4.0"], with_import  # each softmax row sums to 1

    for doc in (README.read_text(), jaxtile.export.__doc__):
        flat = " ".join(doc.split())
        assert MESSAGE in flat
        at = flat.index(MESSAGE)
        assert "import jaxtile" in flat[at - 400:at + 200]
