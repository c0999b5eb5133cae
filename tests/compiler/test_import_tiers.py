"""Imports go down the tiers (docs/design.md, "Tiers"), never up or sideways.

Every import of every module of the package is read from its syntax tree, function-level and
``TYPE_CHECKING`` imports included. Tiers, top first, and what each may import besides itself:

- the user API (``jaxtile/``): anything;
- ``primitives/``: the compiler's tiers;
- the compiler's driver modules, which must know every backend: :data:`DRIVER`;
- the GPU vendors ``compiler/cuda/`` and ``compiler/hip/``: the GPU tier and the core;
- the GPU tier ``compiler/gpu/`` (and ``compiler/emulator/``, which runs its code on the
  CPU): the core; the CPU backend ``compiler/cpu/`` beside it: the core;
- the core (every other module of ``compiler/``: IR, parser, printer, target, the
  target-neutral ``passes/`` and ``analysis/``...): the core alone.

The C++ extension ``jaxtile._ffi`` is below them all.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = {"jaxtile": "jaxtile", "primitives": "jaxtile.primitives",
            "compiler": "jaxtile.compiler"}
"""Source folder -> the package it installs as (pyproject.toml's wheel.packages)."""
EXTENSIONS = frozenset({"jaxtile._ffi"})
"""Modules built from C++ (``ffi/``), which have no Python source to find."""

DRIVER = frozenset(f"jaxtile.compiler{m}" for m in
                   ("", ".build", ".pipelines", ".operations_doc", ".doctor"))
"""The top of the compiler: the package itself (it registers the backends' answers to the
core's questions), the build entry point, the per-target pass lists, the generated
operations table and the environment report."""

_BELOW = {"core": set(), "cpu": {"core"}, "gpu": {"core"}, "cuda": {"gpu", "core"},
          "hip": {"gpu", "core"}, "driver": {"cuda", "hip", "gpu", "cpu", "core"}}
_BELOW["primitives"] = {"driver", *_BELOW["driver"]}
_BELOW["api"] = {"primitives", *_BELOW["primitives"]}
MAY_IMPORT = {tier: {tier, "ffi", *below} for tier, below in _BELOW.items()}


def tier(module: str) -> str:
    """The tier of a module of the package, by its dotted name."""
    parts = module.split(".")
    if parts[:2] == ["jaxtile", "_ffi"]:
        return "ffi"
    if parts[:2] == ["jaxtile", "primitives"]:
        return "primitives"
    if parts[:2] != ["jaxtile", "compiler"]:
        return "api"
    if module in DRIVER:
        return "driver"
    folder = parts[2] if len(parts) > 2 else ""
    return {"gpu": "gpu", "emulator": "gpu", "cuda": "cuda", "hip": "hip",
            "cpu": "cpu"}.get(folder, "core")


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = [package, *path.relative_to(root / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(root: Path) -> list[tuple[Path, int, str, str]]:
    """(file, line, importing module, imported module) for every import of the package's
    own modules under ``root``."""
    modules = _modules(root)
    known = set(modules) | EXTENSIONS
    edges = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name``
                # the module mod.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                           for a in node.names]
            else:
                continue
            edges += [(path, node.lineno, name, t) for t in dict.fromkeys(targets)
                      if t.split(".")[0] == "jaxtile"]
    return edges


def violations(root: Path) -> list[str]:
    """``file:line: <tier> imports <module> (<tier>)`` for each import that runs up or
    sideways."""
    return [f"{path.relative_to(root)}:{line}: {tier(src)} imports {dst} ({tier(dst)})"
            for path, line, src, dst in imports(root)
            if tier(dst) not in MAY_IMPORT[tier(src)]]


def test_imports_only_go_down():
    edges = {(src, dst) for _, _, src, dst in imports(ROOT)}
    # The walk sees the package: a known import down, from a vendor to the GPU tier.
    assert ("jaxtile.compiler.cuda.compile", "jaxtile.compiler.gpu.codegen.lower") in edges
    found = violations(ROOT)
    assert not found, "imports that run up or sideways:\n" + "\n".join(found)


def test_an_import_up_or_sideways_is_named_with_its_file_and_line(tmp_path):
    tree = {
        "compiler/__init__.py": "from .cuda import nvrtc\n",
        "compiler/ir.py": "",
        "compiler/build.py": "from .cpu import lower\nfrom .gpu import layout\n",
        "compiler/target.py": "import jaxtile.compiler.ir\n\n\ndef f():\n"
                              "    from .cuda.nvrtc import load\n",
        "compiler/passes/__init__.py": "",
        "compiler/passes/dce.py": "from .. import build, ir\n",
        "compiler/gpu/__init__.py": "",
        "compiler/gpu/layout.py": "from .. import ir\nfrom ..cpu.lower import x\n",
        "compiler/gpu/codegen/__init__.py": "",
        "compiler/gpu/codegen/lower.py": "from ... import ir\nfrom ..layout import y\n"
                                         "from ...cuda import nvrtc\n",
        "compiler/cuda/__init__.py": "",
        "compiler/cuda/nvrtc.py": "from ..gpu import layout\nfrom ..emulator import run\n",
        "compiler/emulator/__init__.py": "from jaxtile import _ffi\n",
        "compiler/cpu/__init__.py": "",
        "compiler/cpu/lower.py": "from ..gpu.codegen import lower\nfrom jaxtile import kernel\n",
        "primitives/__init__.py": "from jaxtile.compiler import build\nfrom jaxtile import ops\n",
        "jaxtile/__init__.py": "from jaxtile.compiler.cuda import nvrtc\n",
        "jaxtile/kernel.py": "",
        "jaxtile/ops.py": "",
    }
    for name, text in tree.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert sorted(violations(tmp_path)) == [
        "compiler/cpu/lower.py:1: cpu imports jaxtile.compiler.gpu.codegen.lower (gpu)",
        "compiler/cpu/lower.py:2: cpu imports jaxtile.kernel (api)",
        "compiler/gpu/codegen/lower.py:3: gpu imports jaxtile.compiler.cuda.nvrtc (cuda)",
        "compiler/gpu/layout.py:2: gpu imports jaxtile.compiler.cpu.lower (cpu)",
        "compiler/passes/dce.py:1: core imports jaxtile.compiler.build (driver)",
        "compiler/target.py:5: core imports jaxtile.compiler.cuda.nvrtc (cuda)",
        "primitives/__init__.py:2: primitives imports jaxtile.ops (api)",
    ]
