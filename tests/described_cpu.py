"""This machine's CPU described with flags added or taken away: how tests reach the paths of
CPUs they do not run on (``compiler/target.py`` reads the flags through ``_cpuinfo``)."""

from jaxtile.compiler import target


def describe_host(monkeypatch, *, add=(), remove=()) -> set[str]:
    """Describes the host with ``add`` and without ``remove`` for the rest of the test;
    the flags it now has."""
    info = dict(target._cpuinfo())
    flags = (set(info.get("flags", "").split()) - set(remove)) | set(add)
    info["flags"] = " ".join(sorted(flags))
    monkeypatch.setattr(target, "_cpuinfo", lambda: info)
    return flags
