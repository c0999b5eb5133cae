"""Device code touches architecture features only through jaxtile/device.h, and the toolchain
errors say what to install."""

import subprocess
from pathlib import Path

import pytest

from jaxtile.compiler.cuda.toolchain import compile_cubin, parse_ptxas
from jaxtile.compiler.emulator import Scalar, ToolchainError, cxx_compiler
from jaxtile.compiler.emulator.build import _scalar_literal
from jaxtile.compiler.gpu.device_rule import device_rule_violations

REPO = Path(__file__).resolve().parents[3]


def _project_cu_files():
    # Tracked and untracked-but-not-ignored files: every .cu the project has.
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.cu"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()
    return [REPO / p for p in out]


def test_every_cu_file_follows_the_device_rule():
    files = _project_cu_files()
    assert any(p.name == "gemm_f16.cu" for p in files)
    bad = {str(p.relative_to(REPO)): [str(v) for v in device_rule_violations(p.read_text())]
           for p in files}
    assert {k: v for k, v in bad.items() if v} == {}


@pytest.mark.parametrize(
    "snippet,what",
    [
        ('asm volatile("bar.sync 0;");', "inline assembly"),
        ("float v = __shfl_xor_sync(0xffffffff, x, 1);", "shuffle"),
        ("__syncthreads();", "barrier"),
        ("int i = threadIdx.x;", "builtin variable"),
        ("__shared__ float buf[32];", "keyword"),
        ("atomicAdd(p, 1.0f);", "atomic"),
        ("float e = __expf(x);", "intrinsic"),
        ("half h = __float2half(x);", "intrinsic"),
    ],
)
def test_device_rule_catches(snippet, what):
    source = f"// header comment with __syncthreads() is fine\nvoid f() {{\n  {snippet}\n}}\n"
    found = device_rule_violations(source)
    assert len(found) >= 1 and found[0].line == 3 and what in found[0].what


def test_device_rule_ignores_comments_and_strings():
    assert device_rule_violations('/* asm("x") */ const char* s = "__syncthreads()";') == []


def test_missing_cxx_compiler_says_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ToolchainError, match="install one, e.g. `apt-get install g\\+\\+`"):
        cxx_compiler()


def test_missing_nvcc_says_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    for var in ("NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ToolchainError, match="install the CUDA toolkit"):
        compile_cubin("", "sm_80")


@pytest.mark.parametrize(
    "value,literal",
    [(True, "true"), (7, "7"), (2**40, "1099511627776LL"), (0.5, "0.5f"), (0.1, "0.1")],
)
def test_scalar_literals(value, literal):
    assert _scalar_literal(Scalar("s", value)) == literal


def test_non_finite_scalar_is_rejected():
    with pytest.raises(ToolchainError, match="scalar 's'"):
        _scalar_literal(Scalar("s", float("inf")))


def test_parse_ptxas_report():
    log = (
        "ptxas info    : Compiling entry function 'k' for 'sm_80'\n"
        "ptxas info    : Function properties for k\n"
        "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 200 registers, used 1 barriers, 49152 bytes smem, 388 bytes cmem[0]\n"
    )
    r = parse_ptxas(log)["k"]
    assert (r.registers, r.spill_stores, r.spill_loads, r.stack_frame, r.shared_bytes) == (
        200, 8, 4, 16, 49152)
