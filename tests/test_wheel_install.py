"""A regular (non-editable) wheel builds, installs and runs a kernel on its own, and carries
the py.typed marker."""

import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_wheel_builds_installs_and_runs(tmp_path):
    dist, target = tmp_path / "dist", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(REPO)], check=True, timeout=600)
    (wheel,) = dist.glob("jaxtile-*.whl")
    # The type-checking marker ships, so that type checkers read jaxtile's annotations.
    assert "jaxtile/py.typed" in zipfile.ZipFile(wheel).namelist()
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
