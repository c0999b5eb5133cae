"""The compiler's entry points (compiler/build.py): builds on the compile threads, one build
per key however many ask at once, and TVM imported only when something must compile."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.compiler import build, cache
from jaxtile.compiler.cpu import lower
from jaxtile.compiler.target import parse_target


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    cache.clear_memory()
    yield tmp_path
    cache.clear_memory()


def _scaled(factor):
    """A fresh kernel object (so each reaches the build cache) whose code depends on
    ``factor``."""
    @jt.kernel
    def build_scale(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * factor + 1.0
        return out

    return build_scale


X = jax.ShapeDtypeStruct((8,), jnp.float32)


def _ir(factor):
    lowered = _scaled(factor).lower(X)
    return lowered.kernel, parse_target(lowered.target)


def _count_compiles(monkeypatch, gate=None):
    """Record each compile's kernel; with ``gate``, every compile first waits for it."""
    calls = []
    real = lower.compile_to_library

    def counting(kernel, target):
        calls.append(kernel.name)
        if gate is not None:
            assert gate.wait(60)
        return real(kernel, target)

    monkeypatch.setattr(lower, "compile_to_library", counting)
    return calls


def test_parallel_builds_make_the_artifacts_serial_builds_make(tmp_path, monkeypatch):
    factors = (2.0, 3.0, 5.0)
    kernels = [_ir(f) for f in factors]
    artifacts = {}
    for mode in ("serial", "parallel"):
        monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path / mode))
        cache.clear_memory()
        if mode == "serial":
            entries = [build.build(k, t) for k, t in kernels]
        else:
            futures = [build.submit(k, t) for k, t in kernels]
            entries = [f.result(timeout=300) for f in futures]
        artifacts[mode] = [(e.key, e.symbol, e.num_blocks, e.sha256,
                           pathlib.Path(e.library).read_bytes()) for e in entries]
    cache.clear_memory()
    assert artifacts["serial"] == artifacts["parallel"]
    assert len({key for key, *_ in artifacts["serial"]}) == len(factors)


def test_a_key_built_by_many_callers_at_once_compiles_once(fresh_cache, monkeypatch):
    gate = threading.Event()
    calls = _count_compiles(monkeypatch, gate)
    kernel, target = _ir(7.0)
    futures = [build.submit(kernel, target) for _ in range(3)]
    results = []
    waiter = threading.Thread(target=lambda: results.append(build.build(kernel, target)))
    waiter.start()
    gate.set()
    waiter.join(300)
    entries = [f.result(timeout=300) for f in futures] + results
    assert calls == ["build_scale"]
    assert len(entries) == 4 and all(e is entries[0] for e in entries)
    # Done builds free the key: the next build is a plain cache hit.
    assert build.build(kernel, target) is entries[0] and calls == ["build_scale"]
    x = jnp.arange(8, dtype=jnp.float32)
    np.testing.assert_allclose(_scaled(7.0)(x), np.arange(8) * 7.0 + 1.0)
    assert calls == ["build_scale"]


def test_a_failed_build_reaches_every_waiter_and_the_next_build_retries(fresh_cache,
                                                                        monkeypatch):
    gate = threading.Event()
    real = lower.compile_to_library
    calls = []

    def failing_once(kernel, target):
        calls.append(kernel.name)
        assert gate.wait(60)
        if len(calls) == 1:
            raise RuntimeError("LLVM ran out of something")
        return real(kernel, target)

    monkeypatch.setattr(lower, "compile_to_library", failing_once)
    kernel, target = _ir(11.0)
    futures = [build.submit(kernel, target) for _ in range(2)]
    gate.set()
    for f in futures:
        with pytest.raises(RuntimeError, match="out of something"):
            f.result(timeout=300)
    assert build.build(kernel, target).key == build.kernel_key(kernel, target)
    assert calls == ["build_scale", "build_scale"]


def test_wait_idle_returns_when_no_build_is_in_flight(fresh_cache, monkeypatch):
    gate = threading.Event()
    calls = _count_compiles(monkeypatch, gate)
    kernel, target = _ir(23.0)
    future = build.submit(kernel, target)
    opener = threading.Timer(0.2, gate.set)
    opener.start()
    build.wait_idle()
    assert future.done() and calls == ["build_scale"]
    assert future.result().key == build.kernel_key(kernel, target)
    opener.join()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
# JAX warns that a fork may deadlock it: the child here runs no JAX, only the compiler.
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_a_forked_child_builds_what_the_parent_had_in_flight(fresh_cache, monkeypatch):
    gate = threading.Event()
    calls = _count_compiles(monkeypatch, gate)
    kernel, target = _ir(19.0)
    future = build.submit(kernel, target)   # held at the gate: in flight when we fork
    while not calls:
        threading.Event().wait(0.01)
    pid = os.fork()
    if pid == 0:  # the child: no compile thread, yet the same key must build
        code = 1
        try:
            gate.set()
            code = 0 if build.build(kernel, target).key == future_key(kernel, target) else 2
        finally:
            os._exit(code)
    status = None
    for _ in range(12000):  # up to two minutes; a child that waits forever is a failure
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        threading.Event().wait(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    gate.set()
    assert future.result(timeout=300).key == future_key(kernel, target)
    assert status is not None and os.waitstatus_to_exitcode(status) == 0, "the child hung"


def future_key(kernel, target):
    return build.kernel_key(kernel, target)


def test_a_kernel_traced_into_a_program_starts_compiling_before_the_lowering(fresh_cache,
                                                                           monkeypatch):
    # Under jit, every kernel of the program is submitted while tracing, before the
    # lowering asks for the first one, so that they compile side by side.
    events = []
    submit = build.submit

    def recording(kernel, target, **kw):
        events.append(("submit", kernel.name))
        return submit(kernel, target, **kw)

    monkeypatch.setattr(build, "submit", recording)
    real = lower.compile_to_library
    monkeypatch.setattr(lower, "compile_to_library",
                        lambda k, t: (events.append(("compile", k.name)), real(k, t))[1])
    first, second = _scaled(13.0), _scaled(17.0)

    @jax.jit
    def program(x):
        return second(first(x))

    x = jnp.arange(8, dtype=jnp.float32)
    traced = program.trace(x)
    assert [e for e in events if e[0] == "submit"] == [("submit", "build_scale")] * 2
    np.testing.assert_allclose(traced.lower().compile()(x), (x * 13.0 + 1.0) * 17.0 + 1.0)
    assert sorted(e for e in events if e[0] == "compile") == [("compile", "build_scale")] * 2


def test_eager_reverse_mode_starts_the_backward_kernels_before_the_backward_pass(
        fresh_cache, monkeypatch):
    events = []
    submit = build.submit

    def recording(kernel, target, **kw):
        events.append(("submit", kernel.name))
        return submit(kernel, target, **kw)

    monkeypatch.setattr(build, "submit", recording)

    @jt.kernel
    def fwd_scale(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * 3.0
        return out

    @jt.kernel
    def bwd_scale(g):
        out = jt.empty(g.shape, g.dtype)
        out[...] = g[...] * 3.0
        return out

    def bwd(res, g):
        if not isinstance(g, jax.core.Tracer):
            events.append(("backward pass", None))
        return (bwd_scale(g),)

    fwd_scale.defvjp(lambda x: (fwd_scale(x), None), bwd)
    x = jnp.arange(8, dtype=jnp.float32)
    grad = jax.grad(lambda x: jnp.sum(fwd_scale(x) * x))(x)
    np.testing.assert_allclose(grad, 3.0 * x + 3.0 * x)
    names = [name for kind, name in events if kind == "submit"]
    assert "bwd_scale" in names
    assert events.index(("submit", "bwd_scale")) < events.index(("backward pass", None))


_NO_TVM = textwrap.dedent("""
    import json, sys
    import jax.numpy as jnp
    import jaxtile as jt

    def loaded():
        gpu = ("jaxtile.compiler.gpu", "jaxtile.compiler.cuda", "jaxtile.compiler.hip",
               "jaxtile.compiler.emulator")
        return sorted(m for m in sys.modules if m == "tvm" or m.startswith(gpu))

    after_import = loaded()
    x = jnp.arange(8, dtype=jnp.float32)
    out = jt.ops.add(x, x, block=8)
    print(json.dumps({"after_import": after_import, "after_calls": loaded(),
                      "out": out.tolist()}))
""")


def test_import_and_cache_hits_load_neither_tvm_nor_gpu_modules(tmp_path):
    """``import jaxtile`` and a CPU kernel's cache hit in a fresh process import no TVM
    and no module of the GPU tiers (they are imported on first use)."""
    env = {**os.environ, "JAXTILE_CACHE_DIR": str(tmp_path)}
    env.pop("JAXTILE_INTERPRET", None)
    env.pop("JAXTILE_BACKEND", None)

    def run():
        proc = subprocess.run([sys.executable, "-c", _NO_TVM], env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    cold, warm = run(), run()
    assert "tvm" in cold["after_calls"] and not cold["after_import"]  # the cold run compiled
    assert not [m for m in cold["after_calls"] if m != "tvm"]   # a CPU compile: no GPU tier
    assert warm["after_import"] == warm["after_calls"] == []
    assert warm["out"] == cold["out"] == [2.0 * i for i in range(8)]
