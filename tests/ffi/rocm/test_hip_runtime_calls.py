"""The ROCm handler against a recording stand-in for the HIP runtime
(``fake_libamdhip64.c``): what it asks of libamdhip64 when it loads and launches kernels,
without an AMD GPU.

A subprocess with ``$JAXTILE_HIP_RUNTIME`` naming the stand-in (the handler opens the runtime
at run time) runs a sequence of launches through ``_ffi.rocm_launch`` (what the XLA handler
does for a call) and ``_ffi.rocm_load`` (its initialize stage); the stand-in logs every call,
and each scenario's part of the log is checked here."""

import ctypes.util
import os
import textwrap
from pathlib import Path

import pytest
import stand_ins

from jaxtile.compiler.gpu.launch import Launch, buffer, dimension, scalar
from jaxtile.primitives import payload

pytestmark = stand_ins.needs_c_compiler

KEY = "5eed" * 16
# Two pointers, an int32 (negative, to check its bytes) and a float: what the kernel declares.
CODE = b"FAKECO gfx942 params=8844"
SCALE = Launch((3, 2, 1), (256, 1, 1), 4096,
               (buffer(1), buffer(0), scalar("i32", -7), scalar("f32", 0.5))).encode()
# A kernel with a dynamic size: 128 elements a block, the count from buffer 0's dimension 0.
DYNAMIC = Launch(("floordiv(dim0_0+127,128)", 1, 1), (128, 1, 1), 0,
                 (buffer(0), buffer(1), dimension(0, 0))).encode()

_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from jaxtile import _ffi

    cases = json.loads(sys.argv[1])
    log = os.environ["FAKE_HIP_LOG"]
    results = {}
    for name, how, key, text, stream, buffers, shapes, env in cases:
        with open(log, "a") as f:
            f.write("== " + name + "\\n")
        os.environ.pop("FAKE_HIP_LAUNCH_ERROR", None)
        os.environ.update(env)
        try:
            if how == "load":
                _ffi.rocm_load(key, text, stream)
            else:
                _ffi.rocm_launch(key, text, stream, buffers, shapes)
            results[name] = "ok"
        except RuntimeError as e:
            results[name] = "error: " + str(e)
    print(json.dumps(results))
""")


def _payload(key=KEY, launch=SCALE, code=CODE, symbol="jt_scale_shift", arch="gfx942"):
    """A payload with one code object, for ``arch``."""
    return payload.pack_hip(key=key, name="scale_shift",
                            code=[payload.HipCode(arch, symbol, launch, code)])


# The same kernel for gfx90a (with a grid of its own), to come first in a payload.
GFX90A = payload.HipCode("gfx90a", "jt_scale_shift_90a",
                         Launch((7, 1, 1), (64, 1, 1), 0, (buffer(0), buffer(1))).encode(),
                         b"FAKECO gfx90a params=88")


def _cases():
    other = "7a11" * 16
    dyn = "d1" * 32
    damaged = _payload(key="da" * 32).replace("jt_scale_shift", "jt_scale_shifx")
    dyn_code = b"FAKECO gfx942 params=884"
    both = payload.pack_hip(key="b0" * 32, name="scale_shift",
                            code=[GFX90A, payload.HipCode("gfx942", "jt_scale_shift", SCALE, CODE)])
    cases = [
        ("first", "launch", KEY, _payload(), 0x100, [0x1000, 0x2000]),
        ("again", "launch", KEY, _payload(), 0x100, [0x3000, 0x4000]),
        ("same-device-other-stream", "launch", KEY, _payload(), 0x1A0, [0x1000, 0x2000]),
        ("other-device", "launch", KEY, _payload(), 0x200, [0x1000, 0x2000]),
        ("initialize-stage", "load", other, _payload(key=other), 0x100, []),
        ("after-initialize", "launch", other, _payload(key=other), 0x100, [0x50, 0x60]),
        ("dynamic", "launch", dyn, _payload(key=dyn, launch=DYNAMIC, code=dyn_code),
         0x100, [0x10, 0x20], [[1000], [1000]]),
        ("dynamic-other-size", "launch", dyn,
         _payload(key=dyn, launch=DYNAMIC, code=dyn_code), 0x100, [0x10, 0x20], [[129], [129]]),
        ("dynamic-empty", "launch", dyn,
         _payload(key=dyn, launch=DYNAMIC, code=dyn_code), 0x100, [0x10, 0x24], [[0], [0]]),
        # Both architectures, gfx90a's first: device 0 (a gfx942) takes the second, device 2
        # (a gfx90a) the first, each with its own symbol and launch.
        ("both-archs-gfx942", "launch", "b0" * 32, both, 0x100, [0x1000, 0x2000]),
        ("both-archs-gfx90a", "launch", "b0" * 32, both, 0x300, [0x1000, 0x2000]),
        ("other-arch", "launch", "e0" * 32,
         _payload(key="e0" * 32, code=b"FAKECO gfx90a params=8844", arch="gfx90a"), 0x100,
         [0x10, 0x20]),
        ("features-refused", "launch", "e1" * 32,
         _payload(key="e1" * 32, code=b"FAKECO gfx942:xnack+ params=8844"), 0x100,
         [0x10, 0x20]),
        ("no-properties", "launch", "e2" * 32, _payload(key="e2" * 32), 0xA00, [0x10, 0x20]),
        ("missing-function", "launch", "f0" * 32, _payload(key="f0" * 32, symbol="missing"),
         0x100, [0x10, 0x20]),
        ("no-device", "launch", "c0" * 32, _payload(key="c0" * 32), 0xDEAD, [0x10, 0x20]),
        ("too-few-buffers", "launch", KEY, _payload(), 0x100, [0x10]),
        ("launch-error", "launch", KEY, _payload(), 0x100, [0x10, 0x20], [],
         {"FAKE_HIP_LAUNCH_ERROR": "701"}),
        ("misaligned", "launch", KEY, _payload(), 0x100, [0x1000, 0x2004]),
        ("damaged-payload", "launch", "da" * 32, damaged, 0x100, [0x10, 0x20]),
    ]
    return [case + ([], {})[len(case) - 6:] for case in cases]


ARCHS = "gfx942:sramecc+:xnack-,gfx942:sramecc+:xnack-,gfx90a:sramecc+:xnack-"


def _run(tmp, cases, env):
    """Runs ``cases`` in a fresh process; ``(results, log by case)``."""
    log = tmp / "calls.log"
    log.unlink(missing_ok=True)
    # Only the runtime ``env`` names: none from the environment running the tests.
    env = {**{k: v for k, v in os.environ.items() if k != "JAXTILE_HIP_RUNTIME"},
           "FAKE_HIP_LOG": str(log), "JAX_PLATFORMS": "cpu", **env}
    return stand_ins.run(_SCRIPT, cases, env, log)


@pytest.fixture(scope="module")
def fake_runtime(tmp_path_factory):
    d = tmp_path_factory.mktemp("fake_hip")
    return d, stand_ins.build(Path(__file__).parent / "fake_libamdhip64.c", d / "libamdhip64.so")


@pytest.fixture(scope="module")
def runtime_run(fake_runtime):
    """``(results, log)``: each scenario's outcome, and the runtime calls it made."""
    d, lib = fake_runtime
    # Devices 0 and 1 are MI300s, device 2 an MI250 (gcnArchName as ROCm reports them).
    return _run(d, _cases(), {"JAXTILE_HIP_RUNTIME": str(lib), "FAKE_HIP_ARCH": ARCHS})


def test_the_first_launch_loads_the_module_on_the_streams_device(runtime_run):
    results, log = runtime_run
    assert results["first"] == "ok"
    assert log["first"] == [
        "hipInit 0",
        "hipStreamGetDevice stream=0x100 device=0",
        # The device's architecture chooses the code object.
        "hipGetDevicePropertiesR0600 device=0 gcnArchName=gfx942:sramecc+:xnack-",
        # Device 0 is current already: nothing is switched.
        "hipModuleLoadData device=0",
        "hipModuleGetFunction jt_scale_shift",
        # The grid, block and LDS bytes of the launch text, on XLA's stream; the parameters
        # in order: buffer 1, buffer 0, the int32 -7's four bytes, 0.5f's.
        "hipModuleLaunchKernel jt_scale_shift grid=3,2,1 block=256,1,1 smem=4096 "
        "stream=0x100 extra=null params=0x2000,0x1000,0xfffffff9,0x3f000000",
    ]


def test_later_launches_on_a_device_reuse_its_module(runtime_run):
    results, log = runtime_run
    assert results["again"] == results["same-device-other-stream"] == "ok"
    assert log["again"] == [
        "hipStreamGetDevice stream=0x100 device=0",
        "hipModuleLaunchKernel jt_scale_shift grid=3,2,1 block=256,1,1 smem=4096 "
        "stream=0x100 extra=null params=0x4000,0x3000,0xfffffff9,0x3f000000"]
    assert not any("ModuleLoad" in line for line in log["same-device-other-stream"])
    assert "stream=0x1a0" in log["same-device-other-stream"][-1]


def test_each_device_gets_its_own_module_loaded_with_that_device_current(runtime_run):
    results, log = runtime_run
    assert results["other-device"] == "ok"
    assert log["other-device"] == [
        "hipStreamGetDevice stream=0x200 device=1",
        "hipGetDevicePropertiesR0600 device=1 gcnArchName=gfx942:sramecc+:xnack-",
        "hipSetDevice 1",
        "hipModuleLoadData device=1",
        "hipModuleGetFunction jt_scale_shift",
        "hipSetDevice 0",  # the thread's device is restored
        # The fake refuses a launch of another device's module: this one is device 1's.
        "hipModuleLaunchKernel jt_scale_shift grid=3,2,1 block=256,1,1 smem=4096 "
        "stream=0x200 extra=null params=0x2000,0x1000,0xfffffff9,0x3f000000"]


def test_the_initialize_stage_loads_and_does_not_launch(runtime_run):
    results, log = runtime_run
    assert results["initialize-stage"] == results["after-initialize"] == "ok"
    assert "hipModuleLoadData device=0" in log["initialize-stage"]
    assert not any("Launch" in line for line in log["initialize-stage"])
    assert [line.split()[0] for line in log["after-initialize"]] == [
        "hipStreamGetDevice", "hipModuleLaunchKernel"]


def test_dynamic_sizes_set_the_grid_and_size_parameter_from_the_shapes(runtime_run):
    results, log = runtime_run
    assert results["dynamic"] == results["dynamic-other-size"] == "ok"
    # ceil(1000 / 128) = 8 blocks, the size 1000 (0x3e8) as the int parameter.
    assert log["dynamic"][-1] == (
        "hipModuleLaunchKernel jt_scale_shift grid=8,1,1 block=128,1,1 smem=0 stream=0x100 "
        "extra=null params=0x10,0x20,0x3e8")
    # Another size: the same module (one key for every size), 2 blocks, 129.
    assert log["dynamic-other-size"] == [
        "hipStreamGetDevice stream=0x100 device=0",
        "hipModuleLaunchKernel jt_scale_shift grid=2,1,1 block=128,1,1 smem=0 stream=0x100 "
        "extra=null params=0x10,0x20,0x81"]
    # No elements: no blocks, no launch (HIP refuses an empty grid), and the buffers of an
    # empty batch need not be aligned.
    assert results["dynamic-empty"] == "ok"
    assert not any("Launch" in line for line in log["dynamic-empty"])


def test_each_device_loads_the_code_object_for_its_architecture(runtime_run):
    results, log = runtime_run
    assert results["both-archs-gfx942"] == results["both-archs-gfx90a"] == "ok"
    # The gfx942 device: the second code object, its symbol and launch.
    assert log["both-archs-gfx942"][1:] == [
        "hipGetDevicePropertiesR0600 device=0 gcnArchName=gfx942:sramecc+:xnack-",
        "hipModuleLoadData device=0",
        "hipModuleGetFunction jt_scale_shift",
        "hipModuleLaunchKernel jt_scale_shift grid=3,2,1 block=256,1,1 smem=4096 "
        "stream=0x100 extra=null params=0x2000,0x1000,0xfffffff9,0x3f000000"]
    # The gfx90a device, same call: the first code object (the stand-in refuses a code
    # object of another architecture), with gfx90a's symbol and grid.
    assert log["both-archs-gfx90a"][1:] == [
        "hipGetDevicePropertiesR0600 device=2 gcnArchName=gfx90a:sramecc+:xnack-",
        "hipSetDevice 2",
        "hipModuleLoadData device=2",
        "hipModuleGetFunction jt_scale_shift_90a",
        "hipSetDevice 0",
        "hipModuleLaunchKernel jt_scale_shift_90a grid=7,1,1 block=64,1,1 smem=0 "
        "stream=0x300 extra=null params=0x1000,0x2000"]


def test_a_device_whose_architecture_has_no_code_object_is_named(runtime_run):
    results, log = runtime_run
    msg = results["other-arch"]
    for w in ("jaxtile: HIP kernel 'scale_shift'", "no code object for device 0",
              "a gfx942 (gfx942:sramecc+:xnack-)", "carries code for gfx90a only",
              "JAXTILE_ROCM_ARCHS"):
        assert w in msg, (w, msg)
    # Nothing is loaded: the choice is made before the runtime sees any code.
    assert not any("ModuleLoad" in line for line in log["other-arch"])


def test_a_code_object_the_runtime_refuses_is_named(runtime_run):
    # The architecture matches, the feature flags do not: HIP's own refusal, explained.
    results, log = runtime_run
    msg = results["features-refused"]
    for w in ("jaxtile: HIP kernel 'scale_shift'", "compiled for gfx942", "device 0",
              "feature flags", "hipErrorNoBinaryForGpu"):
        assert w in msg, (w, msg)
    assert log["features-refused"][-1] == "hipModuleLoadData device=0 refused"


def test_a_misaligned_buffer_is_refused_before_the_launch(runtime_run):
    results, log = runtime_run
    msg = results["misaligned"]
    assert msg.startswith("error: jaxtile: HIP kernel 'scale_shift'"), msg
    for w in ("buffer 1", "0x2004", "16-byte aligned"):
        assert w in msg, (w, msg)
    assert not any("Launch" in line for line in log["misaligned"])


@pytest.mark.parametrize("case,words", [
    ("missing-function", ["finding its function 'missing'", "hipErrorNotFound"]),
    ("no-properties", ["asking device 9 for its architecture", "hipErrorInvalidDevice"]),
    ("no-device", ["device of the stream", "hipErrorInvalidHandle"]),
    ("too-few-buffers", ["called with 1 buffers", "use 2"]),
    ("launch-error", ["failed to launch", "grid 3x2x1, block 256x1x1, 4096 B",
                      "hipErrorLaunchOutOfResources", "too many resources requested"]),
])
def test_runtime_failures_are_errors_naming_the_kernel(runtime_run, case, words):
    results, _ = runtime_run
    msg = results[case]
    assert msg.startswith("error: jaxtile: HIP kernel 'scale_shift'"), msg
    for w in words:
        assert w in msg, (w, msg)


def test_a_damaged_payload_names_the_kernel_and_loads_nothing(runtime_run):
    results, log = runtime_run
    msg = results["damaged-payload"]
    for w in ("'scale_shift'", "checksum mismatch"):
        assert w in msg, (w, msg)
    assert not any("ModuleLoad" in line for line in log["damaged-payload"])


def test_without_the_runtime_a_launch_says_rocm_is_missing(fake_runtime):
    d, _ = fake_runtime
    case = [("first", "launch", KEY, _payload(), 0x100, [0x1000, 0x2000], [], {})]
    results, _ = _run(d, case, {"JAXTILE_HIP_RUNTIME": str(d / "absent" / "libamdhip64.so")})
    msg = results["first"]
    for w in ("jaxtile: HIP kernel 'scale_shift'", "cannot run", "JAXTILE_HIP_RUNTIME",
              "absent/libamdhip64.so", "could not be loaded"):
        assert w in msg, (w, msg)



def test_without_rocm_installed_a_launch_says_what_is_missing(fake_runtime):
    if ctypes.util.find_library("amdhip64") or os.path.exists("/opt/rocm/lib/libamdhip64.so"):
        pytest.skip("this machine has a HIP runtime: the message for its absence cannot show")
    d, _ = fake_runtime
    case = [("first", "launch", KEY, _payload(), 0x100, [0x1000, 0x2000], [], {})]
    results, _ = _run(d, case, {})
    msg = results["first"]
    for w in ("jaxtile: HIP kernel 'scale_shift'", "libamdhip64.so could not be loaded",
              "no usable ROCm install", "JAXTILE_HIP_RUNTIME"):
        assert w in msg, (w, msg)
