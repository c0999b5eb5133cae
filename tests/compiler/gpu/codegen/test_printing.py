"""CUDA lowering of ``print`` ops (``jt.print``): one ``device_printf`` from thread 0 under
the condition, its format escaped for C and printf, and code NVRTC compiles to a ``vprintf``
call; the op prints and parses back as Tile IR text."""

import jax.numpy as jnp
import pytest

import jaxtile as jt
from jaxtile.compiler import build, parser, printer
from jaxtile.compiler.cuda import nvrtc, toolchain
from jaxtile.compiler.gpu.device_rule import device_rule_violations


@jt.kernel
def _printing(x):
    out = jt.empty((4,), x.dtype)
    i = jt.grid(4)
    v = x[i]
    jt.print('50% "q" \\ é {} {} {}', v, i > 1, x.shape[0], when=v > 0)
    out[i] = v
    return out


def _lowered():
    return _printing.lower(jnp.zeros((4,), jnp.float16), target="cuda:sm_80")


def test_the_source_prints_from_thread_zero_with_an_escaped_format():
    low = _lowered()
    calls = [ln.strip() for ln in low.source.splitlines() if "device_printf(" in ln]
    assert len(calls) == 1
    # %% for the literal percent, C escapes for the quote, backslash, UTF-8 and newline;
    # the block index as %lld, a float16 widened to double for %g, a bool as True/False.
    fmt = r'"[block %lld] 50%% \"q\" \\ \303\251 %g %s %lld\012"'
    assert calls[0].startswith("if (tid == 0 && ")
    assert f"device_printf({fmt}, (long long)(" in calls[0]
    assert ' : double(' in calls[0] and '? "True" : "False")' in calls[0]
    assert 'fabs(double(' in calls[0]     # a NaN of either sign prints as "nan"
    assert device_rule_violations(low.source) == []


def test_the_print_op_prints_and_parses_back():
    text = _lowered().tile_ir
    assert "print(" in text and "tag=1" in text
    assert printer.format_kernel(parser.parse_kernel(text)) == text


@pytest.mark.skipif(not nvrtc.available() and toolchain.nvcc_path() is None,
                    reason="neither NVRTC (jaxtile[cuda]) nor nvcc is installed")
def test_nvrtc_compiles_it_to_a_vprintf_call():
    from jaxtile.compiler.cuda.compile import compile_to_library
    from jaxtile.compiler.target import parse_target

    target = parse_target("cuda:sm_80")
    ptx = compile_to_library(build.lowered_ir(_lowered().kernel, target), target).ptx
    assert b"call.uni" in ptx and b"vprintf" in ptx


@pytest.mark.skipif(toolchain.nvcc_path() is None, reason="nvcc is not installed")
def test_nvcc_compiles_it_too():
    # nvcc declares printf through the CUDA runtime headers, NVRTC by itself.
    report = _lowered().ptxas
    assert report is not None and report.registers > 0 and report.spill_stores == 0
