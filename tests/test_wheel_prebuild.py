"""tools/wheel_prebuild.py assembles the package as the wheel lays it out: the mapped source
folders without what git ignores there (a developer's prebuilt entries, bytecode), the
extension beside them; imported from there, its compiler has the digest of the installed
one, so the keys of the entries it builds are the installed package's (the slow test in
``test_wheel_install.py`` builds and runs them)."""

import importlib.util
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import jaxtile
from jaxtile.compiler import build

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("wheel_prebuild",
                                               REPO / "tools" / "wheel_prebuild.py")
wheel_prebuild = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheel_prebuild)


def test_assemble_maps_the_folders_and_leaves_out_prebuilt_entries(tmp_path):
    src = tmp_path / "src"
    (src / "jaxtile").mkdir(parents=True)
    (src / "jaxtile" / "__init__.py").write_text("")
    (src / "jaxtile" / "_ffi.cpython-311-x86_64-linux-gnu.so").write_bytes(b"stale")
    (src / "compiler" / "prebuilt" / "ab").mkdir(parents=True)
    (src / "compiler" / "prebuilt" / "ab" / "abcd.so").write_bytes(b"entry")
    (src / "compiler" / "__pycache__").mkdir()
    (src / "compiler" / "__pycache__" / "build.cpython-311.pyc").write_bytes(b"")
    (src / "compiler" / "build.py").write_text("# the compiler\n")
    (src / "compiler" / "cpu").mkdir()
    (src / "compiler" / "cpu" / "lower.py").write_text("")
    (src / "pyproject.toml").write_text(
        '[tool.scikit-build]\nwheel.packages = { "jaxtile" = "jaxtile", '
        '"jaxtile/compiler" = "compiler" }\n')
    extension = tmp_path / "_ffi.cpython-311-x86_64-linux-gnu.so"
    extension.write_bytes(b"fresh")
    package = wheel_prebuild.assemble(src, extension, tmp_path / "out")
    files = sorted(str(p.relative_to(package)) for p in package.rglob("*") if p.is_file())
    assert files == ["__init__.py", "_ffi.cpython-311-x86_64-linux-gnu.so", "compiler/build.py",
                     "compiler/cpu/lower.py"]
    assert (package / extension.name).read_bytes() == b"fresh"


def test_the_assembled_compiler_has_the_installed_digest(tmp_path):
    extension = Path(jaxtile._ffi.__file__)
    package = wheel_prebuild.assemble(REPO, extension, tmp_path / "package")
    root = str(package.parent)
    code = ("import json, sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
            "from jaxtile.compiler import build; "
            "print(json.dumps([build.__file__, build.compiler_version()]))")
    out = subprocess.run([sys.executable, "-S", "-c", code, root,
                          sysconfig.get_paths()["purelib"]], capture_output=True, text=True,
                         timeout=300, check=True)
    where, digest = json.loads(out.stdout.strip().splitlines()[-1])
    assert where.startswith(root)
    assert digest == build.compiler_version()
