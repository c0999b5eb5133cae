"""The CUDA handler on a machine without an NVIDIA driver: it imports, registers, decodes
payloads like the handler does, and a launch is a clear error rather than a crash."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from jaxtile import _ffi
from jaxtile.compiler.gpu.launch import Launch, buffer, scalar
from jaxtile.primitives import payload

KEY = "c0ffee" * 10 + "abcd"
CUBIN = bytes(range(256)) * 3  # any bytes: nothing here loads them
LAUNCH = "grid=2,1,1;block=128,1,1;smem=0;params=b0,b1,i32:256"

no_driver = pytest.mark.skipif(_ffi.cuda_driver_error() == "",
                               reason="an NVIDIA driver is present: these test its absence")


def _gpu_devices():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def _payload(**overrides):
    fields = dict(key=KEY, name="scale_shift", symbol="scale_shift", arch="sm_80",
                  launch=LAUNCH, cubin=CUBIN)
    return payload.pack_cuda(**{**fields, **overrides})


def test_the_handler_stages_are_ffi_capsules():
    stages = (_ffi.cuda_initialize_handler(), _ffi.cuda_handler())
    assert all(type(s).__name__ == "PyCapsule" for s in stages)


@no_driver
def test_without_a_driver_the_reason_names_libcuda():
    assert "libcuda.so.1" in _ffi.cuda_driver_error()


@no_driver
def test_a_launch_without_a_driver_is_an_error_naming_the_kernel():
    with pytest.raises(RuntimeError) as info:
        _ffi.cuda_launch(KEY, _payload(), 0, [0, 0])
    msg = str(info.value)
    assert "CUDA kernel 'scale_shift'" in msg and "libcuda.so.1" in msg, msg
    assert "no usable NVIDIA driver" in msg
    # The process is alive, and asking again gives the same answer.
    with pytest.raises(RuntimeError, match="libcuda.so.1"):
        _ffi.cuda_launch(KEY, _payload(), 0, [])


def test_the_handler_decodes_what_python_packs():
    fields = _ffi.decode_cuda_payload(KEY, _payload())
    assert fields["cubin"] == CUBIN and fields["ptx"] == b""
    assert (fields["name"], fields["symbol"], fields["arch"], fields["launch"]) == (
        "scale_shift", "scale_shift", "sm_80", LAUNCH)
    assert fields["key"] == KEY and fields["format"] == payload.CUDA_FORMAT
    header, cubin = payload.unpack(_payload())
    assert cubin == CUBIN and header["platform"] == "cuda" and header["launch"] == LAUNCH
    # With PTX after the cubin, the two come apart where the header says.
    ptx = b"//\n.version 9.0\n.target sm_80\n"
    fields = _ffi.decode_cuda_payload(KEY, _payload(ptx=ptx))
    assert (fields["cubin"], fields["ptx"]) == (CUBIN, ptx)
    header, artifact = payload.unpack(_payload(ptx=ptx))
    assert artifact == CUBIN + ptx and header["ptx_size"] == str(len(ptx))


def test_damaged_or_foreign_payloads_are_refused():
    text = _payload()
    at = len(text) - 10
    damaged = text[:at] + ("A" if text[at] != "A" else "B") + text[at + 1:]
    with pytest.raises(RuntimeError, match="'scale_shift'.*checksum mismatch"):
        _ffi.decode_cuda_payload(KEY, damaged)
    with pytest.raises(RuntimeError, match="belongs to another kernel"):
        _ffi.decode_cuda_payload("f" * 64, text)
    cpu = payload.pack(key=KEY, name="k", symbol="s", num_blocks=1, library=b"lib",
                       signature="x:float32[1]")
    with pytest.raises(RuntimeError, match="expected the field 'platform'"):
        _ffi.decode_cuda_payload(KEY, cpu)
    newer = payload.pack_cuda(key=KEY, name="k", symbol="k", arch="sm_80", launch=LAUNCH,
                              cubin=CUBIN).replace("format=1", "format=9")
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        _ffi.decode_cuda_payload(KEY, newer)
    with pytest.raises(ValueError, match="checksum"):
        payload.unpack(damaged)


def test_the_handler_reads_launches_as_python_writes_them():
    launch = Launch((3, 2, 1), (256, 1, 1), 65536,
                    (buffer(1), buffer(0), scalar("i32", -7), scalar("f32", 0.1),
                     scalar("f64", -2.5), scalar("u64", 2**40)))
    got = _ffi.parse_cuda_launch(launch.encode())
    assert (got["grid"], got["block"], got["smem"]) == ((3, 2, 1), (256, 1, 1), 65536)
    # Scalars as the bytes the driver copies (little-endian, low bytes first).
    f32 = struct.unpack("<I", struct.pack("<f", 0.1))[0]
    f64 = struct.unpack("<Q", struct.pack("<d", -2.5))[0]
    assert got["params"] == [(True, 1), (True, 0), (False, 2**64 - 7), (False, f32),
                             (False, f64), (False, 2**40)]
    assert got["buffers_needed"] == 2


@pytest.mark.parametrize("text,why", [
    ("grid=1,1,1;block=1,1,1;smem=0", "expected grid, block, smem and params"),
    ("grid=1,1;block=1,1,1;smem=0;params=", "three extents"),
    ("grid=1,0,1;block=1,1,1;smem=0;params=", "positive"),
    ("grid=1,1,1;block=1,1,1;smem=-1;params=", "not a number"),
    ("grid=1,1,1;block=1,1,1;smem=0;params=f16:1", "unknown parameter 'f16:1'"),
    ("grid=1,1,1;block=1,1,1;smem=0;params=f32:x", "'x' is not a float"),
])
def test_bad_launch_text_is_refused_with_the_reason(text, why):
    with pytest.raises(ValueError, match=why):
        _ffi.parse_cuda_launch(text)


@pytest.mark.skipif(bool(_gpu_devices()), reason="a GPU is present: this tests its absence")
def test_the_gpu_check_says_there_is_no_gpu():
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_check.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["gpu"] is None and report["not_run"].startswith("no GPU")
    assert report["toolchain"]["driver"] == _ffi.cuda_driver_error()
