"""This machine's CPU described with flags added or taken away: how tests reach the paths of
CPUs they do not run on (``compiler/target.py`` reads the flags through ``_cpuinfo``)."""

from jaxtile.compiler import target


def describe_host(monkeypatch, *, add=(), remove=(), vendor: str | None = None) -> set[str]:
    """Describes the host with ``add`` and without ``remove`` (and as a CPU of ``vendor``,
    e.g. ``AuthenticAMD``) for the rest of the test; the flags it now has."""
    info = dict(target._cpuinfo())
    if vendor is not None:
        info["vendor_id"] = vendor
    flags = (set(info.get("flags", "").split()) - set(remove)) | set(add)
    info["flags"] = " ".join(sorted(flags))
    monkeypatch.setattr(target, "_cpuinfo", lambda: info)
    return flags
