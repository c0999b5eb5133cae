"""The jaxtile command on a real cache and a real kernel file."""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from jaxtile import _ffi, cli
from jaxtile.compiler import cache, target

_KERNEL_FILE = textwrap.dedent("""
    import jaxtile as jt

    @jt.kernel
    def cli_scale(x, *, factor=2.0, bm=4):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * factor
        return out

    not_a_kernel = 3


    def scale_jnp(x):
        return x * 2.0


    def off_by_one_jnp(x):
        return x * 2.0 + 1.0
""")


@pytest.fixture(scope="module")
def kernel_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "scaling.py"
    path.write_text(_KERNEL_FILE)
    return path


@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory, kernel_file):
    """A cache directory holding one compiled kernel, loaded from the file the CLI reads."""
    root = tmp_path_factory.mktemp("cli-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXTILE_CACHE_DIR", str(root))
        cache.clear_memory()
        scale = cli.load_kernel(f"{kernel_file}:cli_scale")
        x = jnp.arange(4, dtype=jnp.float32)
        np.testing.assert_allclose(scale(x, factor=3.0), np.arange(4) * 3.0)
        cache.clear_memory()
    return root


@pytest.fixture
def cache_copy(filled_cache, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    shutil.copytree(filled_cache, root)
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(root))
    cache.clear_memory()
    yield root
    cache.clear_memory()


def _run(capsys, *argv):
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_cache_ls_stats_verify_clear(cache_copy, capsys):
    status, out, _ = _run(capsys, "cache", "ls")
    (line, summary) = out.splitlines()
    key = next(cache_copy.glob("*/*.json")).stem
    kind = cache.CPU_OBJECT if _ffi.CPU_LINKS_OBJECTS else cache.CPU_SHARED_LIBRARY
    assert status == 0 and line.startswith(key[:16]) and kind in line
    assert "cli_scale" in line and summary == f"1 entries in {cache_copy}"

    status, out, _ = _run(capsys, "cache", "stats")
    assert status == 0 and "entries: 1 (" in out and f"  {kind}: 1" in out

    assert _run(capsys, "cache", "verify")[:2] == (0, "1 entries checked, 0 damaged\n")
    artifact = next(cache_copy.glob("*/*.so"))
    artifact.write_bytes(artifact.read_bytes() + b"tampered")
    status, out, _ = _run(capsys, "cache", "verify")
    assert status == 1
    assert out.startswith(f"{key}: its record or artifact fails its checksum or format check")
    assert "1 entries checked, 1 damaged" in out

    status, out, _ = _run(capsys, "cache", "clear", "--older-than", "1h")
    assert status == 0 and out.startswith("removed 0 files (0 B)")
    status, out, _ = _run(capsys, "cache", "clear")
    assert status == 0 and out.startswith("removed 2 files") and not artifact.exists()


def test_cache_clear_rejects_a_bad_duration(cache_copy, capsys):
    status, out, err = _run(capsys, "cache", "clear", "--older-than", "soon")
    assert status == 2 and out == ""
    assert err.startswith("jaxtile cache: --older-than: bad duration 'soon'")
    assert next(cache_copy.glob("*/*.so")).exists()


def test_inspect_prints_the_ir_and_source(filled_cache, kernel_file, capsys, monkeypatch):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(filled_cache))
    ref = f"{kernel_file}:cli_scale"
    expected = cli.load_kernel(ref).lower(jnp.ones((8, 4), jnp.float32), factor=0.5)
    status, out, _ = _run(capsys, "inspect", ref, "--arg", "f32[8,4]", "--param", "factor=0.5")
    assert status == 0 and out == expected.tile_ir + "\n"
    status, out, _ = _run(capsys, "inspect", ref, "--arg", "f32[8,4]", "--param", "factor=0.5",
                          "--show", "source", "--show", "lowered")
    assert status == 0
    assert out == f"== source ==\n{expected.source}\n== lowered ==\n{expected.lowered_ir}\n"


def test_inspect_cuda_shared_memory_and_layouts(kernel_file, capsys):
    ref = f"{kernel_file}:cli_scale"
    expected = cli.load_kernel(ref).lower(jnp.ones((8, 4), jnp.bfloat16), target="cuda:sm_80")
    status, out, _ = _run(capsys, "inspect", ref, "--arg", "bf16[8,4]", "--target", "cuda:sm_80",
                          "--show", "smem", "--show", "layouts")
    assert status == 0 and out.startswith(f"== smem ==\n{expected.shared_memory}\n")
    layouts = out.split("== layouts ==\nregister tile layouts:\n")[1]
    tiles, conversions = layouts.split("layout conversions:\n")
    tile_lines = [line.strip() for line in tiles.splitlines()]
    assert tile_lines and all("]#" in line for line in tile_lines)
    assert set(tile_lines) <= {line.strip() for line in expected.lowered_ir.splitlines()}
    assert [c.strip() for c in conversions.splitlines()] == (list(expected.conversions) or ["none"])


def test_bench_times_and_compares(kernel_file, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    common = [f"{kernel_file}:cli_scale", "--arg", "f32[64,8]", "--runs", "3"]
    status, out, _ = _run(capsys, "bench", *common, "--against", f"{kernel_file}:scale_jnp")
    lines = out.splitlines()
    assert status == 0 and lines[0] == "backend cpu, median of 3 runs"
    assert lines[1].startswith("cli_scale") and lines[1].endswith(" ms")
    assert lines[2].startswith(f"{kernel_file}:scale_jnp") and "x the kernel's time)" in lines[2]
    assert lines[3] == "max |difference| 0: results agree"

    status, out, _ = _run(capsys, "bench", *common, "--against",
                          f"{kernel_file}:off_by_one_jnp")
    assert status == 1 and out.splitlines()[3] == "max |difference| 1: RESULTS DIFFER"


def test_bench_errors_name_the_mistake(kernel_file, capsys):
    common = ["bench", f"{kernel_file}:cli_scale", "--arg", "f32[8]"]
    status, _, err = _run(capsys, *common, "--against", "jax.numpy:no_such_function")
    assert status == 2 and err == "jaxtile bench: --against: jax.numpy has no function " \
        "no_such_function\n"
    status, _, err = _run(capsys, *common, "--against", "no_such_module_xyz:f")
    assert status == 2 and "--against: cannot import no_such_module_xyz" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["{file}"], "expected path/to/file.py:kernel_name"),
    (["{file}:missing"], "missing is not defined, not a jaxtile kernel"),
    (["{file}:not_a_kernel"], "not_a_kernel is a int, not a jaxtile kernel"),
    (["nowhere.py:k"], "nowhere.py: no such file"),
    (["{file}:cli_scale", "--arg", "f32(8)"], "--arg 'f32(8)': expected dtype[dims]"),
    (["{file}:cli_scale", "--arg", "q7[8]"], "unknown dtype 'q7'"),
    (["{file}:cli_scale", "--arg", "f32[8]", "--param", "8"], "expected name=value"),
    (["{file}:cli_scale", "--arg", "f32[8]", "--param", "tile=8"], "unexpected parameter"),
    (["{file}:cli_scale", "--arg", "f32[8]", "--show", "smem"], "needs a CUDA target"),
])
def test_inspect_errors_name_the_mistake(kernel_file, capsys, argv, message):
    argv = [a.format(file=kernel_file) for a in argv]
    status, out, err = _run(capsys, "inspect", *argv)
    assert status == 2 and out == "" and message in err and err.startswith("jaxtile inspect: ")


def test_doctor_reports_every_check(cache_copy, capsys):
    status, out, _ = _run(capsys, "doctor")
    lines = out.splitlines()
    for name in ("CPU backend (TVM/LLVM)", "CPU ISA", "linker (ld)", "NVRTC", "nvcc",
                 "AMD toolchain (clang)", "NVIDIA GPU driver", "JAX and its plugins"):
        assert any(line[5:].startswith(name) for line in lines), name
    assert f"kernel cache                  {cache_copy}: 1 entries" in out
    isa = next(line for line in lines if line[5:].startswith("CPU ISA"))
    assert all(flag in isa.split() for flag in target.host_isa())
    # Each missing tool comes with what to do, on the line under it.
    for i, line in enumerate(lines):
        if line.startswith("[--]"):
            assert lines[i + 1].strip().startswith("-> ")
    assert status == 0


def test_console_script_and_module_entry_points(cache_copy):
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="jaxtile")
    assert script.load() is cli.main
    proc = subprocess.run([sys.executable, "-m", "jaxtile", "cache", "verify"],
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "1 entries checked, 0 damaged\n")


_PREBUILT_CALL = textwrap.dedent("""
    import json, sys
    import jax.numpy as jnp
    from jaxtile import cli
    from jaxtile.compiler import cache

    scale = cli.load_kernel(sys.argv[1])
    out = scale(jnp.arange(64, dtype=jnp.float32))
    print(json.dumps({"out": out.tolist(), "tvm": "tvm" in sys.modules,
                      "stats": cache.stats()}))
""")


def test_prebuilt_entries_are_loaded_instead_of_compiled(kernel_file, tmp_path, monkeypatch,
                                                         capsys):
    """``jaxtile prebuild`` for an ISA level writes entries that a fresh process, with an
    empty cache and the directory in ``$JAXTILE_PREBUILT_DIR``, loads without compiling
    (TVM never imported); without the directory the same key is a miss."""
    try:
        target.check_isa_level("x86-64-v3")
    except ValueError as e:
        pytest.skip(f"this CPU cannot run x86-64-v3 code: {e}")
    prebuilt, empty = tmp_path / "prebuilt", tmp_path / "cache"
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(empty))
    status, out, err = _run(capsys, "prebuild", f"{kernel_file}:cli_scale", "--arg", "f32[64]",
                            "--target", "cpu:x86-64-v3", "--out", str(prebuilt))
    assert status == 0, err
    name, _, rest = out.strip().partition(": ")
    key = rest.split()[0]
    assert name == "cpu:x86-64-v3" and (prebuilt / key[:2] / f"{key}.so").is_file()

    env = {**{k: v for k, v in os.environ.items()
              if k not in ("JAXTILE_INTERPRET", "JAXTILE_BACKEND")},
           "JAXTILE_CACHE_DIR": str(empty), "JAXTILE_PREBUILT_DIR": str(prebuilt),
           "JAXTILE_CPU_ISA": "x86-64-v3"}
    proc = subprocess.run([sys.executable, "-c", _PREBUILT_CALL, f"{kernel_file}:cli_scale"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["out"] == [2.0 * i for i in range(64)]
    assert not result["tvm"]
    assert result["stats"]["prebuilt_hits"] == 1 and result["stats"]["stored"] == 0
    assert not empty.exists() or not any(empty.rglob("*.so"))

    cache.clear_memory()
    monkeypatch.setenv("JAXTILE_PREBUILT_DIR", str(prebuilt))
    assert os.environ["JAXTILE_CACHE_DIR"] == str(empty)    # the CLI put it back
    assert cache.find(key)[1] == "prebuilt"
    cache.clear_memory()
    monkeypatch.delenv("JAXTILE_PREBUILT_DIR")
    assert cache.find(key) == (None, "miss")


_LIBRARY_CALL = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    import numpy as np
    import jaxtile as jt
    from jaxtile.compiler import cache

    x = np.asarray(jax.random.normal(jax.random.key(1), (300, 1000), jnp.float32)) * 30
    x[0, :7] = -np.inf          # masked entries
    x[1] = 1e30                 # huge, all equal
    y = jt.ops.softmax(jnp.asarray(x))       # 300 rows: prebuilt for 64, dynamic in rows
    np.save(sys.argv[1], np.asarray(y))
    print(json.dumps({"tvm": "tvm" in sys.modules, "stats": cache.stats()}))
""")


def test_library_kernel_prebuilt_for_a_level_loads_on_the_host(tmp_path, monkeypatch, capsys):
    """``jt.ops.softmax`` prebuilt for x86-64-v3 on 64 rows: a fresh process on the host
    target (no ISA override), with an empty cache, loads it for 300 rows (the kernel is
    dynamic in rows) without importing TVM, with the compiled kernel's results; a width
    never prebuilt still compiles."""
    try:
        target.check_isa_level("x86-64-v3")
    except ValueError as e:
        pytest.skip(f"this CPU cannot run x86-64-v3 code: {e}")
    prebuilt, empty = tmp_path / "prebuilt", tmp_path / "cache"
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(empty))
    status, _, err = _run(capsys, "prebuild", "jaxtile.ops:softmax", "--arg", "f32[64,1000]",
                          "--target", "cpu:x86-64-v3", "--out", str(prebuilt))
    assert status == 0, err
    env = {**{k: v for k, v in os.environ.items()
              if k not in ("JAXTILE_INTERPRET", "JAXTILE_BACKEND", "JAXTILE_CPU_ISA")},
           "JAXTILE_CACHE_DIR": str(empty), "JAXTILE_PREBUILT_DIR": str(prebuilt)}
    saved = tmp_path / "out.npy"
    proc = subprocess.run([sys.executable, "-c", _LIBRARY_CALL, str(saved)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["tvm"]
    assert result["stats"]["prebuilt_hits"] == 1 and result["stats"]["stored"] == 0

    import jax

    import jaxtile as jt

    x = np.asarray(jax.random.normal(jax.random.key(1), (300, 1000), jnp.float32)) * 30
    x[0, :7] = -np.inf
    x[1] = 1e30
    got = np.load(saved)
    # The same kernel compiled in this process for the host (no prebuilt directory named
    # here), and jnp's formula.
    cache.clear_memory()
    np.testing.assert_allclose(got, jt.ops.softmax(jnp.asarray(x)), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got, jax.nn.softmax(jnp.asarray(x), axis=-1), rtol=2e-6,
                               atol=1e-7)
    assert np.all(got[0, :7] == 0) and np.all(np.isfinite(got))
    # A width never prebuilt compiles, with the prebuilt directory named.
    monkeypatch.setenv("JAXTILE_PREBUILT_DIR", str(prebuilt))
    before = cache.stats()
    np.testing.assert_allclose(jt.ops.softmax(jnp.asarray(x[:, :300])),
                               jax.nn.softmax(jnp.asarray(x[:, :300]), axis=-1),
                               rtol=2e-6, atol=1e-7)
    assert cache.stats()["stored"] == before["stored"] + 1
    assert cache.stats()["prebuilt_hits"] == before["prebuilt_hits"]


def test_prebuild_library_names_and_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "library"
    status, printed, err = _run(capsys, "prebuild", "--library", "attention", "--target",
                                "cpu:x86-64-v4", "--out", str(out))
    assert status == 0, err
    (line,) = printed.splitlines()
    name, _, rest = line.partition(": ")
    key = rest.split()[0]
    assert name == "cpu:x86-64-v4" and "attention_fwd(f32[1,2,128,64]" in rest
    assert (out / key[:2] / f"{key}.so").is_file()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for argv, message in (
            (["--out", str(out)], "name a kernel"),
            (["jaxtile.ops:softmax", "--library", "--out", str(out)], "not both"),
            (["--library", "sofmax"], "no library call named sofmax"),
            (["--library", "--arg", "f32[4]"], "go with a kernel"),
            (["--library", "softmax", "--target", "cuda:sm_80"], "CPU targets"),
            (["jaxtile.ops:softmax", "--arg", "f32[4,4]"], "--out DIR is required"),
            (["--library", "softmax", "--out", str(blocker / "sub")], "cannot create")):
        status, _, err = _run(capsys, "prebuild", *argv)
        assert status == 2 and message in err, (argv, err)


def test_prebuild_writes_entries_another_prebuilt_directory_holds(kernel_file, tmp_path,
                                                                    monkeypatch, capsys):
    """A kernel whose entry a prebuilt directory already holds (``$JAXTILE_PREBUILT_DIR``,
    the package's own) is found there by the build, which then writes nothing: the entry
    is copied, so ``--out`` holds every entry asked for."""
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["prebuild", f"{kernel_file}:cli_scale", "--arg", "f32[32]", "--target",
            "cpu:x86-64-v3"]
    status, printed, err = _run(capsys, *argv, "--out", str(first))
    assert status == 0, err
    key = printed.split(": ")[1].split()[0]
    monkeypatch.setenv("JAXTILE_PREBUILT_DIR", str(first))
    cache.clear_memory()
    status, again, err = _run(capsys, *argv, "--out", str(second))
    assert status == 0 and again == printed, err
    entry = cache.read_entry(second, key)
    assert entry is not None and entry.meta == cache.read_entry(first, key).meta
    cache.clear_memory()


def test_library_specialisations_of_a_gradient_compile_nothing(monkeypatch, tmp_path):
    """Tracing the library's ``value_and_grad`` of attention finds its three kernels and
    starts no build."""
    from jaxtile.compiler import build
    from jaxtile.ops import _library

    monkeypatch.setenv("JAXTILE_CACHE_DIR", str(tmp_path))
    before = cache.stats()
    specs = _library.specialisations(["attention_grad"])
    build.wait_idle()
    assert sorted(s.owner.name for s in specs) == ["attention_dkdv", "attention_dq",
                                                   "attention_fwd"]
    assert cache.stats() == before and not any(tmp_path.iterdir())
