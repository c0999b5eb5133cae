"""The docs: what the checksums protect against (finding 15); and (issue 19, point 18) that
the docs and code stand alone (nothing points outside the repository), their links and file
names resolve, and they list what exists (library kernels, targets, pass order)."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_readme_says_checksums_catch_damage_not_forgery():
    readme = (ROOT / "README.md").read_text()
    cache = readme[readme.index("## Compiled kernels and the cache"):]
    cache = cache[:cache.index("\n## ", 1)]
    assert "damage, not forgery" in cache
    assert "native code" in cache


def test_design_states_the_integrity_model():
    design = (ROOT / "docs" / "design.md").read_text()
    section = design[design.index("## Build cache"):]
    section = section[:section.index("\n## ", 1)]
    assert "**Integrity model.**" in section
    for words in ("damage, not forgery", "payload", "trusted", "rebuilt"):
        assert words in section, words


# ---- Issue 19, point 18: the docs stand alone, resolve, and list what exists ----

# Spelled in pieces so that this file does not match its own patterns.
_OUTSIDE = re.compile("|".join([
    re.escape("../" + "shared"),                    # the design notes next to the repository
    r"(?<![\w.])/" + "work/",                       # absolute paths of the machine it was built on
    r"\b(?:DESIGN|GPU)" + r"\.md\b",                # design notes that are not in the repository
]))


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs a git checkout (git ls-files) to know the tracked files")
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracked_file_points_outside_the_repository():
    found = []
    for path in _tracked_files():
        if not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        for m in _OUTSIDE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)}")
    assert not found, "references to files outside the repository:\n" + "\n".join(found)


def _slug(heading: str) -> str:
    # GitHub's anchors: lower case, punctuation other than '-' and '_' dropped, spaces -> '-'.
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for md in _markdown_files():
        text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):          # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (md.parent / file).resolve() if file else md
            if ROOT not in dest.parents and dest != ROOT:
                broken.append(f"{md.name}: {target} leaves the repository")
            elif not dest.exists():
                broken.append(f"{md.name}: {target} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{md.name}: {target} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_every_named_file_in_the_docs_exists():
    # Paths the docs name in backquotes (`compiler/cpu/lower.py`, `tir_emit.py`) are files of
    # the repository, so that a renamed or deleted file shows up here.
    names = {p.name for p in _tracked_files()}
    paths = {str(p.relative_to(ROOT)) for p in _tracked_files()}
    missing = []
    for md in _markdown_files():
        text = md.read_text()
        for m in re.finditer(r"`([\w./-]+\.(?:py|cc|h|cu|md|toml))`", text):
            name = m.group(1)
            ok = (name in names if "/" not in name else
                  any(p == name or p.endswith("/" + name) for p in paths))
            if not ok and name not in ("gemm.cu", "user.py"):   # the docs' own examples
                missing.append(f"{md.name}: {name}")
    assert not missing, "\n".join(missing)


def test_readme_lists_every_library_kernel():
    import jaxtile as jt

    library = _section(ROOT / "README.md", "## The kernel library")
    missing = [n for n in jt.ops.__all__
               if not re.search(rf"`(jt\.ops\.)?{n}[`(]", library)]
    assert not missing, f"jt.ops exports missing from the README's kernel library: {missing}"


def test_readme_and_design_name_every_target():
    from jaxtile.compiler.target import KNOWN

    readme = (ROOT / "README.md").read_text()
    assert not [t for t in KNOWN if f'"{t}"' not in readme], KNOWN
    targets = _section(ROOT / "docs" / "design.md", "## Targets")
    names = set(re.findall(r"(cpu|sm_\d+a?|gfx\w+|x86-64-v\d|sapphirerapids)", targets))
    assert not [t for t in KNOWN if t.split(":")[-1] not in names], KNOWN


def test_readme_says_which_extra_the_framework_examples_need():
    section = _section(ROOT / "README.md", "### Flax and Equinox")
    assert "'.[examples]'" in section


def test_design_states_the_pass_order_of_every_pipeline():
    from jaxtile.compiler import pipelines
    from jaxtile.compiler.target import parse_target

    design = " ".join((ROOT / "docs" / "design.md").read_text().split())
    for passes in (pipelines.NEUTRAL, pipelines.cpu(parse_target("cpu")),
                   pipelines.gpu(parse_target("cuda:sm_80"))):
        order = ", ".join(p.name for p in passes)
        assert f"`{order}`" in design, order


def _section(path: Path, heading: str) -> str:
    # From the heading to the next heading of the same or a higher level.
    text = path.read_text()
    start = text.index(heading + "\n")
    level = len(heading.split()[0])
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, start + len(heading))
    return text[start:end.start() if end else len(text)]


def test_design_lists_every_tile_ir_op_kind():
    from jaxtile.compiler import op_defs

    section = _section(ROOT / "docs" / "design.md", "## Tile IR")
    assert not [k for k in op_defs.OPS if f"`{k}`" not in section], sorted(op_defs.OPS)


def test_design_states_the_limits_the_code_enforces():
    from jaxtile import _trace
    from jaxtile.compiler.cpu.lower import MAX_SCRATCH_BYTES
    from jaxtile.compiler.cpu.tir_emit import MAX_STACK_BYTES
    from jaxtile.compiler.passes.fusion import MAX_DEPTH

    design = " ".join((ROOT / "docs" / "design.md").read_text().split())
    assert _trace.MAX_ELEMENTS == 2**31 - 1 and "limited to 2^31 - 1 elements" in design
    assert f"stack budget of {MAX_STACK_BYTES >> 10} KiB" in design
    assert f"more than {MAX_SCRATCH_BYTES >> 30} GiB of scratch" in design
    assert f"nest at most {MAX_DEPTH} deep" in design
