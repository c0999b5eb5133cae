"""benchmarks/gpu_check.py catches wrong results: its correctness checks against jnp decide
the exit status, a deliberately wrong kernel is reported as a mismatch, and the emulator's
expected failures apply to emulator runs only. The whole script runs here (no GPU) with
``--backend cpu`` and ``--backend cuda-emulator`` (slow)."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import gpu_check  # noqa: E402


@jt.kernel(threads=128)
def _wrong_add(x, y, *, block=256):
    """x + y, except that the last block adds y twice: right almost everywhere."""
    (n,) = x.shape
    out = jt.empty((n,), x.dtype)
    i = jt.grid(jt.cdiv(n, block))
    t = jt.fragment((block,), x.dtype)
    u = jt.fragment((block,), y.dtype)
    jt.copy(x.at[i * block], t)
    jt.copy(y.at[i * block], u)
    last = jnp.where(i == jt.cdiv(n, block) - 1, 2.0, 1.0)
    t[...] = t[...] + u[...] * last
    jt.copy(t, out.at[i * block])
    return out


def _checks():
    x, y = (jnp.asarray(np.random.default_rng(s).standard_normal(1000), jnp.float32)
            for s in (0, 1))
    want = np.asarray(x, np.float64) + np.asarray(y, np.float64)
    return [gpu_check.Check("add", lambda: jt.ops.add(x, y), lambda: want, 1e-6),
            gpu_check.Check("wrong_add", lambda: _wrong_add(x, y), lambda: want, 1e-6)]


def test_a_wrong_kernel_is_a_mismatch():
    report = gpu_check.run_checks(_checks(), {})
    assert report["status"] == "failed" and report["failed"] == ["wrong_add"]
    assert report["checks"]["add"]["status"] == "passed"
    wrong = report["checks"]["wrong_add"]
    assert wrong["status"] == "mismatch" and wrong["max_rel_error"] > 0.1


def test_expected_failures_excuse_only_what_they_name():
    report = gpu_check.run_checks(_checks(), {"wrong_add": "known wrong"})
    assert report["status"] == "passed"
    assert report["checks"]["wrong_add"]["status"] == "expected failure"
    # An expected failure that passes is stale: a failure too.
    report = gpu_check.run_checks(_checks(), {"add": "known wrong"})
    assert report["failed"] == ["add", "wrong_add"]
    assert report["checks"]["add"]["status"] == "unexpectedly passed"


def test_a_check_that_raises_fails():
    def boom():
        raise ValueError("no kernel")

    report = gpu_check.run_checks([gpu_check.Check("boom", boom, lambda: 0.0, 1e-6)], {})
    assert report["failed"] == ["boom"] and "ValueError: no kernel" in \
        report["checks"]["boom"]["error"]


def _main(monkeypatch, capsys, checks, argv):
    """gpu_check's exit status and report for ``checks``, the timings left out."""
    monkeypatch.setattr(gpu_check, "correctness_checks", lambda small: checks)
    for name in ("gemm", "softmax", "flash_attention", "ops_attention"):
        monkeypatch.setattr(gpu_check, name, lambda *a: {"not_run": "left out by the test"})
    before = jt.backend()
    try:
        status = gpu_check.main(argv)
    finally:
        jt.set_backend(before)
        jax.clear_caches()
    return status, json.loads(capsys.readouterr().out)


def test_the_exit_status_is_nonzero_on_a_mismatch(monkeypatch, capsys):
    status, report = _main(monkeypatch, capsys, _checks(), ["--backend", "cpu"])
    assert status == 1
    assert report["correctness"]["failed"] == ["wrong_add"]
    assert report["correctness"]["checks"]["add"]["status"] == "passed"
    # The timings still ran (here, their stand-ins), after the checks.
    assert list(report).index("correctness") < list(report).index("gemm")
    status, report = _main(monkeypatch, capsys, _checks()[:1], ["--backend", "cpu"])
    assert status == 0 and report["correctness"]["status"] == "passed"


def test_emulator_expected_failures_are_for_the_emulator_only(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "EMULATOR_EXPECTED_FAILURES", {"wrong_add": "known"})
    status, report = _main(monkeypatch, capsys, _checks()[1:], ["--backend", "cuda-emulator"])
    assert status == 0 and report["correctness"]["status"] == "passed"
    assert report["correctness"]["checks"]["wrong_add"]["status"] == "expected failure"
    status, report = _main(monkeypatch, capsys, _checks()[1:], ["--backend", "cpu"])
    assert status == 1 and report["correctness"]["failed"] == ["wrong_add"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", "cuda-emulator"])
def test_the_whole_check_passes_without_a_gpu(backend):
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--backend",
                           backend, "--gemm-size", "256", "--seq", "128", "--rounds", "1"],
                          capture_output=True, text=True, timeout=1800)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, report["correctness"]["failed"]
    checks = report["correctness"]["checks"]
    assert {"add", "matmul_tt", "tile_gemm", "attention_jvp_causal", "attention_decode",
            "flash_attention_bfloat16_causal"} <= set(checks)
    assert all(c["status"] in ("passed", "expected failure") for c in checks.values())


def test_the_rocm_mode_without_a_rocm_device_says_so(monkeypatch, capsys):
    # This machine has no AMD GPU (nor JAX's ROCm plugin): asked for by name, ROCm is
    # missing, with what to install, and the exit status says the check did not run.
    monkeypatch.setattr(gpu_check, "devices", lambda platform: [])
    status, report = _main(monkeypatch, capsys, _checks(), ["--platform", "rocm"])
    assert status == 2 and report["gpu"] is None
    for words in ("no ROCm device (AMD GPU)", "jaxtile[rocm]", "ROCm 7"):
        assert words in report["not_run"], report["not_run"]
    assert "correctness" not in report
    # What would compile and run its kernels: clang for AMD GPUs, and the HIP runtime's state.
    assert "runtime" in report["toolchain"] and "compiler" in report["toolchain"]
    # Without a platform named, no GPU at all is no failure (CI machines have none).
    status, report = _main(monkeypatch, capsys, _checks(), [])
    assert status == 0 and report["not_run"].startswith("no GPU")


def test_the_rocm_mode_expects_the_failures_it_names_only(monkeypatch, capsys):
    # A ROCm device (stood in for: the checks run on the CPU here): the checks that cannot
    # run on ROCm yet are expected failures, anything else must pass.
    class FakeRocmDevice:
        platform, device_kind, compute_capability = "rocm", "AMD Instinct MI300X", "gfx942"

    monkeypatch.setattr(gpu_check, "devices", lambda platform: [FakeRocmDevice()])
    monkeypatch.setattr(gpu_check, "kernel_tests", lambda *a: {"status": "passed"})
    checks = _checks() + [gpu_check.Check("flash_attention_float32", _checks()[1].ours,
                                          _checks()[1].want, 1e-6)]
    status, report = _main(monkeypatch, capsys, checks, ["--platform", "rocm"])
    assert report["gpu"]["platform"] == "rocm"
    # Correctness first, then the timings (here, stand-ins), softmax's among them.
    assert list(report).index("correctness") < list(report).index("softmax")
    assert report["gpu"]["compute_capability"] == "gfx942"
    results = report["correctness"]["checks"]
    assert results["flash_attention_float32"]["status"] == "expected failure"
    assert "LDS" in results["flash_attention_float32"]["expected_failure"]
    # wrong_add is no known ROCm limitation: its mismatch fails the run.
    assert status == 1 and report["correctness"]["failed"] == ["wrong_add"]


@pytest.mark.slow
def test_the_rocm_expected_failures_are_exactly_the_checks_that_do_not_compile():
    # Every check lowered for rocm here (clang compiles its kernels into code objects for
    # gfx90a, the target without a device): the ones expected to fail on ROCm fail to
    # compile, with their reason; every other one compiles. A stale list fails here.
    from jaxtile.compiler.hip import toolchain

    if toolchain.clang_path() is None:
        pytest.skip(f"no clang for AMD GPUs: {toolchain.INSTALL_HINT}")
    checks = gpu_check.correctness_checks(small=False)
    expected = gpu_check.rocm_expected_failures([c.name for c in checks])
    for c in checks:
        try:
            text = jax.jit(c.ours).trace().lower(lowering_platforms=("rocm",)).as_text()
        except jt.KernelError as e:
            assert c.name in expected, (c.name, str(e)[:300])
            assert "shared memory" in str(e) and "LDS" in expected[c.name], (c.name, str(e))
            continue
        assert c.name not in expected, f"{c.name} compiles for ROCm: drop it from the list"
        assert "jaxtile_rocm_call" in text, c.name
