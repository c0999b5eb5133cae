"""Finding 14: a payload's integrity is checked before its version, so a damaged ``format``
digit reads as damage, not as a payload from a newer jaxtile."""

import jax.numpy as jnp
import pytest

import jaxtile as jt
from jaxtile import _ffi
from jaxtile.compiler.target import parse_target
from jaxtile.primitives import kernel_call, payload


@pytest.fixture(scope="module")
def library():
    @jt.kernel
    def triple(x):
        out = jt.empty(x.shape, x.dtype)
        out[...] = x[...] * 3
        return out

    x = jnp.arange(8, dtype=jnp.float32)
    triple(x)
    entry = triple._specialise((x,), {}).build(parse_target("cpu"), kernel_call.load)
    with open(entry.library, "rb") as f:
        return entry.symbol, f.read(), entry.meta.signature


def _pack(library, key, **kwargs):
    symbol, lib, signature = library
    return payload.pack(key=key, name="triple", symbol=symbol, num_blocks=1, library=lib,
                        signature=signature, **kwargs)


@pytest.mark.parametrize("digit", ["7", "0", "9"])
def test_damaged_format_digit_is_damage(library, digit):
    key = "d" * 63 + digit
    text = _pack(library, key).replace(f"format={payload.FORMAT}\n", f"format={digit}\n", 1)
    with pytest.raises(RuntimeError, match="corrupted: checksum mismatch") as e:
        _ffi.load_exported_kernel(key, text)
    assert "newer" not in str(e.value)


def test_intact_newer_format_asks_for_an_upgrade(library):
    key = "e" * 64
    text = _pack(library, key, format=payload.FORMAT + 1, version="9.9")
    with pytest.raises(RuntimeError, match="newer jaxtile.*upgrade"):
        _ffi.load_exported_kernel(key, text)
