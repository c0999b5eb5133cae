"""The wheel build's prebuild step: ``jaxtile prebuild --library`` (the library's common calls
compiled for every x86-64 level) into the wheel's ``jaxtile/compiler/prebuilt``, so that a
regular install's first library calls compile nothing.

``CMakeLists.txt`` runs it when the wheel's files are installed into the staging folder
(``JAXTILE_WHEEL_PREBUILD``, which ``pyproject.toml`` turns off for editable installs and
for ``JAXTILE_WHEEL_PREBUILD=0``). The package is not importable yet at that point: its
Python files are copied into the wheel by scikit-build-core afterwards. So this assembles the
package as the wheel lays it out, in a temporary folder: the source folders mapped as
``wheel.packages`` maps them (read from ``pyproject.toml``) and the extension just built. A
cache key holds a digest of the compiler's files (``compiler/build.py``'s
``compiler_version``), so the entries are found only by a package with exactly these files,
and only with the TVM this build imports (pinned in ``pyproject.toml``).

The prebuild runs in a child interpreter started with ``-S`` and this interpreter's
``sys.path`` behind the assembled package: site-packages' ``.pth`` files are not run, so an
editable jaxtile of the building environment cannot be imported in place of the assembled
one (the child checks which one it imported).

    python tools/wheel_prebuild.py --source REPO --extension path/to/_ffi*.so --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

_CHILD = """
import json, sys
root, out, paths = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path[:] = [root, *paths]
import jaxtile, jaxtile.compiler
for module in (jaxtile, jaxtile.compiler):
    if not module.__file__.startswith(root):
        sys.exit(f"wheel prebuild: imported {module.__name__} from {module.__file__}, "
                 f"not from the assembled package in {root}")
from jaxtile import cli
sys.exit(cli.main(["prebuild", "--library", "--out", out]))
"""


def assemble(source: Path, extension: Path, root: Path) -> Path:
    """The package as the wheel lays it out, under ``root``; returns its folder."""
    packages = tomllib.loads((source / "pyproject.toml").read_text())[
        "tool"]["scikit-build"]["wheel"]["packages"]
    compiler = (source / packages["jaxtile/compiler"]).resolve()

    def ignore(folder: str, names: list[str]) -> set[str]:
        # Entries a developer's own `jaxtile prebuild --library` left in the source tree are
        # not the wheel's (git ignores them, so the wheel does not ship them either).
        skip = {n for n in names if n == "__pycache__" or n.endswith((".pyc", ".so"))}
        if Path(folder).resolve() == compiler:
            skip.add("prebuilt")
        return skip

    # Outer packages first: a mapped subpackage replaces whatever the outer folder holds.
    for package, folder in sorted(packages.items(), key=lambda item: item[0].count("/")):
        target = root / package
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source / folder, target, ignore=ignore)
    shutil.copy2(extension, root / "jaxtile" / extension.name)
    return root / "jaxtile"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="the repository root")
    parser.add_argument("--extension", type=Path, required=True,
                        help="the jaxtile._ffi extension module just built")
    parser.add_argument("--out", type=Path, required=True,
                        help="the wheel's jaxtile/compiler/prebuilt in the staging folder")
    args = parser.parse_args(argv)
    if platform.machine() not in ("x86_64", "AMD64"):
        # The prebuilt code is per x86-64 level: another architecture finds none of it.
        print(f"wheel prebuild: skipped on {platform.machine()} (the levels are x86-64's)")
        return 0
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAXTILE_PREBUILT_DIR", "JAXTILE_CPU_ISA", "JAXTILE_INTERPRET")}
    with tempfile.TemporaryDirectory(prefix="jaxtile-wheel-prebuild-") as tmp:
        root = Path(tmp) / "package"
        assemble(args.source.resolve(), args.extension.resolve(), root)
        env["JAXTILE_CACHE_DIR"] = str(Path(tmp) / "cache")
        paths = [p for p in sys.path if p]
        proc = subprocess.run([sys.executable, "-S", "-c", _CHILD, str(root),
                               str(args.out.resolve()), json.dumps(paths)], env=env,
                              check=False)
    if proc.returncode != 0:
        print(f"wheel prebuild: failed (status {proc.returncode}); set "
              "JAXTILE_WHEEL_PREBUILD=0 to build the wheel without prebuilt kernels",
              file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
