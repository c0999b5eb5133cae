"""Faults in emulated device code never kill the Python process (issue 19, point 9).

Each fault that used to end the process (SIGSEGV from a stack overflow, SIGFPE from an integer
division by zero, SIGABRT from a device ``assert``) runs in one child process, so that a
regression fails these tests instead of killing pytest; the child prints one JSON line per
probe. Per-kernel checks and reports run in this process: they cannot crash it.
"""

import json
import threading

import numpy as np
import pytest
from probes import run_python

from jaxtile.compiler.emulator import Buffer, EmulatedKernel, EmulatorError, LaunchConfig

_HEAD = "#include <jaxtile/device.h>\n#include <cassert>\nusing namespace jaxtile;\n"

# One kernel (one compilation) with a fault per mode, x[0]: x[1:] are its data.
FAULTS = _HEAD + """JT_DEVICE int down(int n, ptr<const int> x) {
  volatile char pad[512];
  pad[0] = static_cast<char>(n);
  if (n == 0) return x[1];
  return down(n - 1, x) + pad[0];  // RECURSE
}
JT_KERNEL void faults(ptr<const int> x, ptr<float> out) {
  const unsigned t = thread_idx().x;
  switch (x[0]) {
    case 0: {
      // 320 KB of locals per thread: legal CUDA (up to 512 KiB of local memory per thread),
      // above the emulator's default 256 KiB fiber stack.
      float local[80000];
      const int n = x[1];
      for (int i = 0; i < 80000; ++i) local[i] = float(i % n);
      out[t] = local[(t * 7919 + 13) % 80000];
      break;
    }
    case 1: out[t] = float(down(x[1], x)); break;
    case 2: out[t] = float(100 / x[1 + t]); break;  // DIVIDE
    case 3: out[t] = float(100u % static_cast<unsigned>(x[1 + t])); break;  // REMAINDER
    case 4: {
      const int v = x[1 + t];
      assert(v >= 0 && "counts are not negative");  // ASSERT
      out[t] = float(v);
      break;
    }
    case 5: {
      ptr<float> null_ptr;
      null_ptr[t] = 1.0f;  // NULL
      ptr<float> unowned(nullptr, nullptr);
      unowned[0] = 1.0f;  // UNOWNED
      ptr<float> wild = out + (int64_t(1) << 40);
      wild[0] = float(x[1]);  // WILD
      out[t] = 2.0f;
      break;
    }
    case 6:
      while (volatile_load(x + 1) == 0) {}  // SPIN
      out[t] = 1.0f;
      break;
    // What cannot be contained by construction: isolated launches only.
    case 7:
      reinterpret_cast<float*>(static_cast<uintptr_t>(x[1]))[t] = 1.0f;  // RAW
      break;
    case 8: out[t] = float(x[1] / x[2]); break;  // OVERFLOW
    case 10: out[t] = float(size_floordiv(7, x[1 + t])); break;  // in the device header
    default: {
      volatile int forever = 1;
      while (forever) {}  // FOREVER
    }
  }
}
"""

_CHILD = """
import json, time
import numpy as np
from jaxtile.compiler.emulator import Buffer, EmulatedKernel, EmulatorError, LaunchConfig

k = EmulatedKernel.build(FAULTS, "faults", [Buffer("x", "int32"), Buffer("out", "float32")],
                         LaunchConfig((1, 1, 1), (32, 1, 1)), file="faults.cu")

def probe(label, mode, data, timeout=None, isolate=None):
    k.set_timeout(timeout)
    k.set_isolate(isolate)
    out = np.zeros(32, np.float32)
    row = {"label": label, "stack_bytes": k.stack_bytes}
    start = time.perf_counter()
    try:
        k.run(np.asarray([mode] + data + [1] * (63 - len(data)), np.int32), out)
        row["out"] = out.tolist()
    except EmulatorError as e:
        row["error"] = str(e)
        row["findings"] = [f["message"] for f in e.report["findings"]]
    row["seconds"] = time.perf_counter() - start
    print(json.dumps(row), flush=True)

probe("big", 0, [7])

# 256 threads x 320 KB of locals: the stacks' 80 MiB are given back after the launch.
def rss_mib():
    status = open("/proc/self/status").read()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024

wide = EmulatedKernel.build(FAULTS, "faults", [Buffer("x", "int32"), Buffer("out", "float32")],
                            LaunchConfig((1, 1, 1), (256, 1, 1)), file="faults.cu")
x = np.asarray([0, 7] + [1] * 62, np.int32)
before = rss_mib()
wide.run(x, np.zeros(256, np.float32))
print(json.dumps({"label": "stack-memory", "kept_mib": rss_mib() - before}), flush=True)
probe("recurse", 1, [10**7])
probe("divide", 2, [1] * 5 + [0])
probe("remainder", 3, [3] * 9 + [0])
probe("in-header", 10, [3] * 2 + [0])
probe("assert", 4, [1, 2, 3, -1])
probe("pointers", 5, [7])
probe("spin", 6, [0], timeout=0.5)
probe("raw", 7, [0], isolate=True)
probe("overflow", 8, [-2**31, -1], isolate=True)
probe("forever", 9, [], timeout=0.5, isolate=True)
probe("isolated-big", 0, [7], isolate=True)

# Isolated inside jax.jit: blocks split over the FFI handler's threads, each with a worker.
import jax, jax.numpy as jnp
import jaxtile.primitives  # registers the jaxtile_cpu_call target
k.set_isolate(True)
k.set_timeout(None)
blocks = EmulatedKernel.build(BLOCKS, "blocks", [Buffer("x", "float32"), Buffer("y", "float32")],
                              LaunchConfig((8, 1, 1), (32, 1, 1)), file="blocks.cu")
blocks.set_isolate(True)
x = jnp.arange(256, dtype=jnp.float32)
(y,) = jax.jit(lambda x: blocks.ffi_call([((256,), jnp.float32)], x))(x)
print(json.dumps({"label": "isolated-jit", "out": np.asarray(y).tolist(),
                  "report": blocks.report()["counters"]}), flush=True)
"""


BLOCKS = _HEAD + """JT_KERNEL void blocks(ptr<const float> x, ptr<float> y) {
  const unsigned i = block_idx().x * 32 + thread_idx().x;
  y[i] = 2.0f * x[i] + float(block_idx().x);
}
"""


def _line(tag: str, source: str = FAULTS) -> int:
    return next(i for i, text in enumerate(source.splitlines(), 1) if f"// {tag}" in text)


@pytest.fixture(scope="module")
def faults():
    """Every probe's outcome, by label; the child's stderr if it died."""
    proc = run_python(_CHILD, preamble=f"FAULTS = {FAULTS!r}\nBLOCKS = {BLOCKS!r}\n",
                      timeout=600)
    rows = {}
    for text in proc.stdout.splitlines():
        if text.startswith("{"):
            row = json.loads(text)
            rows[row["label"]] = row
    return rows, proc


def _row(faults, label):
    rows, proc = faults
    assert label in rows, (f"the child process died before probe {label!r} reported (status "
                           f"{proc.returncode}):\n{proc.stderr[-3000:]}")
    return rows[label]


def test_large_per_thread_array_runs(faults):
    row = _row(faults, "big")
    assert "error" not in row, row["error"]
    # What g++ reports for the kernel's frame sizes the fiber stacks: 320 KB of locals.
    assert row["stack_bytes"] >= 320_000
    tid = np.arange(32)
    np.testing.assert_array_equal(row["out"], ((tid * 7919 + 13) % 80000) % 7)


def test_large_stacks_are_given_back_after_the_launch(faults):
    # The launch touches 80 MiB of stack; what stays committed afterwards is noise.
    assert _row(faults, "stack-memory")["kept_mib"] < 20


def test_deep_recursion_is_an_error_naming_kernel_thread_and_line(faults):
    row = _row(faults, "recurse")
    assert "error" in row, "ten million nested calls cannot fit any stack"
    assert row["error"].startswith("emulated kernel 'faults': stack overflow: thread (")
    assert "of block (0,0,0)" in row["error"]
    assert f"faults.cu:{_line('RECURSE')}" in row["error"]


@pytest.mark.parametrize("label,tag,thread", [("divide", "DIVIDE", 5),
                                              ("remainder", "REMAINDER", 9)])
def test_integer_division_by_zero_is_reported_at_its_line(faults, label, tag, thread):
    row = _row(faults, label)
    assert "error" in row, "a division by zero is an error by default"
    assert f"integer division by zero at faults.cu:{_line(tag)}" in row["error"]
    assert f"thread ({thread},0,0)" in row["error"]


def test_division_by_zero_in_a_header_names_the_header(faults):
    from jaxtile.compiler.emulator.build import DEVICE_INCLUDE

    row = _row(faults, "in-header")
    assert "error" in row
    # The header's own name and line, not faults.cu with the header's line number.
    header = (DEVICE_INCLUDE / "jaxtile" / "xla_math.h").read_text().splitlines()
    line = next(i for i, text in enumerate(header, 1) if "const int q = a / b;" in text)
    assert f"integer division by zero at xla_math.h:{line} by thread (2,0,0)" in row["error"]


def test_failed_device_assert_fails_the_launch_with_text_thread_and_line(faults):
    row = _row(faults, "assert")
    assert "error" in row
    assert row["error"].startswith("emulated kernel 'faults': device assertion "
                                   "`v >= 0 && \"counts are not negative\"` failed at "
                                   f"faults.cu:{_line('ASSERT')} in thread (3,0,0)")


def test_null_and_wild_pointers_are_out_of_bounds_findings(faults):
    row = _row(faults, "pointers")
    assert "error" in row
    text = "\n".join(row["findings"])
    assert f"out-of-bounds write of 4 bytes at faults.cu:{_line('NULL')}" in text
    assert f"faults.cu:{_line('UNOWNED')}" in text
    wild = [m for m in row["findings"] if f"faults.cu:{_line('WILD')}" in m]
    assert wild and "global buffer 'out' (128 bytes) at byte offset 4398046511104" in wild[0]


def test_endless_loop_meets_the_watchdog(faults):
    row = _row(faults, "spin")
    assert "error" in row
    assert row["error"].startswith("emulated kernel 'faults': the launch ran past its time "
                                   "limit of 0.5 s")
    assert f"was at faults.cu:{_line('SPIN')}" in row["error"]
    assert "threads 1-31 runnable" in row["error"]
    assert row["seconds"] < 30


@pytest.mark.parametrize("label,tag,what", [
    ("raw", "RAW", "SIGSEGV (an invalid memory access)"),
    ("overflow", "OVERFLOW", "SIGFPE (an arithmetic fault, e.g. INT_MIN / -1)")])
def test_isolated_launch_turns_an_uncontained_fault_into_an_error(faults, label, tag, what):
    row = _row(faults, label)
    assert "error" in row
    assert row["error"].startswith(f"emulated kernel 'faults': the worker process running the "
                                   f"launch stopped on {what} in thread (0,0,0) [warp 0 lane "
                                   f"0] of block (0,0,0) at faults.cu:{_line(tag)}")


def test_isolated_endless_loop_without_memory_accesses_is_stopped(faults):
    row = _row(faults, "forever")
    assert "error" in row
    assert row["error"].startswith("emulated kernel 'faults': the launch ran past its time "
                                   "limit of 0.5 s")
    assert f"stopped: thread (0,0,0) [warp 0 lane 0] of block (0,0,0) at faults.cu:" \
        f"{_line('FOREVER')}" in row["error"]
    assert row["seconds"] < 30


def test_isolated_launch_returns_outputs(faults):
    row = _row(faults, "isolated-big")
    assert "error" not in row, row["error"]
    assert row["out"] == _row(faults, "big")["out"]


def test_isolated_launch_inside_jit_returns_every_block(faults):
    row = _row(faults, "isolated-jit")
    i = np.arange(256)
    np.testing.assert_array_equal(row["out"], 2.0 * i + i // 32)
    assert row["report"]["blocks"] == 8


def test_settings_from_the_environment_are_validated(monkeypatch):
    k = _kernel(CLEAN, "clean")
    k.set_timeout(None)
    monkeypatch.setenv("JAXTILE_EMULATOR_TIMEOUT", "soon")
    with pytest.raises(EmulatorError, match=r"\$JAXTILE_EMULATOR_TIMEOUT must be a number of "
                                            r"seconds \(0: no limit\), got 'soon'"):
        k.run(np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="time limit must be a number of seconds"):
        k.set_timeout(-1)
    monkeypatch.delenv("JAXTILE_EMULATOR_TIMEOUT")
    k.set_isolate(None)
    monkeypatch.setenv("JAXTILE_EMULATOR_ISOLATE", "sometimes")
    with pytest.raises(EmulatorError, match=r"\$JAXTILE_EMULATOR_ISOLATE must be one of 1, "
                                            r"true, yes, on or 0, false, no, off, got "
                                            r"'sometimes'"):
        k.run(np.zeros(64, np.float32))


# ---- per-kernel checks and reports ----

CLEAN = _HEAD + """JT_KERNEL void clean(ptr<float> out) {
  JT_SHARED(float, s, 64);
  s[thread_idx().x] = float(thread_idx().x);
  sync_threads();
  out[thread_idx().x] = s[63 - thread_idx().x];
}
"""
# Thread t reads what thread t+1 wrote with no barrier between.
RACY = _HEAD + """JT_KERNEL void racy(ptr<float> out) {
  JT_SHARED(float, s, 64);
  s[thread_idx().x] = float(thread_idx().x);
  out[thread_idx().x] = s[(thread_idx().x + 1) % 64];
}
"""


def _kernel(source: str, name: str) -> EmulatedKernel:
    return EmulatedKernel.build(source, name, [Buffer("out", "float32")],
                                LaunchConfig((1, 1, 1), (64, 1, 1)), file=name + ".cu")


def test_set_checks_applies_to_its_own_kernel():
    quiet = _kernel(RACY, "racy")
    other = _kernel(RACY.replace("racy", "racy_too"), "racy_too")
    quiet.set_checks(False)
    try:
        quiet.run(np.zeros(64, np.float32))  # its race goes unchecked
        with pytest.raises(EmulatorError, match="data race"):
            other.run(np.zeros(64, np.float32))
    finally:
        quiet.set_checks(True)
    with pytest.raises(EmulatorError, match="data race"):
        quiet.run(np.zeros(64, np.float32))


def test_concurrent_launches_keep_separate_reports():
    clean, racy = _kernel(CLEAN, "clean"), _kernel(RACY, "racy")
    expected = np.arange(64)[::-1].astype(np.float32)
    problems = []

    def run_clean():
        for _ in range(200):
            out = np.zeros(64, np.float32)
            report = clean.run(out)
            if report["findings"] or not np.array_equal(out, expected):
                problems.append(("clean", report["findings"]))

    def run_racy():
        for _ in range(200):
            try:
                racy.run(np.zeros(64, np.float32))
                problems.append(("racy", "no error"))
            except EmulatorError as e:
                if not any("data race" in f["message"] for f in e.report["findings"]):
                    problems.append(("racy", e.report["findings"]))

    threads = [threading.Thread(target=run_clean), threading.Thread(target=run_racy)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems, problems[:3]


def test_kernel_named_like_a_c_library_function_runs():
    # Looked up by its bare name, `remainder` was libm's function, called as the kernel: the
    # launch silently did nothing.
    k = _kernel(CLEAN.replace("void clean(", "void remainder("), "remainder")
    out = np.zeros(64, np.float32)
    k.run(out)
    np.testing.assert_array_equal(out, np.arange(64)[::-1])
