"""Finding 15: the docs say plainly what the checksums protect against."""

from pathlib import Path

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
