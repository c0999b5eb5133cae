"""jt.autotune: pruning with reasons, timing, the report, the persistent record and what
its key covers, JAXTILE_AUTOTUNE=0, the emulator refusal and the progress bar."""

import dataclasses
import importlib
import json
import os
import pty
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import cache
from jaxtile.compiler.cuda import toolchain
from jaxtile.compiler.hip import toolchain as hip_toolchain
from jaxtile.compiler.target import parse_target

at = importlib.import_module("jaxtile.autotune")  # the module (jt.autotune is the function)

CONFIGS = [{"rows": 100}, {"rows": 2}, {"rows": 8, "threads": 64}, {"rows": 0},
           {"rows": 2, "threads": 128}]
"""On 64-row inputs: rows=100 is a tile that does not fit (JAX would clamp its direct index,
reading another block's rows), rows=0 fails in the body (a KernelError at trace) and the last
is the second again (threads=128 is the default): all three are pruned."""


def make_scale_rows(helper):
    """A kernel that reads whole row blocks directly, scaled by ``helper``: a closure, so
    that two kernels differ only there."""
    @jt.kernel
    def scale_rows(x, *, rows=4):
        n, d = x.shape
        out = jt.empty((n, d), x.dtype)
        r = jt.grid(jt.cdiv(n, rows))
        out[jt.ds(r * rows, rows), :] = helper(x[jt.ds(r * rows, rows), :])
        return out

    return scale_rows


def double(v):
    return v * 2


def triple(v):
    return v * 3


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _timed_runs():
    return at.stats()["timed_runs"]


def test_prunes_times_reports_and_runs_the_best(fresh_cache):
    tuned = jt.autotune(make_scale_rows(double), configs=CONFIGS, runs=2)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 16)), jnp.float32)
    stored = cache.stats()["stored"]
    report = tuned.tuning_report(x)
    # The two valid candidates were compiled once each (on the pool; the timed calls found
    # them in the build cache).
    assert cache.stats()["stored"] == stored + 2
    too_tall, *valid, zero, same = report.candidates
    assert too_tall.pruned.startswith("the tile does not fit the shape: ")
    assert "0 + 100 > 64" in too_tall.pruned
    assert zero.pruned.startswith("KernelError: ") and "ZeroDivisionError" in zero.pruned
    assert same.pruned == "the same Tile IR as rows=2"
    assert all(c.seconds is None for c in (too_tall, zero, same))
    assert all(c.pruned is None and c.seconds > 0 for c in valid)
    assert report.best in CONFIGS[1:3] and report.timed and not report.from_cache
    assert report.best == min(valid, key=lambda c: c.seconds).config
    text = str(report)
    assert "pruned: KernelError" in text and " us" in text and "threads=64" in text
    out = tuned(x)
    np.testing.assert_allclose(out, x * 2, rtol=1e-6)
    kernel, params = tuned._with(report.best)
    np.testing.assert_allclose(out, kernel.reference(x, **params), rtol=1e-6)


def test_under_jit_tunes_at_trace_time_on_the_inputs_hook(fresh_cache):
    seen = []

    def inputs(spec):
        seen.append((spec.shape, spec.dtype))
        return (jnp.ones(spec.shape, spec.dtype),)

    tuned = make_scale_rows(double).autotune(CONFIGS[1:3], inputs=inputs, runs=1)
    x = jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8)
    before = _timed_runs()
    np.testing.assert_allclose(jax.jit(tuned)(x), x * 2)
    assert seen == [((64, 8), np.dtype(np.float32))] and _timed_runs() == before + 2


def test_under_jit_on_random_inputs_and_with_a_vjp_rule_given_after(fresh_cache):
    tuned = jt.autotune(make_scale_rows(double), configs=CONFIGS[1:3], runs=1)
    bwd_calls = []

    def fwd(x, **params):
        return tuned(x), None

    def bwd(res, g, **params):
        bwd_calls.append(params)
        return (g * 2,)

    tuned.defvjp(fwd, bwd)
    x = jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8)
    np.testing.assert_allclose(jax.jit(tuned)(x), x * 2)
    grad = jax.grad(lambda x: jnp.sum(tuned(x) ** 2))(x)
    np.testing.assert_allclose(grad, 8 * x)
    # Eager reverse mode traces the rule once more, abstractly, to start compiling the
    # backward kernels early (Specialisation.start_vjp_builds).
    assert bwd_calls and all(c == {"rows": tuned.best_config(x)["rows"]} for c in bwd_calls)


def test_the_record_key_covers_code_shapes_dtypes_target_and_version(fresh_cache, monkeypatch):
    x = jnp.ones((64, 16), jnp.float32)

    def tunes(kernel, *args):
        before = _timed_runs()
        report = jt.autotune(kernel, configs=CONFIGS[1:3], runs=1).tuning_report(*args)
        assert report.from_cache == (_timed_runs() == before)
        return not report.from_cache

    assert tunes(make_scale_rows(double), x)
    # Nothing changed: a new kernel object (empty memory) finds the record and times nothing.
    assert not tunes(make_scale_rows(double), x)
    # The same Python source calling another helper is another kernel.
    assert tunes(make_scale_rows(triple), x)
    assert tunes(make_scale_rows(double), jnp.ones((32, 16), jnp.float32))
    assert tunes(make_scale_rows(double), jnp.ones((64, 16), jnp.int32))
    cpu = parse_target("cpu")
    other_isa = dataclasses.replace(cpu, caps=dataclasses.replace(cpu.caps, isa=("sse2",)))
    with monkeypatch.context() as m:
        m.setattr(at, "tuning_target", lambda: other_isa)
        assert tunes(make_scale_rows(double), x)
    with monkeypatch.context() as m:
        m.setattr(jt, "__version__", "99.0")
        assert tunes(make_scale_rows(double), x)
    assert not tunes(make_scale_rows(double), x)


def test_a_key_bucket_shares_one_tuning_and_still_checks_the_code(fresh_cache):
    def bucket(x):
        return x.shape[0] // 64

    def tuned(helper):
        return jt.autotune(make_scale_rows(helper), configs=CONFIGS[1:3], key=bucket, runs=1)

    before = _timed_runs()
    tuned(double).tuning_report(jnp.ones((64, 16)))
    assert _timed_runs() > before
    before = _timed_runs()
    assert tuned(double).tuning_report(jnp.ones((96, 16))).from_cache
    assert _timed_runs() == before
    # Same bucket, changed helper: the record's IR keys (at its shapes) no longer match.
    assert not tuned(triple).tuning_report(jnp.ones((96, 16))).from_cache


def test_autotune_off_takes_the_first_valid_config_untimed(fresh_cache, monkeypatch):
    monkeypatch.setenv("JAXTILE_AUTOTUNE", "0")
    tuned = jt.autotune(make_scale_rows(double), configs=CONFIGS)
    x = jnp.ones((64, 16))
    before = _timed_runs()
    report = tuned.tuning_report(x)
    assert report.best == CONFIGS[1] and not report.timed and _timed_runs() == before
    assert "does not fit" in report.candidates[0].pruned
    assert "untimed" in str(report)
    np.testing.assert_allclose(tuned(x), x * 2)


def test_tuning_on_the_emulator_is_refused(fresh_cache):
    tuned = jt.autotune(make_scale_rows(double), configs=CONFIGS[1:3])
    jt.set_backend("cuda-emulator")
    try:
        with pytest.raises(jt.KernelError, match="simulator whose timings say nothing"):
            tuned.tuning_report(jnp.ones((64, 16)))
    finally:
        jt.set_backend("cpu")


def test_bad_configs_are_clear_errors():
    k = make_scale_rows(double)
    with pytest.raises(jt.KernelError, match=r"sets \['block'\], which are not.*"
                       r"\(at .*test_autotune.py:\d+\)"):
        jt.autotune(k, configs=[{"block": 4}])
    with pytest.raises(jt.KernelError, match="non-empty list of dicts"):
        jt.autotune(k, configs={"rows": 4})
    with pytest.raises(jt.KernelError, match="threads must be a positive int"):
        jt.autotune(k, configs=[{"threads": 0}])
    with pytest.raises(jt.KernelError, match="key= names"):
        jt.autotune(k, configs=[{"rows": 4}], key=("y",))
    tuned = jt.autotune(k, configs=[{"rows": 4}])
    with pytest.raises(jt.KernelError, match=r"\['rows'\] are tuned"):
        tuned(jnp.ones((8, 8)), rows=2)

    @jt.kernel
    def scaled(x, *, scale, rows):
        out = jt.empty(x.shape, x.dtype)
        r = jt.grid(x.shape[0] // rows)
        out[jt.ds(r * rows, rows), :] = x[jt.ds(r * rows, rows), :] * scale[0]
        return out

    tuned = jt.autotune(scaled, configs=[{"rows": 4}, {"rows": 2}])
    with pytest.raises(jt.KernelError, match="must be hashable"):
        tuned(jnp.ones((8, 8)), scale=[2.0])
    with pytest.raises(jt.KernelError, match="'scale' is a traced value"):
        jax.jit(lambda x, s: tuned(x, scale=s))(jnp.ones((8, 8)), 2.0)
    with pytest.raises(jt.KernelError, match=r"missing compile-time parameter\(s\) \['scale'\]"):
        tuned(jnp.ones((8, 8)))
    with pytest.raises(jt.KernelError, match="takes 1 array argument"):
        tuned(jnp.ones((8, 8)), jnp.ones(3), scale=(2.0,))
    # Untuned parameters pass through and are part of what a tuning is for.
    x = jnp.arange(64.0).reshape(8, 8)
    np.testing.assert_allclose(tuned(x, scale=(2.0,)), x * 2)
    assert tuned.tuning_report(x, scale=(3.0,)) is not tuned.tuning_report(x, scale=(2.0,))


def test_shared_memory_over_a_cuda_targets_limit_is_pruned():
    @jt.kernel
    def staged(x, *, rows=16):
        out = jt.empty(x.shape, x.dtype)
        r = jt.grid(x.shape[0] // rows)
        s = jt.shared((rows, x.shape[1]), x.dtype)
        jt.copy(x.at[r * rows, 0], s)
        jt.copy(s, out.at[r * rows, 0])
        return out

    specs = (jax.ShapeDtypeStruct((1024, 1024), jnp.float32),)
    target = parse_target("cuda:sm_80")
    # 64 rows of 4 KiB = 256 KiB, over sm_80's 163 KiB.
    reason = at._target_limits(staged, {"rows": 64}, specs, {}, target)
    assert "bytes of shared memory" in reason
    assert at._target_limits(staged, {}, specs, {}, parse_target("cpu")) is None


@pytest.mark.slow
@pytest.mark.skipif(toolchain.nvcc_path() is None, reason="nvcc is not installed")
def test_register_spills_reported_by_ptxas_are_pruned():
    @jt.kernel(threads=32)
    def wide(x, *, cols=64):
        n, d = x.shape
        out = jt.empty((n, d), x.dtype)
        r = jt.grid(n // 32)
        t = jt.fragment((32, cols), jnp.float32)
        jt.copy(x.at[r * 32, 0], t)
        v = t[...]
        t[...] = jnp.exp(v) * jnp.sum(v, axis=0, keepdims=True) + jnp.flip(v, axis=1)
        jt.copy(t, out.at[r * 32, 0])
        return out

    target = parse_target("cuda:sm_80")
    specs = (jax.ShapeDtypeStruct((1024, 512), jnp.float32),)
    # 512 floats per thread cannot live in 255 registers.
    assert "register spills" in at._target_limits(wide, {"cols": 512}, specs, {}, target)
    specs = (jax.ShapeDtypeStruct((1024, 64), jnp.float32),)
    assert at._target_limits(wide, {"cols": 64}, specs, {}, target) is None


@pytest.mark.slow
@pytest.mark.skipif(hip_toolchain.clang_path() is None,
                    reason="no clang for AMD GPUs (.ci/install-hip-toolchain installs it)")
def test_register_spills_in_the_amd_resource_report_are_pruned():
    @jt.kernel(threads=64)
    def wide(x, *, cols=64):
        n, d = x.shape
        out = jt.empty((n, d), x.dtype)
        r = jt.grid(n // 64)
        t = jt.fragment((64, cols), jnp.float32)
        jt.copy(x.at[r * 64, 0], t)
        v = t[...]
        t[...] = jnp.exp(v) * jnp.sum(v, axis=0, keepdims=True)
        jt.copy(t, out.at[r * 64, 0])
        return out

    target = parse_target("hip:gfx942")
    # 768 floats per lane do not fit the 512 registers (VGPRs and AGPRs) a wave64 lane has.
    specs = (jax.ShapeDtypeStruct((1024, 768), jnp.float32),)
    assert "register spills" in at._target_limits(wide, {"cols": 768}, specs, {}, target)
    specs = (jax.ShapeDtypeStruct((1024, 64), jnp.float32),)
    assert at._target_limits(wide, {"cols": 64}, specs, {}, target) is None


def test_progress_when_asked_off_a_terminal_and_a_damaged_record_retunes(fresh_cache,
                                                                         capsys):
    x = jnp.ones((64, 16))
    tuned = jt.autotune(make_scale_rows(double), configs=CONFIGS[1:3], runs=2, progress=True)
    best = tuned.tuning_report(x).best
    err = capsys.readouterr().err
    assert "autotune scale_rows: [" in err and "2 candidates" in err and "timed 2/2" in err
    assert f"({at._fmt(best)})" in err and err.endswith("\n")
    (record,) = (fresh_cache / "autotune").glob("*.json")
    record.write_text('{"format": "jaxtile-autotune-1", "best": 7}')
    before = _timed_runs()
    again = jt.autotune(make_scale_rows(double), configs=CONFIGS[1:3], runs=1, progress=False)
    assert not again.tuning_report(x).from_cache and _timed_runs() == before + 2
    assert capsys.readouterr().err == ""
    # A record damaged inside (candidates that are not records) is a miss too.
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "candidates": [1, 2]}))
    assert not jt.autotune(make_scale_rows(double), configs=CONFIGS[1:3],
                           runs=1).tuning_report(x).from_cache
    assert jt.autotune(make_scale_rows(double), configs=CONFIGS[1:3]).tuning_report(x).from_cache


_SCRIPT = """
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax.numpy as jnp
import jaxtile as jt
from jaxtile.autotune import stats
from helper import helper

@jt.autotune(configs=[{"rows": 2}, {"rows": 8}], runs=1)
@jt.kernel
def k(x, *, rows=4):
    out = jt.empty(x.shape, x.dtype)
    r = jt.grid(x.shape[0] // rows)
    out[jt.ds(r * rows, rows), :] = helper(x[jt.ds(r * rows, rows), :])
    return out

x = jnp.ones((64, 8))
assert float(k(x)[0, 0]) == float(helper(x)[0, 0])
print("timed_runs", stats()["timed_runs"])
"""


def test_a_new_process_hits_a_changed_helper_module_retunes_and_the_bar(tmp_path):
    """Three processes on one cache: the first tunes with stderr on a pseudo-terminal (the
    bar shows), the second finds the record, the third (helper module edited) tunes again
    with stderr on a pipe (no bar)."""
    (tmp_path / "run.py").write_text(_SCRIPT)
    env = {**os.environ, "JAXTILE_CACHE_DIR": str(tmp_path / "cache")}

    def run(helper_body, tty):
        (tmp_path / "helper.py").write_text(f"def helper(v):\n    return {helper_body}\n")
        if not tty:
            done = subprocess.run([sys.executable, str(tmp_path / "run.py")], env=env,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            return done.stdout, done.stderr
        leader, follower = pty.openpty()
        proc = subprocess.Popen([sys.executable, str(tmp_path / "run.py")], env=env,
                                stdout=subprocess.PIPE, stderr=follower, text=True)
        os.close(follower)
        err = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the pty closes (EIO) when the child exits
                break
            if not chunk:
                break
            err += chunk
        os.close(leader)
        out = proc.stdout.read()
        assert proc.wait(timeout=120) == 0, err
        return out, err.decode(errors="replace")

    out, err = run("v * 2", tty=True)
    assert "timed_runs 2" in out
    assert "autotune k:" in err and "2 candidates" in err and "best " in err and "left" in err
    out, err = run("v * 2", tty=False)
    assert "timed_runs 0" in out
    out, err = run("v * 2 + 1", tty=False)
    assert "timed_runs 2" in out and "autotune" not in err


def test_a_candidate_the_backend_fails_on_is_pruned_with_the_kernels_name(fresh_cache,
                                                                          monkeypatch):
    # Candidates compile on the build threads; an error of the compiler below the Tile IR
    # (not a KernelError) prunes its candidate as the serial path's KernelError would.
    from jaxtile.compiler.cpu import lower

    real = lower.compile_to_library

    def failing_for_two_rows(kernel, target):
        if kernel.num_blocks == 32:   # rows=2 on 64 rows
            raise RuntimeError("LLVM ERROR: out of registers")
        return real(kernel, target)

    monkeypatch.setattr(lower, "compile_to_library", failing_for_two_rows)
    # A body no other test compiles, so that no cache holds it.
    tuned = jt.autotune(make_scale_rows(lambda v: v * 5), configs=CONFIGS[1:3], runs=1)
    x = jnp.ones((64, 16), jnp.float32)
    report = tuned.tuning_report(x)
    two, eight = report.candidates
    assert two.pruned.startswith("KernelError: ") and "scale_rows" in two.pruned
    assert "RuntimeError: LLVM ERROR: out of registers" in two.pruned and two.seconds is None
    assert eight.pruned is None and report.best == CONFIGS[2]
    np.testing.assert_allclose(tuned(x), x * 5)
