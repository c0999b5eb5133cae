"""A regular (non-editable) wheel builds, installs and runs a kernel on its own, and carries
the py.typed marker; built with its prebuild step (the default), it carries the library's
kernels prebuilt for every x86-64 level, and a fresh install's first library calls load them
and compile nothing (slow)."""

import json
import os
import platform
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PREBUILT = "jaxtile/compiler/prebuilt/"


def _build_wheel(dist: Path, *, prebuild: bool) -> Path:
    """The wheel of this checkout, built offline with this environment's packages (pip's
    ``--no-build-isolation``), with or without the prebuild step (``JAXTILE_WHEEL_PREBUILD``)."""
    env = {k: v for k, v in os.environ.items() if k != "JAXTILE_WHEEL_PREBUILD"}
    if not prebuild:
        env["JAXTILE_WHEEL_PREBUILD"] = "0"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(REPO)], check=True, timeout=1800, env=env)
    (wheel,) = dist.glob("jaxtile-*.whl")
    return wheel


def test_wheel_builds_installs_and_runs(tmp_path):
    dist, target = tmp_path / "dist", tmp_path / "site"
    # Without the prebuild step (the default test run must stay fast; the slow test below
    # builds with it): the switch is honoured, no prebuilt entry ships.
    wheel = _build_wheel(dist, prebuild=False)
    names = zipfile.ZipFile(wheel).namelist()
    # The type-checking marker ships, so that type checkers read jaxtile's annotations.
    assert "jaxtile/py.typed" in names
    assert not [n for n in names if n.startswith(PREBUILT)]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, timeout=300)
    # -S skips site-packages' .pth files, so the editable install cannot shadow the wheel;
    # the dependencies still come from this environment's site-packages.
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(target)!r}, {sysconfig.get_paths()["purelib"]!r}]
        import jax.numpy as jnp, numpy as np, jaxtile as jt
        assert jt.__file__.startswith({str(target)!r}), jt.__file__
        assert jt._ffi.__file__.startswith({str(target)!r}), jt._ffi.__file__
        x = jnp.arange(100, dtype=jnp.float32)
        np.testing.assert_array_equal(jt.ops.add(x, x, block=32), np.asarray(x) * 2)
        lines = open(__file__).read().splitlines()
        line = next(n for n, text in enumerate(lines, 1) if text.startswith("    jt.ops.add"))
        try:
            jt.ops.add(x)  # a bad call: the error names this script's line
        except jt.KernelError as e:
            assert f"{{__file__}}:{{line}}" in str(e), str(e)
        else:
            raise AssertionError("no KernelError")
        print("wheel ok")
    """)
    env = {**os.environ, "JAXTILE_CACHE_DIR": str(tmp_path / "cache")}
    run = tmp_path / "run.py"
    run.write_text(script)
    out = subprocess.run([sys.executable, "-S", str(run)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "wheel ok" in out.stdout


# The first calls of a fresh install: the library's shapes (softmax and the norms on row
# counts never prebuilt: they are dynamic in rows), each against an independent jnp formula.
_FIRST_CALLS = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
import jaxtile as jt
from jaxtile.compiler import cache

assert jt.__file__.startswith(sys.argv[1]), jt.__file__
k = jax.random.split(jax.random.key(0), 8)
f32, bf16 = jnp.float32, jnp.bfloat16
hi = jax.lax.Precision.HIGHEST

def softmax(x):
    x = x.astype(f32)
    e = jnp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)

x = jax.random.normal(k[0], (300, 1000), f32) * 4
np.testing.assert_allclose(jt.ops.softmax(x), softmax(x), rtol=1e-5, atol=1e-7)
xb = (jax.random.normal(k[1], (37, 2048), f32) * 4).astype(bf16)
np.testing.assert_allclose(np.asarray(jt.ops.softmax(xb), np.float32),
                           np.asarray(softmax(xb).astype(bf16), np.float32), rtol=1e-2,
                           atol=1e-3)
a, b = jax.random.normal(k[2], (1 << 16,), f32), jax.random.normal(k[3], (1 << 16,), f32)
np.testing.assert_array_equal(jt.ops.add(a, b), np.asarray(a) + np.asarray(b))
p, q = jax.random.normal(k[4], (256, 256), f32), jax.random.normal(k[5], (256, 256), f32)
np.testing.assert_allclose(jt.ops.matmul(p, q), jnp.matmul(p, q, precision=hi), rtol=1e-4,
                           atol=1e-4)
np.testing.assert_allclose(jt.ops.matmul_relu(p, q),
                           jnp.maximum(jnp.matmul(p, q, precision=hi), 0), rtol=1e-4,
                           atol=1e-4)
x, w = jax.random.normal(k[6], (77, 1024), f32), jax.random.normal(k[7], (1024,), f32)
rms = x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w
np.testing.assert_allclose(jt.ops.rms_norm(x, w), rms, rtol=1e-5, atol=1e-5)
print(json.dumps({"stats": cache.stats(), "tvm": "tvm" in sys.modules}))
"""


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the wheel's prebuilt kernels are per x86-64 level")
def test_wheel_ships_prebuilt_library_kernels(tmp_path):
    """The wheel built with its prebuild step, installed into a fresh virtual environment
    (offline: no index, the dependencies from this environment), in a fresh process with an
    empty cache and no ``$JAXTILE_PREBUILT_DIR``: the first library calls load the shipped
    entries (``cache.stats``: prebuilt hits, nothing stored, no miss), never import TVM, and
    give the values of their jnp formulas."""
    wheel = _build_wheel(tmp_path / "dist", prebuild=True)
    names = zipfile.ZipFile(wheel).namelist()
    libraries = {n.removesuffix(".so") for n in names if n.startswith(PREBUILT)
                 and n.endswith(".so")}
    records = {n.removesuffix(".json") for n in names if n.startswith(PREBUILT)
               and n.endswith(".json")}
    assert libraries and libraries == records
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=300)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"], check=True,
                               capture_output=True, text=True).stdout.strip())
    # The dependencies: this environment's site-packages as a plain path (a folder named in
    # a .pth file does not have its own .pth files run, so the editable jaxtile stays out).
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAXTILE_PREBUILT_DIR", "JAXTILE_CPU_ISA", "JAXTILE_INTERPRET")}
    env["JAXTILE_CACHE_DIR"] = str(tmp_path / "cache")
    run = tmp_path / "first_calls.py"
    run.write_text(_FIRST_CALLS)
    out = subprocess.run([str(python), str(run), str(site)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    stats = result["stats"]
    assert stats["stored"] == 0 and stats["misses"] == 0, stats
    assert stats["prebuilt_hits"] >= 6, stats
    assert not result["tvm"]
    assert not list((tmp_path / "cache").rglob("*.so"))
