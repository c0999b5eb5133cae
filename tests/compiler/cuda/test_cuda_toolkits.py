"""CUDA 12 and CUDA 13: kernels are compiled by the NVRTC of the CUDA major the installed JAX
CUDA plugin runs on (``jaxtile[cuda13]`` with ``jax[cuda13]``, ``jaxtile[cuda12]`` with
``jax[cuda12]``), and the library compiles with either (the other one than the README's
CUDA 13 under ``-m slow``)."""

import importlib.metadata
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from cuda_kernels import PTXAS_BUDGETS, SCALE_SHIFT

from jaxtile.compiler.cuda import compile as cuda_compile
from jaxtile.compiler.cuda import nvrtc
from jaxtile.compiler.errors import KernelError
from jaxtile.compiler.gpu.launch import Launch
from jaxtile.compiler.target import parse_target


def _with_jax_plugins(monkeypatch, *majors):
    """Pretend that the JAX CUDA plugins of these majors are the ones installed."""
    real = importlib.metadata.version

    def version(dist):
        if dist.startswith("jax-cuda") and dist.endswith("-plugin"):
            if int(dist[len("jax-cuda"):-len("-plugin")]) in majors:
                return "0.10.2"
            raise importlib.metadata.PackageNotFoundError(dist)
        return real(dist)
    monkeypatch.setattr(importlib.metadata, "version", version)


@pytest.mark.parametrize("plugins,major", [((13,), 13), ((12,), 12), ((), None)])
def test_nvrtc_follows_the_jax_cuda_plugin(monkeypatch, tmp_path, plugins, major):
    _with_jax_plugins(monkeypatch, *plugins)
    assert nvrtc.jax_cuda_major() == major
    # A wheel of each major on the path: only the wanted one is a candidate, first.
    for m, sub in ((13, "cu13/lib"), (12, "cuda_nvrtc/lib")):
        lib = tmp_path / "nvidia" / sub / f"libnvrtc.so.{m}"
        lib.parent.mkdir(parents=True)
        lib.write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = nvrtc._candidates((major,) if major else (13, 12))
    if major:
        assert found[0] == str(tmp_path / "nvidia" / nvrtc._WHEEL_DIRS[major] /
                               f"libnvrtc.so.{major}")
        assert all(p.endswith(f".so.{major}") for p in found)
    else:
        assert found[0].endswith(".so.13") and any(p.endswith(".so.12") for p in found)


def test_a_missing_nvrtc_of_jaxs_cuda_names_the_extra_to_install(monkeypatch):
    _with_jax_plugins(monkeypatch, 12)
    monkeypatch.setattr(nvrtc, "_library", lambda: None)
    monkeypatch.setattr(cuda_compile.toolchain, "nvcc_path", lambda: None)
    with pytest.raises(KernelError) as info:
        cuda_compile.compile_kernel(SCALE_SHIFT, "scale_shift", parse_target("cuda:sm_80"),
                                    Launch((1, 1, 1), (32, 1, 1)), compiler="nvrtc")
    msg = str(info.value)
    for words in ("'scale_shift'", "NVRTC 12 was not found", "CUDA 12 (jax-cuda12-plugin)",
                  "pip install 'jaxtile[cuda12]'"):
        assert words in msg, (words, msg)


_OTHER_TOOLKIT = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    from jaxtile.compiler.cuda import nvrtc
    nvrtc.jax_cuda_major = lambda: 12   # as with jax[cuda12] installed
    import jax, jax.numpy as jnp
    from jaxtile import ops
    from jaxtile.compiler import build
    from jaxtile.compiler.cuda.compile import compile_to_library
    from jaxtile.compiler.target import parse_target
    from gemm_kernels import pipelined_gemm

    f16 = jax.ShapeDtypeStruct((4096, 4096), jnp.float16)
    rows = jax.ShapeDtypeStruct((100, 300), jnp.float32)
    q = jax.ShapeDtypeStruct((2, 4, 512, 128), jnp.bfloat16)
    lens = jax.ShapeDtypeStruct((2,), jnp.int32)
    kernels = {"gemm": (pipelined_gemm, (f16, f16), {}), "softmax": (ops.softmax, (rows,), {}),
               "attention_fwd": (ops.attention_fwd, (q, q, q, lens), {"causal": True})}
    out = {"nvrtc": nvrtc.version(), "library": nvrtc.library_path(), "kernels": {}}
    for arch in ("cuda:sm_80", "cuda:sm_90a"):
        target = parse_target(arch)
        for name, (k, args, kw) in kernels.items():
            low = k.lower(*args, target=arch, **kw)
            c = compile_to_library(build.lowered_ir(low.kernel, target), target)
            out["kernels"][f"{name} {arch}"] = [c.compiler, c.ptxas.registers, c.ptxas.spill_stores,
                                     c.ptxas.spill_loads, c.ptx[:400].decode()]
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_the_library_compiles_with_cuda_12(tmp_path):
    """The README's test command installs CUDA 13 (``jaxtile[cuda]``); this compiles the
    library's kernels with NVRTC 12.9, as ``jaxtile[cuda12]`` with ``jax[cuda12]`` does."""
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                          str(tmp_path), "nvidia-cuda-nvrtc-cu12>=12.9.86,<12.10"],
                         capture_output=True, text=True, timeout=600)
    wheels = list(tmp_path.glob("nvidia_cuda_nvrtc_cu12-*.whl"))
    if got.returncode != 0 or not wheels:
        pytest.skip("the CUDA 12 NVRTC wheel (nvidia-cuda-nvrtc-cu12) cannot be downloaded "
                    f"here: {got.stderr.strip()[-300:]}")
    root = tmp_path / "site"
    zipfile.ZipFile(wheels[0]).extractall(root)
    tests = Path(__file__).parents[2]    # gemm_kernels.py's folder
    proc = subprocess.run([sys.executable, "-c", _OTHER_TOOLKIT, str(root), str(tests)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["nvrtc"][0] == 12 and out["library"].startswith(str(root))
    for name, (compiler, registers, stores, loads, ptx) in out["kernels"].items():
        assert compiler == "nvrtc" and stores == loads == 0, (name, registers, stores, loads)
        # PTX ISA 8.8, which CUDA 12.9 drivers compile (sm_90a's cubin carries none).
        assert ("sm_90a" in name) == (ptx == "") and (not ptx or ".version 8.8" in ptx)
    for arch in ("cuda:sm_80", "cuda:sm_90a"):
        assert out["kernels"][f"gemm {arch}"][1] <= PTXAS_BUDGETS[12]["gemm_registers"]
