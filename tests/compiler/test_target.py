"""Target descriptions (compiler/target.py)."""

import pytest

from jaxtile.compiler import target
from jaxtile.compiler.errors import KernelError


@pytest.mark.parametrize("flags,bits", [("fpu sse2 avx avx2 fma", 256),
                                        ("sse2 avx2 avx512f avx512bw", 512),
                                        ("fp asimd", 128), ("", 128)])
def test_vector_width_from_cpu_flags(monkeypatch, flags, bits):
    monkeypatch.setattr(target, "_cpu_flags", lambda: flags)
    assert target.get_target("cpu").vector_bits == bits


def test_vector_width_is_part_of_the_description(monkeypatch):
    # A kernel compiled for one register width must not be loaded for another.
    monkeypatch.setattr(target, "_cpu_vector_bits", lambda: 256)
    narrow = target.get_target("cpu").describe()
    monkeypatch.setattr(target, "_cpu_vector_bits", lambda: 512)
    assert target.get_target("cpu").describe() != narrow


def test_unknown_target_is_a_clear_error():
    with pytest.raises(KernelError, match="unknown or not yet supported target 'tpu'"):
        target.get_target("tpu")
