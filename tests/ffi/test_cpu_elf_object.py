"""The in-process linker of ffi/cpu/elf_object.h: TVM-compiled relocatable objects linked
without `ld`, run through the `jaxtile_cpu_call` custom call, and refused cleanly (never a
crash) when malformed, truncated, damaged or beyond what it supports."""

import struct
import subprocess
import sys
import textwrap
import uuid

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tvm
from ffi_kernels import BLOCK, ROW, TVM_ALIGNMENT, parallel_scale, reverse_rows, vadd
from ffi_kernels import mixed_sum as mixed_sum_kernel

from jaxtile import _ffi

pytestmark = pytest.mark.skipif(not _ffi.CPU_LINKS_OBJECTS,
                                reason="the FFI links objects on x86-64 Linux only")

SHT_SYMTAB = 2
SHT_INIT_ARRAY = 14
SHN_COMMON = 0xFFF2
R_X86_64_PLT32 = 4


@pytest.fixture(scope="module")
def kernel_object(tmp_path_factory):
    """A relocatable object holding the runtime tests' kernels: code, constants, calls to
    jaxtile's runtime (the entry assertions' error function) and the runtime's pointer slots
    (workspace allocation, parallel launch) in .bss, reached through the GOT."""
    mod = tvm.IRModule({"vadd": vadd, "reverse_rows": reverse_rows,
                        "parallel_scale": parallel_scale, "mixed_sum": mixed_sum_kernel})
    cpu = tvm.get_global_func("target.llvm_get_system_cpu")()
    path = tmp_path_factory.mktemp("objects") / "kernels.o"
    tvm.compile(mod, target={"kind": "llvm", "mcpu": cpu}).mod.write_to_file(str(path))
    return path


def _key(name):
    return f"elf-{name}-{uuid.uuid4().hex[:8]}"


def _call(key, out_shape, out_dtype, *operands):
    out = jax.ShapeDtypeStruct(out_shape, out_dtype)
    return jax.jit(lambda *a: jax.ffi.ffi_call("jaxtile_cpu_call", out)(*a, key=key))(*operands)


def test_linked_kernels_run(ffi, kernel_object):
    n = 13 * BLOCK - 3
    key = _key("vadd")
    ffi.load_kernel(key, str(kernel_object), "vadd", -(-n // BLOCK), alignment=TVM_ALIGNMENT)
    x = jnp.linspace(-1, 1, n, dtype=jnp.float32)
    y = jnp.arange(n, dtype=jnp.float32)
    np.testing.assert_array_equal(_call(key, x.shape, x.dtype, x, y), np.asarray(x) + y)

    rows = 5  # 16 KiB of scratch per block: allocated through the workspace slot
    key = _key("reverse")
    ffi.load_kernel(key, str(kernel_object), "reverse_rows", rows, alignment=TVM_ALIGNMENT)
    a = jnp.arange(rows * ROW, dtype=jnp.float32).reshape(rows, ROW)
    np.testing.assert_array_equal(_call(key, a.shape, a.dtype, a), 2 * np.asarray(a)[:, ::-1])

    key = _key("parallel")  # calls through the parallel-launch slot
    ffi.load_kernel(key, str(kernel_object), "__tvm_ffi_parallel_scale", 1,
                    alignment=TVM_ALIGNMENT)
    a = jnp.arange(64, dtype=jnp.float32)
    np.testing.assert_array_equal(_call(key, a.shape, a.dtype, a), 3 * np.asarray(a))

    key = _key("mixed")  # float16 conversions: calls within the object, rodata constants
    ffi.load_kernel(key, str(kernel_object), "mixed_sum", 1, alignment=TVM_ALIGNMENT)
    rng = np.random.default_rng(0)
    operands = [rng.integers(-100, 100, 16).astype(np.int8),
                rng.integers(0, 2, 16).astype(np.bool_),
                rng.standard_normal(16).astype(np.float16),
                rng.standard_normal(16).astype(ml_dtypes.bfloat16),
                rng.integers(0, 60000, 16).astype(np.uint16)]
    expected = sum(np.asarray(o).astype(np.float64) for o in operands)
    np.testing.assert_allclose(_call(key, (16,), jnp.float64, *operands), expected, rtol=1e-6)


def test_kernel_errors_reach_jaxtiles_runtime(ffi, kernel_object):
    """The entry assertions' error function is an undefined symbol of the object: bound to
    jaxtile's stand-in, whose message the handler reports."""
    key = _key("mismatch")
    ffi.load_kernel(key, str(kernel_object), "vadd", 1, alignment=TVM_ALIGNMENT)
    x = jnp.ones(8, jnp.float32)
    with pytest.raises(Exception, match=key + r".*Mismatched B\.shape\[0\]"):
        _call(key, (8,), jnp.float32, x, jnp.ones(5, jnp.float32)).block_until_ready()
    np.testing.assert_array_equal(_call(key, (8,), jnp.float32, x, x), 2 * np.asarray(x))


def _mappings():
    with open("/proc/self/maps") as f:
        return {line.split()[0]: line.split()[1] for line in f}


def test_pages_are_never_writable_and_executable(ffi, kernel_object):
    before = _mappings()
    ffi.load_kernel(_key("wx"), str(kernel_object), "vadd", 1, alignment=TVM_ALIGNMENT)
    new = {r: p for r, p in _mappings().items() if before.get(r) != p}
    assert any(p.startswith("r-x") for p in new.values()), new  # the code, made executable
    assert not [r for r, p in new.items() if "w" in p and "x" in p], new


# Editing objects: the section headers of a little-endian ELF64 file.


def _headers(data):
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shnum, = struct.unpack_from("<H", data, 0x3C)
    return shoff, [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]


def _string(data, table, offset):
    start = table[4] + offset
    return data[start:data.index(b"\0", start)].decode()


def _sections(data):
    """Section name: (where its header is, the header's fields)."""
    shoff, headers = _headers(data)
    shstrndx, = struct.unpack_from("<H", data, 0x3E)
    return {_string(data, headers[shstrndx], h[0]): (shoff + 64 * i, h)
            for i, h in enumerate(headers)}


def _symbols(data):
    """(where its entry is, its name) for every symbol."""
    _, headers = _headers(data)
    (symtab,) = [h for h in headers if h[1] == SHT_SYMTAB]
    for at in range(symtab[4], symtab[4] + symtab[5], 24):
        yield at, _string(data, headers[symtab[6]], struct.unpack_from("<I", data, at)[0])


def _load_bytes(ffi, data, tmp_path, symbol="vadd"):
    path = tmp_path / f"{uuid.uuid4().hex}.o"
    path.write_bytes(bytes(data))
    ffi.load_kernel(_key("bad"), str(path), symbol, 1, alignment=TVM_ALIGNMENT)


def test_unsupported_objects_are_clear_errors(ffi, kernel_object, tmp_path):
    good = kernel_object.read_bytes()
    sections = _sections(good)

    machine = bytearray(good)
    struct.pack_into("<H", machine, 0x12, 183)  # EM_AARCH64
    with pytest.raises(RuntimeError, match=r"cannot link /.*\.o: it is for ELF machine 183"):
        _load_bytes(ffi, machine, tmp_path)

    # The first relocation of .rela.text made a type no x86-64 object uses.
    offset = sections[".rela.text"][1][4]
    odd_type = bytearray(good)
    info, = struct.unpack_from("<Q", odd_type, offset + 8)
    struct.pack_into("<Q", odd_type, offset + 8, (info & ~0xFFFFFFFF) | 250)
    with pytest.raises(RuntimeError, match="relocation of type 250"):
        _load_bytes(ffi, odd_type, tmp_path)

    name = b"TVMFFIErrorSetRaisedFromCStrParts"
    assert good.count(name) == 1
    with pytest.raises(RuntimeError, match="undefined symbol 'XVMFFIErrorSetRaisedFromCStrParts'"):
        _load_bytes(ffi, good.replace(name, b"X" + name[1:]), tmp_path)
    with pytest.raises(RuntimeError, match="runtime function 'TVMFFIErrorSetRaisedFromCStrPartz'"):
        _load_bytes(ffi, good.replace(name, name[:-1] + b"z"), tmp_path)

    at, header = sections[".rodata"]
    constructors = bytearray(good)
    struct.pack_into("<I", constructors, at + 4, SHT_INIT_ARRAY)
    with pytest.raises(RuntimeError, match="constructors"):
        _load_bytes(ffi, constructors, tmp_path)

    with pytest.raises(ValueError, match="malformed.*beyond the end of the file"):
        _load_bytes(ffi, good[:len(good) // 2], tmp_path)
    with pytest.raises(RuntimeError, match="defines no function '__tvm_ffi_nope'"):
        _load_bytes(ffi, good, tmp_path, symbol="nope")
    assert not [k for k in ffi.loaded_keys() if k.startswith("elf-bad-")]


def test_common_slots_are_allocated_and_filled(ffi, kernel_object, tmp_path):
    """The runtime's slots as common symbols (uninitialised globals no section holds yet, as
    a C compiler emits tentative definitions): given storage and filled, so the kernel that
    allocates its scratch through one runs."""
    data = bytearray(kernel_object.read_bytes())
    slots = [at for at, name in _symbols(data) if name.startswith("__TVMBackend")]
    assert len(slots) == 3
    for at in slots:
        struct.pack_into("<HQ", data, at + 6, SHN_COMMON, 8)  # section index, alignment
    path = tmp_path / "common.o"
    path.write_bytes(bytes(data))
    rows, key = 3, _key("common")
    ffi.load_kernel(key, str(path), "reverse_rows", rows, alignment=TVM_ALIGNMENT)
    a = jnp.arange(rows * ROW, dtype=jnp.float32).reshape(rows, ROW)
    np.testing.assert_array_equal(_call(key, a.shape, a.dtype, a), 2 * np.asarray(a)[:, ::-1])


# Damaged objects, in a process of their own, so that a crash fails the test with the case
# that caused it instead of ending the test run. Loaded through format-3 payloads (linked from
# memory); every load must succeed or raise an error naming the kernel.
_FUZZ = textwrap.dedent(r"""
    import random, struct, sys
    from jaxtile import _ffi
    from jaxtile.primitives import payload

    good = open(sys.argv[1], "rb").read()
    shoff, = struct.unpack_from("<Q", good, 0x28)
    shnum, = struct.unpack_from("<H", good, 0x3C)
    headers = [struct.unpack_from("<IIQQQQIIQQ", good, shoff + 64 * i) for i in range(shnum)]
    # Where a flipped bit matters to the loader: the ELF header, the section headers, and
    # every symbol table and relocation section.
    regions = [(0, 64), (shoff, 64 * shnum)]
    regions += [(h[4], h[5]) for h in headers if h[1] in (2, 4)]
    rng = random.Random(int(sys.argv[2]))
    cases = [("truncated", n, None) for n in sorted({*range(0, 128, 7), *(rng.randrange(len(good))
                                                     for _ in range(60)), shoff + 40})]
    for _ in range(int(sys.argv[3])):
        start, size = rng.choice(regions)
        cases.append(("flipped", start + rng.randrange(size), rng.randrange(8)))
    outcomes = {"loaded": 0, "refused": 0}
    for i, (how, at, bit) in enumerate(cases):
        data = bytearray(good[:at]) if how == "truncated" else bytearray(good)
        if bit is not None:
            data[at] ^= 1 << bit
        key = f"fuzz-{sys.argv[2]}-{i}"
        text = payload.pack(key=key, name=f"fuzz{i}", symbol="vadd", num_blocks=1,
                            signature="a:float32[?]", library=bytes(data), alignment=64)
        print(how, at, bit, flush=True)  # the last line names the case if the process dies
        try:
            _ffi.load_exported_kernel(key, text)
            outcomes["loaded"] += 1
        except (RuntimeError, ValueError) as e:
            if f"fuzz{i}" not in str(e) or not str(e).startswith("jaxtile: "):
                sys.exit(f"case {how} {at} {bit}: an error that names no kernel: {e}")
            outcomes["refused"] += 1
    print("outcomes", outcomes["loaded"], outcomes["refused"])
""")


def _fuzz(kernel_object, seed, flips):
    proc = subprocess.run([sys.executable, "-c", _FUZZ, str(kernel_object), str(seed),
                           str(flips)], capture_output=True, text=True, timeout=600)
    last = proc.stdout.strip().splitlines()[-1:] or ["nothing"]
    assert proc.returncode == 0, f"died at case {last[0]}: {proc.stderr[-2000:]}"
    loaded, refused = map(int, last[0].split()[1:])
    # Both outcomes occur: flipped bits in unused fields load, the rest are refused.
    assert loaded > 0 and refused > flips // 10, last


def test_damaged_objects_never_crash(kernel_object):
    _fuzz(kernel_object, seed=0, flips=600)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_many_damaged_objects_never_crash(kernel_object, seed):
    _fuzz(kernel_object, seed, flips=20000)
