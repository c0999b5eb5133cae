"""The CUDA handler against a recording stand-in for the driver (``fake_libcuda.c``): what it
asks of libcuda when it loads and launches kernels, without a GPU.

A subprocess with the stand-in first on ``LD_LIBRARY_PATH`` (the handler opens libcuda.so.1
at run time) runs a sequence of launches through ``_ffi.cuda_launch`` (what the XLA handler
does for a call) and ``_ffi.cuda_load`` (its initialize stage); the stand-in logs every
driver call, and each scenario's part of the log is checked here."""

import os
import textwrap
from pathlib import Path

import pytest
import stand_ins

from jaxtile.compiler.gpu.launch import Launch, buffer, scalar, tensor_map
from jaxtile.primitives import payload

pytestmark = stand_ins.needs_c_compiler

KEY = "5eed" * 16
# Two pointers, an int32 (negative, to check its bytes) and a float: what the kernel declares.
CUBIN = b"FAKECUBIN params=8844"
SCALE = Launch((3, 2, 1), (128, 1, 1), 0,
               (buffer(1), buffer(0), scalar("i32", -7), scalar("f32", 0.5))).encode()
BIG_SMEM = Launch((1, 1, 1), (256, 1, 1), 96 * 1024, (buffer(0),)).encode()
# Two buffers and a TMA tensor map of buffer 1 (f16, 100 rows of 72, boxes of 32 x 64
# swizzled by 64 bytes), what a pipelined sm_90a kernel takes.
TMAP = Launch((1, 1, 1), (128, 1, 1), 0,
              (buffer(0), buffer(1), tensor_map(1, 2, (72, 100), (32, 64), 64))).encode()

_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from jaxtile import _ffi
    from jaxtile.primitives import payload

    cases = json.loads(sys.argv[1])
    log = os.environ["FAKE_CUDA_LOG"]
    results = {}
    for name, how, key, text, stream, buffers, env in cases:
        with open(log, "a") as f:
            f.write("== " + name + "\\n")
        for var in ("FAKE_CUDA_LAUNCH_ERROR", "FAKE_CUDA_CURRENT_CTX",
                    "FAKE_CUDA_DRIVER_VERSION", "FAKE_CUDA_TMAP_ERROR"):
            os.environ.pop(var, None)
        os.environ.update(env)
        try:
            if how == "load":
                _ffi.cuda_load(key, text, stream)
            elif how.startswith("fill"):
                # `fill<n>`: n launches, buffer 1 moved by 0x1000 each time
                for i in range(int(how[4:])):
                    _ffi.cuda_launch(key, text, stream, [buffers[0], buffers[1] + 0x1000 * i])
            else:
                _ffi.cuda_launch(key, text, stream, buffers)
            results[name] = "ok"
        except RuntimeError as e:
            results[name] = "error: " + str(e)
    print(json.dumps(results))
""")


def _payload(key=KEY, launch=SCALE, cubin=CUBIN, ptx=b"", symbol="scale_shift"):
    return payload.pack_cuda(key=key, name="scale_shift", symbol=symbol, arch="sm_80",
                             launch=launch, cubin=cubin, ptx=ptx)


TMAP_CACHE = 256
"""The handler's tensor-map cache holds this many maps (kernels.cc's TensorMapCache)."""

PTX_13_0 = b"FAKEPTX params=8844\n.version 9.0\n.target sm_80\n"


def _cases():
    other = "7a11" * 16
    cases = [
        ("first", "launch", KEY, _payload(), 0x100, [0x1000, 0x2000]),
        ("again", "launch", KEY, _payload(), 0x100, [0x3000, 0x4000]),
        ("same-context-other-stream", "launch", KEY, _payload(), 0x1A0, [0x1000, 0x2000]),
        ("other-context", "launch", KEY, _payload(), 0x200, [0x1000, 0x2000]),
        ("initialize-stage", "load", other, _payload(key=other), 0x100, []),
        ("after-initialize", "launch", other, _payload(key=other), 0x100, [0x50, 0x60]),
        ("big-shared", "launch", "b1" * 32,
         _payload(key="b1" * 32, launch=BIG_SMEM, cubin=b"FAKECUBIN params=8"), 0x100, [0x7000]),
        ("ptx-fallback", "launch", "f0" * 32,
         _payload(key="f0" * 32, cubin=b"FAKECUBIN other-family", ptx=PTX_13_0),
         0x100, [0x10, 0x20]),
        ("no-ptx", "launch", "e0" * 32, _payload(key="e0" * 32, cubin=b"FAKECUBIN other-family"),
         0x100, [0x10, 0x20]),
        ("missing-function", "launch", "d0" * 32, _payload(key="d0" * 32, symbol="missing"),
         0x100, [0x10, 0x20]),
        ("no-context", "launch", "c0" * 32, _payload(key="c0" * 32), 0xDEAD, [0x10, 0x20]),
        ("too-few-buffers", "launch", KEY, _payload(), 0x100, [0x10]),
        ("launch-error", "launch", KEY, _payload(), 0x100, [0x10, 0x20],
         {"FAKE_CUDA_LAUNCH_ERROR": "701"}),
        # The thread already has the stream's context current: nothing is pushed.
        ("context-current", "launch", "cc" * 32, _payload(key="cc" * 32), 0x100, [0x10, 0x20],
         {"FAKE_CUDA_CURRENT_CTX": "1"}),
        # Another context is current (another runtime's, or a device switch): the launch
        # makes the stream's current around itself.
        ("other-context-current", "launch", KEY, _payload(), 0x100, [0x10, 0x20],
         {"FAKE_CUDA_CURRENT_CTX": "2"}),
        ("misaligned", "launch", KEY, _payload(), 0x100, [0x1000, 0x2004]),
        # A CUDA 12.4 driver and a kernel NVRTC 13 compiled (PTX ISA 9.0).
        ("driver-major-too-old", "launch", "a0" * 32,
         _payload(key="a0" * 32, ptx=PTX_13_0), 0x100, [0x10, 0x20],
         {"FAKE_CUDA_DRIVER_VERSION": "12040"}),
        # A CUDA 12.4 driver, a new GPU and PTX of CUDA 12.9 (ISA 8.8): the cubin would load
        # (minor version compatibility), the PTX cannot be compiled.
        ("driver-minor-too-old-for-ptx", "launch", "a1" * 32,
         _payload(key="a1" * 32, cubin=b"FAKECUBIN other-family",
                  ptx=PTX_13_0.replace(b"9.0", b"8.8")), 0x100, [0x10, 0x20],
         {"FAKE_CUDA_DRIVER_VERSION": "12040"}),
        ("tensor-map", "launch", "7e" * 32,
         _payload(key="7e" * 32, launch=TMAP, cubin=b"FAKECUBIN params=88m"), 0x100,
         [0x1000, 0x2000]),
        # The same buffers again: the map comes from the handler's cache.
        ("tensor-map-again", "launch", "7e" * 32,
         _payload(key="7e" * 32, launch=TMAP, cubin=b"FAKECUBIN params=88m"), 0x100,
         [0x1000, 0x2000]),
        # Buffer 1 elsewhere (buffer 0 has no map): encoded again.
        ("tensor-map-moved", "launch", "7e" * 32,
         _payload(key="7e" * 32, launch=TMAP, cubin=b"FAKECUBIN params=88m"), 0x100,
         [0x1000, 0x5000]),
        # The first address on another device (context 2): its own map.
        ("tensor-map-other-context", "launch", "7e" * 32,
         _payload(key="7e" * 32, launch=TMAP, cubin=b"FAKECUBIN params=88m"), 0x200,
         [0x1000, 0x2000]),
        ("tensor-map-error", "launch", "7f" * 32,
         _payload(key="7f" * 32, launch=TMAP, cubin=b"FAKECUBIN params=88m"), 0x100,
         [0x1000, 0x6000], {"FAKE_CUDA_TMAP_ERROR": "1"}),
        # A failure is not cached: the same launch without the error encodes.
        ("tensor-map-after-error", "launch", "7f" * 32,
         _payload(key="7f" * 32, launch=TMAP, cubin=b"FAKECUBIN params=88m"), 0x100,
         [0x1000, 0x6000]),
        # 256 other addresses push the first map out of the cache (least recently used).
        ("tensor-map-fill", f"fill{TMAP_CACHE}", "7e" * 32,
         _payload(key="7e" * 32, launch=TMAP, cubin=b"FAKECUBIN params=88m"), 0x100,
         [0x1000, 0x100000]),
        ("tensor-map-evicted", "launch", "7e" * 32,
         _payload(key="7e" * 32, launch=TMAP, cubin=b"FAKECUBIN params=88m"), 0x100,
         [0x1000, 0x2000]),
    ]
    return [case if len(case) == 7 else (*case, {}) for case in cases]


@pytest.fixture(scope="module")
def driver_run(tmp_path_factory):
    """``(results, log)``: each scenario's outcome, and the driver calls it made."""
    d = tmp_path_factory.mktemp("fake_cuda")
    stand_ins.build(Path(__file__).parent / "fake_libcuda.c", d / "libcuda.so.1")
    log = d / "calls.log"
    env = {**os.environ, "LD_LIBRARY_PATH": str(d), "FAKE_CUDA_LOG": str(log),
           "JAX_PLATFORMS": "cpu"}
    return stand_ins.run(_SCRIPT, _cases(), env, log)


def test_the_first_launch_loads_the_module_in_the_streams_context(driver_run):
    results, log = driver_run
    assert results["first"] == "ok"
    assert log["first"] == [
        "cuInit 0",
        "cuStreamGetCtx stream=0x100 ctx=1",
        "cuCtxPushCurrent ctx=1",
        "cuModuleLoadData ctx=1 cubin",
        "cuModuleGetFunction scale_shift",
        "cuCtxPopCurrent ctx=1",
        # The launch too, in the stream's context (the fake refuses it elsewhere).
        "cuCtxPushCurrent ctx=1",
        # The grid, block and shared memory of the launch text, on XLA's stream; the
        # parameters in order: buffer 1, buffer 0, the int32 -7's four bytes, 0.5f's.
        "cuLaunchKernel scale_shift grid=3,2,1 block=128,1,1 smem=0 stream=0x100 extra=null "
        "params=0x2000,0x1000,0xfffffff9,0x3f000000",
        "cuCtxPopCurrent ctx=1",
    ]


def test_later_launches_in_a_context_reuse_its_module(driver_run):
    results, log = driver_run
    assert results["again"] == results["same-context-other-stream"] == "ok"
    assert log["again"] == [
        "cuStreamGetCtx stream=0x100 ctx=1",
        "cuCtxPushCurrent ctx=1",
        "cuLaunchKernel scale_shift grid=3,2,1 block=128,1,1 smem=0 stream=0x100 extra=null "
        "params=0x4000,0x3000,0xfffffff9,0x3f000000",
        "cuCtxPopCurrent ctx=1"]
    assert not any("ModuleLoad" in line for line in log["same-context-other-stream"])
    assert "stream=0x1a0" in log["same-context-other-stream"][-2]


def test_each_context_gets_its_own_module(driver_run):
    results, log = driver_run
    assert results["other-context"] == "ok"
    assert "cuModuleLoadData ctx=2 cubin" in log["other-context"]


def test_the_initialize_stage_loads_and_does_not_launch(driver_run):
    results, log = driver_run
    assert results["initialize-stage"] == results["after-initialize"] == "ok"
    assert "cuModuleLoadData ctx=1 cubin" in log["initialize-stage"]
    assert not any("cuLaunchKernel" in line for line in log["initialize-stage"])
    # The call after it finds the module loaded.
    assert [line.split()[0] for line in log["after-initialize"]] == [
        "cuStreamGetCtx", "cuCtxPushCurrent", "cuLaunchKernel", "cuCtxPopCurrent"]


def test_more_than_48k_of_shared_memory_is_opted_into(driver_run):
    results, log = driver_run
    assert results["big-shared"] == "ok"
    # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, before the first launch.
    at = log["big-shared"].index("cuFuncSetAttribute scale_shift attribute=8 value=98304")
    assert "smem=98304" in log["big-shared"][at + 3]
    assert not any("cuFuncSetAttribute" in line for line in log["first"])


def test_a_cubin_for_another_family_falls_back_to_its_ptx(driver_run):
    results, log = driver_run
    assert results["ptx-fallback"] == "ok"
    assert log["ptx-fallback"][2:4] == ["cuModuleLoadData ctx=1 cubin refused",
                                        "cuModuleLoadData ctx=1 ptx"]
    assert "params=0x20,0x10" in log["ptx-fallback"][-2]
    msg = results["no-ptx"]
    assert "'scale_shift'" in msg and "CUDA_ERROR_NO_BINARY_FOR_GPU" in msg
    assert "carries no PTX" in msg


def test_the_launch_makes_the_streams_context_current_only_when_it_is_not(driver_run):
    results, log = driver_run
    assert results["context-current"] == results["other-context-current"] == "ok"
    # Context 1 is current already: loading and launching push nothing.
    assert not any(line.startswith("cuCtx") for line in log["context-current"])
    assert "cuModuleLoadData ctx=1 cubin" in log["context-current"]
    assert log["other-context-current"] == [
        "cuStreamGetCtx stream=0x100 ctx=1",
        "cuCtxPushCurrent ctx=1",
        "cuLaunchKernel scale_shift grid=3,2,1 block=128,1,1 smem=0 stream=0x100 extra=null "
        "params=0x20,0x10,0xfffffff9,0x3f000000",
        "cuCtxPopCurrent ctx=1"]


def test_a_misaligned_buffer_is_refused_before_the_launch(driver_run):
    results, log = driver_run
    msg = results["misaligned"]
    assert msg.startswith("error: jaxtile: CUDA kernel 'scale_shift'"), msg
    for w in ("buffer 1", "0x2004", "16-byte aligned"):
        assert w in msg, (w, msg)
    assert not any("cuLaunchKernel" in line for line in log["misaligned"])


def test_a_driver_older_than_the_compiling_cuda_is_named_with_what_to_install(driver_run):
    results, log = driver_run
    msg = results["driver-major-too-old"]
    for w in ("'scale_shift'", "cannot run", "supports CUDA 12.4", "compiled by CUDA 13.0",
              "release 580", "pip install 'jaxtile[cuda12]'", "jax[cuda12]"):
        assert w in msg, (w, msg)
    assert not any("ModuleLoad" in line for line in log["driver-major-too-old"])
    msg = results["driver-minor-too-old-for-ptx"]
    for w in ("'scale_shift'", "PTX cannot be compiled here", "supports CUDA 12.4",
              "CUDA 12.9", "release 575"):
        assert w in msg, (w, msg)
    assert "cuda12" not in msg  # the same major: a newer driver is the fix
    loads = [line for line in log["driver-minor-too-old-for-ptx"] if "ModuleLoad" in line]
    assert loads == ["cuModuleLoadData ctx=1 cubin refused"]


@pytest.mark.parametrize("case,words", [
    ("missing-function", ["'scale_shift'", "finding its function 'missing'",
                          "CUDA_ERROR_NOT_FOUND"]),
    ("no-context", ["'scale_shift'", "context of the stream"]),
    ("too-few-buffers", ["'scale_shift'", "called with 1 buffers", "use 2"]),
    ("launch-error", ["'scale_shift'", "failed to launch", "grid 3x2x1, block 128x1x1",
                      "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
                      "too many resources requested for launch"]),
])
def test_driver_failures_are_errors_naming_the_kernel(driver_run, case, words):
    results, _ = driver_run
    msg = results[case]
    assert msg.startswith("error: jaxtile: CUDA kernel 'scale_shift'"), msg
    for w in words:
        assert w in msg, (w, msg)


def test_tensor_maps_are_encoded_from_the_buffer_at_launch(driver_run):
    """The handler builds the map from XLA's buffer address and the shape and box the launch
    text records: dims and box innermost first, strides in bytes of the outer dimensions,
    2-byte elements as UINT16 (1), 64-byte swizzle (2), 128-byte L2 promotion (2), zeros
    out of bounds (0); the kernel gets the 128 bytes by value as its third parameter."""
    results, log = driver_run
    assert results["tensor-map"] == "ok"
    encode = [line for line in log["tensor-map"] if line.startswith("cuTensorMapEncodeTiled")]
    assert encode == [
        "cuTensorMapEncodeTiled type=1 rank=2 address=0x2000 aligned=1 dims=72,100 "
        "strides=144 box=32,64 element_strides=1,1 interleave=0 swizzle=2 l2=2 oob=0"]
    assert "params=0x1000,0x2000,0x2000" in log["tensor-map"][-2]
    msg = results["tensor-map-error"]
    assert msg.startswith("error: jaxtile: CUDA kernel 'scale_shift'"), msg
    for w in ("TMA tensor map of buffer 1", "cuTensorMapEncodeTiled", "CUDA_ERROR_INVALID_VALUE"):
        assert w in msg, (w, msg)
    assert not any("cuLaunchKernel" in line for line in log["tensor-map-error"])


def _encodes(lines):
    return [line for line in lines if line.startswith("cuTensorMapEncodeTiled")]


def test_tensor_maps_are_cached_per_context_address_and_shape(driver_run):
    """A launch on the buffers an earlier launch had passes the same 128 bytes without
    encoding; another address, another context, or a map pushed out by 256 newer ones is
    encoded again; a failed encoding is not remembered."""
    results, log = driver_run
    for case in ("tensor-map-again", "tensor-map-moved", "tensor-map-other-context",
                 "tensor-map-after-error", "tensor-map-evicted"):
        assert results[case] == "ok", (case, results[case])
    assert _encodes(log["tensor-map-again"]) == []
    assert "params=0x1000,0x2000,0x2000" in log["tensor-map-again"][-2]
    assert [line.split()[3] for line in _encodes(log["tensor-map-moved"])] == ["address=0x5000"]
    assert "params=0x1000,0x5000,0x5000" in log["tensor-map-moved"][-2]
    assert len(_encodes(log["tensor-map-other-context"])) == 1
    assert len(_encodes(log["tensor-map-after-error"])) == 1
    assert results["tensor-map-fill"] == "ok"
    assert len(_encodes(log["tensor-map-fill"])) == TMAP_CACHE
    assert [line.split()[3] for line in _encodes(log["tensor-map-evicted"])] == [
        "address=0x2000"]
    assert "params=0x1000,0x2000,0x2000" in log["tensor-map-evicted"][-2]


def test_every_context_push_is_popped(driver_run):
    _, log = driver_run
    lines = [line for part in log.values() for line in part]
    pushes = [line for line in lines if line.startswith("cuCtxPushCurrent")]
    pops = [line for line in lines if line.startswith("cuCtxPopCurrent")]
    assert len(pushes) == len(pops) > 0
    assert sum(line == "cuInit 0" for line in lines) == 1
