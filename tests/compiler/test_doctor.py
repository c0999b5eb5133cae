"""jaxtile doctor's checks: what is found, and what to do where something is missing."""

import shutil

import pytest
from described_cpu import describe_host

from jaxtile import _ffi
from jaxtile.compiler import doctor, target
from jaxtile.compiler.cuda import toolchain
from jaxtile.compiler.emulator import build as emulator_build


def _by_name(checks):
    return {c.name: c for c in checks}


def test_every_check_runs_and_missing_ones_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    checks = doctor.run()
    assert len(checks) == len(doctor.CHECKS)
    assert all(c.advice for c in checks if not c.ok)
    found = _by_name(checks)
    assert found["CPU ISA"].detail.split(": ")[1].split() == (list(target.host_isa())
                                                              or ["baseline", "only"])
    assert found["kernel cache"].ok and found["kernel cache"].detail.startswith(str(tmp_path))


@pytest.mark.parametrize("vendor, add, remove, words", [
    ("GenuineIntel", {"avx512f", "avx512_bf16"}, target.AMX_FLAGS,
     "float32 FMAs on widened operands: this CPU has vdpbf16ps"),
    ("AuthenticAMD", {"avx512f", "avx512_bf16"}, target.AMX_FLAGS, "vdpbf16ps (AVX512-BF16)"),
    ("AuthenticAMD", (), {"avx512_bf16", *target.AMX_FLAGS}, "float32 FMAs on widened"),
])
def test_the_bfloat16_gemm_path_is_named(monkeypatch, vendor, add, remove, words):
    describe_host(monkeypatch, add=add, remove=remove, vendor=vendor)
    assert _by_name(doctor.run())["bfloat16 GEMM"].detail.startswith(words)


def test_missing_tools_are_reported_with_advice(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("")

    def no_cxx():
        raise emulator_build.ToolchainError("no C++ compiler: install g++")

    monkeypatch.setattr(emulator_build, "cxx_compiler", no_cxx)
    monkeypatch.setattr(toolchain, "nvcc_path", lambda: None)
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "ld" else real_which(name))
    found = _by_name(doctor.run())
    cxx, nvcc, ld = (found[n] for n in ("C++ compiler (CUDA emulator)", "nvcc", "linker (ld)"))
    assert not cxx.ok and cxx.advice == "no C++ compiler: install g++"
    assert not nvcc.ok and "install the CUDA toolkit" in nvcc.advice
    if _ffi.CPU_LINKS_OBJECTS:  # CPU kernels are linked in process: ld is optional
        assert ld.ok and not ld.required and "not needed" in ld.detail
        assert "none on PATH" in ld.detail
    else:
        assert not ld.ok and ld.required and "binutils" in ld.advice
    cache_check = found["kernel cache"]
    assert not cache_check.ok and "is not a directory" in cache_check.detail


@pytest.mark.parametrize("missing_required", [False, True])
def test_doctor_exit_status_follows_the_required_checks(monkeypatch, capsys, missing_required):
    from jaxtile import cli

    checks = [doctor.Check("optional thing", False, "absent", "get it"),
              doctor.Check("needed thing", not missing_required, "state", "fix it", True)]
    monkeypatch.setattr(doctor, "run", lambda: checks)
    assert cli.main(["doctor"]) == int(missing_required)
    out = capsys.readouterr().out
    assert "[--] optional thing  absent\n" in out and "-> get it" in out
