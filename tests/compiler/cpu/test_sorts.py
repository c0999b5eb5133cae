"""The CPU sort (``compiler/cpu/sorts.py``: a bitonic network whose compare-and-swaps are
selects, not branches) compiled for AVX2 (``JAXTILE_CPU_ISA=x86-64-v3``) and for the host,
on one tile of ragged and power-of-two lengths, against numpy's stable sort: NaNs (with
payloads, of both signs) last, -0.0 and 0.0 equal and kept in their order, infinities,
huge values and many ties; ascending and descending ``argsort`` (the positions the network
carries) and ``lax.top_k`` (the network's descending order, whose padding past a ragged
length must sort after -NaN)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile import _config
from jaxtile.compiler import target
from jaxtile.compiler.target import ISA_LEVELS

LEVELS = [pytest.param(level, marks=pytest.mark.skipif(
    level != "host" and not set(ISA_LEVELS[level]) <= set(target.host_isa()),
    reason=f"this CPU cannot run {level} code")) for level in ("x86-64-v3", "host")]


@jt.kernel
def _sort_tile(x):
    out = jt.empty(x.shape, x.dtype)
    jt.grid(1)
    t = jt.fragment(x.shape, x.dtype)
    jt.copy(x.at[0], t)
    t[...] = jnp.sort(t[...])
    jt.copy(t, out.at[0])
    return out


@jt.kernel
def _argsort_tile(x, *, descending=False):
    out = jt.empty(x.shape, jnp.int32)
    jt.grid(1)
    t = jt.fragment(x.shape, x.dtype)
    o = jt.fragment(x.shape, jnp.int32)
    jt.copy(x.at[0], t)
    o[...] = jnp.argsort(t[...], descending=descending).astype(jnp.int32)
    jt.copy(o, out.at[0])
    return out


def _use(monkeypatch, level):
    monkeypatch.setenv("JAXTILE_CPU_ISA", level)
    with warnings.catch_warnings():
        warnings.simplefilter("error", _config.ConfigWarning)
        assert _config.cpu_target_name() == ("cpu" if level == "host" else f"cpu:{level}")


def _values(rng, n):
    """Ties (values drawn from 40), signed zeros, infinities, huge values and NaNs with
    payloads at random places."""
    x = rng.integers(-20, 20, n).astype(np.float32) / 4
    special = np.concatenate([
        np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-45], np.float32),
        np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC12345], np.uint32).view(np.float32),
    ])
    where = rng.choice(n, min(n, len(special)), replace=False)  # 1e-45 among the first 7
    x[where] = special[:len(where)]
    return x


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n", [7, 1000, 4096])
def test_sort_matches_xla_and_numpy(monkeypatch, rng, level, n):
    _use(monkeypatch, level)
    x = _values(rng, n)
    got = np.asarray(jax.jit(_sort_tile)(jnp.asarray(x)))
    # XLA's order: -0.0 equals 0.0 (the stable sort keeps their order), every NaN last;
    # subnormals equal zero as well (XLA's threads compare with denormals off), so XLA is
    # the reference, and numpy's stable sort agrees once the subnormal is taken out.
    want = np.asarray(jax.jit(jnp.sort)(jnp.asarray(x)))
    normal = np.abs(x) != np.float32(1e-45)
    order = np.argsort(np.where(np.isnan(x), np.inf, x)[normal], kind="stable")
    nan_last = np.concatenate([order[~np.isnan(x[normal][order])],
                               np.flatnonzero(np.isnan(x[normal]))])
    np.testing.assert_array_equal(want[want.view(np.uint32) != 1].view(np.uint32),
                                  x[normal][nan_last].view(np.uint32))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
@pytest.mark.parametrize("n", [7, 1000])
def test_argsort_is_stable(monkeypatch, rng, level, descending, n):
    _use(monkeypatch, level)
    x = _values(rng, n)
    got = np.asarray(jax.jit(lambda v: _argsort_tile(v, descending=descending))(
        jnp.asarray(x)))
    want = np.asarray(jnp.argsort(jnp.asarray(x), descending=descending, stable=True))
    np.testing.assert_array_equal(got, want)


@jt.kernel
def _top_k_tile(x, *, k):
    values = jt.empty((k,), x.dtype)
    indices = jt.empty((k,), jnp.int32)
    jt.grid(1)
    t = jt.fragment(x.shape, x.dtype)
    v = jt.fragment((k,), x.dtype)
    i = jt.fragment((k,), jnp.int32)
    jt.copy(x.at[0], t)
    v[...], i[...] = jax.lax.top_k(t[...], k)
    jt.copy(v, values.at[0])
    jt.copy(i, indices.at[0])
    return values, indices


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n, k", [(7, 7), (1000, 1000), (1000, 5), (4096, 9)])
def test_top_k_sorts_descending(monkeypatch, rng, level, n, k):
    """``lax.top_k`` is the network's descending sort (in the IEEE total order, NaN above
    inf): all of a ragged row (where the padding must sort after every element, -NaN
    included), and its first few, against XLA's."""
    _use(monkeypatch, level)
    x = _values(rng, n)
    x[rng.choice(n, min(n, 2), replace=False)] = np.array(
        [0xFFFFFFFF, 0xFF800001], np.uint32).view(np.float32)[:min(n, 2)]  # -NaNs
    got = jax.jit(lambda v: _top_k_tile(v, k=k))(jnp.asarray(x))
    want = jax.jit(lambda v: jax.lax.top_k(v, k))(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(got[0]).view(np.uint32),
                                  np.asarray(want[0]).view(np.uint32))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
