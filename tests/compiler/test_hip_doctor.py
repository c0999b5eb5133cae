"""jaxtile doctor's AMD checks ask compiler/hip/toolchain.py, as a compile would, and the
ROCm handler's runtime loader, as a launch would."""

from jaxtile.compiler import doctor
from jaxtile.compiler.hip import toolchain


def _amd():
    return next(c for c in doctor.run() if c.name == "AMD toolchain (clang)")


def test_found_compiler_is_named_with_its_version(monkeypatch):
    monkeypatch.setattr(toolchain, "clang_path", lambda: "/usr/bin/clang-19")
    monkeypatch.setattr(toolchain, "identity", lambda: "clang version 19.1.7")
    check = _amd()
    assert check.ok and check.detail.startswith("/usr/bin/clang-19: clang version 19.1.7")


def test_missing_compiler_says_what_to_install(monkeypatch):
    monkeypatch.setattr(toolchain, "clang_path", lambda: None)
    check = _amd()
    assert not check.ok and "apt-get install -y clang-19 lld-19" in check.advice


def _runtime():
    return next(c for c in doctor.run() if c.name == "AMD HIP runtime")


def test_the_hip_runtime_check_asks_the_rocm_handlers_loader(monkeypatch):
    from jaxtile import _ffi

    monkeypatch.setattr(_ffi, "rocm_runtime_error", lambda: "no libamdhip64 here")
    check = _runtime()
    assert not check.ok and check.detail == "no libamdhip64 here"
    assert "jaxtile[rocm]" in check.advice
    monkeypatch.setattr(_ffi, "rocm_runtime_error", lambda: "")
    assert _runtime().ok
