"""Compiling CUDA text to cubins: NVRTC in process, nvcc as the fallback, ptxas' report,
failures with a repro command, the toolchain's identity in the content key, SASS counts."""

import shlex
import subprocess

import pytest
from cuda_kernels import SCALE_SHIFT, gemm_source, needs_compiler, needs_nvrtc

from jaxtile.compiler import cache, target
from jaxtile.compiler.cuda import fingerprint, nvrtc, sass
from jaxtile.compiler.cuda.compile import arch_of, compile_kernel
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu.launch import Launch, buffer, scalar
from jaxtile.compiler.target import parse_target

GEMM_LAUNCH = Launch((4, 4, 1), (128, 1, 1), 0,
                     (buffer(0), buffer(1), buffer(2), *[scalar("i32", 512)] * 3))
SM80 = parse_target("cuda:sm_80")
SM90A = parse_target("cuda:sm_90a")
ELF = b"\x7fELF"


@pytest.fixture(scope="module")
def gemm_cubins():
    """The GEMM compiled by every compiler present, for sm_80 (compiled once per module)."""
    found = {}
    for which, present in (("nvrtc", fingerprint.nvrtc.available()),
                           ("nvcc", fingerprint.toolchain.nvcc_path() is not None)):
        if present:
            found[which] = compile_kernel(gemm_source(), "gemm_f16", SM80, GEMM_LAUNCH,
                                          compiler=which)
    return found


@needs_compiler
@pytest.mark.parametrize("which", ["nvrtc", "nvcc"])
def test_gemm_compiles_to_a_cubin_with_the_ptxas_report(gemm_cubins, which):
    if which not in gemm_cubins:
        pytest.skip(f"{which} is not installed here")
    c = gemm_cubins[which]
    assert c.cubin.startswith(ELF) and c.compiler == which and c.arch == "sm_80"
    # The PTX rides along for GPUs of later families, which the sm_80 cubin does not run on.
    assert c.ptx.startswith(b"//") and b".target sm_80" in c.ptx and b"gemm_f16" in c.ptx
    # The GEMM keeps its 3 stages of A and B tiles in static shared memory: 3 * 2 * 8 KiB.
    assert c.ptxas.shared_bytes == 3 * (128 * 32 + 32 * 128) * 2
    assert 64 < c.ptxas.registers <= 255
    assert c.ptxas.spill_stores == c.ptxas.spill_loads == 0
    assert "Used" in c.log and c.seconds > 0


@needs_nvrtc
def test_sm90a_compiles_for_the_arch_specific_variant():
    c = compile_kernel(SCALE_SHIFT, "scale_shift", SM90A, Launch((1, 1, 1), (128, 1, 1)),
                       compiler="nvrtc")
    assert c.arch == "sm_90a" and c.cubin.startswith(ELF)
    assert c.ptx == b""  # sm_90a PTX runs on sm_90 only, where the cubin runs too
    assert c.ptxas.registers > 0 and c.ptxas.shared_bytes == 0


LOWERED_TARGETS = [n for n in target.KNOWN if n.startswith("cuda:") and n != "cuda:sm_75"]


@needs_nvrtc
@pytest.mark.parametrize("name", LOWERED_TARGETS)
def test_nvrtc_compiles_a_cubin_for_every_target(name):
    t = parse_target(name)
    arch = arch_of(t)
    if t.caps.sm not in nvrtc.supported_archs():
        pytest.skip(f"NVRTC {nvrtc.version()} cannot emit {arch} (it knows "
                    f"{nvrtc.supported_archs()})")
    c = compile_kernel(SCALE_SHIFT, "scale_shift", t, Launch((1, 1, 1), (128, 1, 1)),
                       compiler="nvrtc")
    assert c.arch == arch == name[5:] and c.cubin.startswith(ELF)
    # The ELF header's flags name the architecture (bits 8-15: 80 for sm_80).
    assert (int.from_bytes(c.cubin[0x30:0x34], "little") >> 8) & 0xFF == t.caps.sm
    # A plain target's PTX rides along for later GPUs; an arch-specific one's runs nowhere
    # else, so there is none.
    if t.caps.arch_specific:
        assert c.ptx == b""
    else:
        assert f".target {arch}".encode() in c.ptx


def test_an_architecture_nvrtc_cannot_emit_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(nvrtc, "available", lambda: True)
    monkeypatch.setattr(nvrtc, "version", lambda: (12, 8))
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: (75, 80, 86, 87, 89, 90, 100, 120))
    with pytest.raises(KernelError, match=r"'scale_shift': NVRTC 12.8 cannot compile for "
                                          r"sm_103 .*sm_120\): install a newer release"):
        compile_kernel(SCALE_SHIFT, "scale_shift", parse_target("cuda:sm_103"),
                       Launch((1, 1, 1), (32, 1, 1)), compiler="nvrtc")


@needs_compiler
@pytest.mark.parametrize("which", ["nvrtc", "nvcc"])
def test_a_failing_compile_is_a_kernel_error_with_a_repro(which, tmp_path, monkeypatch):
    if which == "nvrtc" and not fingerprint.nvrtc.available():
        pytest.skip("NVRTC not found (pip install 'jaxtile[cuda]')")
    if which == "nvcc" and fingerprint.toolchain.nvcc_path() is None:
        pytest.skip("nvcc not on PATH")
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    bad = SCALE_SHIFT.replace("x[i] * a", "x[i] * undeclared_thing")
    with pytest.raises(KernelError) as info:
        compile_kernel(bad, "scale_shift", SM80, Launch((1, 1, 1), (32, 1, 1)), compiler=which)
    msg = str(info.value)
    assert "scale_shift" in msg and "undeclared_thing" in msg and which in msg, msg
    command = msg.split("To reproduce: ", 1)[1].strip()
    argv = shlex.split(command)
    assert argv[0] == "nvcc" and "-arch=sm_80" in argv
    source = argv[-1]
    assert source.startswith(str(tmp_path)) and open(source).read() == bad
    if fingerprint.toolchain.nvcc_path() is not None:
        # The command reproduces the error.
        proc = subprocess.run(argv, capture_output=True, text=True)
        assert proc.returncode != 0 and "undeclared_thing" in proc.stderr


@needs_compiler
def test_launches_the_target_cannot_run_are_kernel_errors():
    with pytest.raises(KernelError, match="2048 threads per block exceed the 1024"):
        compile_kernel(SCALE_SHIFT, "scale_shift", SM80, Launch((1, 1, 1), (1024, 2, 1)))
    with pytest.raises(KernelError, match=r"0 static \+ 200000 dynamic\) exceed the 166912"):
        compile_kernel(SCALE_SHIFT, "scale_shift", SM80, Launch((1, 1, 1), (32, 1, 1), 200000))
    with pytest.raises(KernelError, match="has no kernel of that name"):
        compile_kernel(SCALE_SHIFT, "other_name", SM80, Launch((1, 1, 1), (32, 1, 1)))


def test_the_toolchain_and_the_header_are_in_the_target_description(monkeypatch, tmp_path):
    described = SM80.describe()
    assert fingerprint.toolchain_fingerprint() in described
    assert fingerprint.header_digest() in described
    assert (fingerprint.toolchain_fingerprint("nvcc")
            != fingerprint.toolchain_fingerprint("nvrtc"))
    # An edit of the device header changes the digest.
    copy = tmp_path / "device"
    (copy / "jaxtile").mkdir(parents=True)
    for f in (fingerprint.DEVICE_INCLUDE / "jaxtile").iterdir():
        (copy / "jaxtile" / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(fingerprint, "DEVICE_INCLUDE", copy)
    assert fingerprint.header_digest.__wrapped__() == fingerprint.header_digest()
    with open(copy / "jaxtile" / "device.h", "a") as f:
        f.write("// edited\n")
    assert fingerprint.header_digest.__wrapped__() != fingerprint.header_digest()


def test_a_missing_compiler_is_a_kernel_error(monkeypatch):
    monkeypatch.setattr(fingerprint.nvrtc, "available", lambda: False)
    monkeypatch.setattr(fingerprint.toolchain, "nvcc_path", lambda: None)
    for which in ("nvrtc", "nvcc", "auto"):
        with pytest.raises(KernelError, match=r"'scale_shift': no CUDA compiler .*jaxtile\[cuda\]"):
            compile_kernel(SCALE_SHIFT, "scale_shift", SM80, Launch((1, 1, 1), (32, 1, 1)),
                           compiler=which)


def test_an_unknown_compiler_choice_is_an_error(monkeypatch):
    monkeypatch.setenv("JAXTILE_CUDA_COMPILER", "clang")
    with pytest.raises(KernelError, match="unknown CUDA compiler 'clang'"):
        fingerprint.choose_compiler()


def test_launch_text_round_trips_and_rejects_bad_parameters():
    launch = Launch((3, 2, 1), (256, 1, 1), 65536,
                    (buffer(1), buffer(0), scalar("i32", -7), scalar("f32", 0.1),
                     scalar("u64", 2**40)))
    assert Launch.decode(launch.encode()) == launch
    assert launch.encode() == ("grid=3,2,1;block=256,1,1;smem=65536;"
                               "params=b1,b0,i32:-7,f32:0.1,u64:1099511627776")
    for bad in ({"grid": (0, 1, 1)}, {"block": (1, 1)}, {"params": ("x1",)}):
        with pytest.raises(ValueError):
            Launch(**{"grid": (1, 1, 1), "block": (1, 1, 1), **bad})
    with pytest.raises(ValueError):
        scalar("f16", 1.0)


@needs_compiler
def test_a_cubin_entry_round_trips_through_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    launch = Launch((2, 1, 1), (128, 1, 1), 0, (buffer(0), buffer(1), scalar("i32", 256),
                                                scalar("f32", 2.0), scalar("f32", 1.0)))
    c = compile_kernel(SCALE_SHIFT, "scale_shift", SM80, launch)
    key = cache.content_key("test-cubin-entry", SM80.describe())
    stored = c.store(key)
    cache.clear_memory()
    entry = cache.lookup(key)
    assert entry == stored and entry.kind == cache.CUDA_CUBIN
    assert Launch.decode(entry.launch) == launch and entry.symbol == "scale_shift"
    assert entry.num_blocks == 2 and entry.meta.ptx_bytes == len(c.ptx) > 0
    with open(entry.library, "rb") as f:
        assert f.read() == c.cubin + c.ptx
    with pytest.raises(ValueError, match="launch configuration goes with a cubin"):
        cache.store(key, c.cubin, "scale_shift", 2, kind=cache.CUDA_CUBIN)


@pytest.mark.skipif(sass.cuobjdump_path() is None,
                    reason="cuobjdump not found (pip install 'jaxtile[cuda]')")
def test_sass_counts_show_the_tensor_core_path(gemm_cubins):
    if not gemm_cubins:
        pytest.skip("no CUDA compiler")
    counts = sass.sass_counts(next(iter(gemm_cubins.values())).cubin)
    assert counts is not None, "cuobjdump is installed but could not disassemble the cubin"
    # mma.sync m16n8k16 -> HMMA, ldmatrix -> LDSM, cp.async -> LDGSTS; 2x2 warps of 64x64
    # per 32-deep k-tile: (64/16) * (64/8) * (32/16) = 64 HMMA per warp per k-tile.
    assert counts["HMMA"] >= 64 and counts["LDSM"] > 0 and counts["LDGSTS"] > 0
    assert counts["EXIT"] >= 1
    assert sum(counts.values()) > counts["HMMA"]
