"""The library kernels' stored tile tables (``jaxtile/ops/_tiles.py``): a call consults
its target's table, every stored entry passes the pruning rules of its target, a shape the
table lacks gets the rule, and run-time tuning happens only when asked."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt
from jaxtile.autotune import TunedKernel, _target_limits
from jaxtile.autotune import stats as autotune_stats
from jaxtile.compiler.errors import ClampedIndexWarning
from jaxtile.compiler.target import CpuCaps, Target, parse_target
from jaxtile.kernel import Kernel
from jaxtile.ops import _tiles


def _fresh(name):
    """A copy of library kernel ``name`` with its table lookup and no specialisations yet
    (the module's kernels keep theirs between tests)."""
    lib = getattr(jt.ops, name)
    k = Kernel(lib.fn, threads=lib.threads, interpret=None, name=lib.name)
    _tiles.install({name: k})
    return k


def _specs(key):
    """The argument structs of a table bucket (``float32[4096,1024] float32[1024] | ...``)."""
    args = key.split(" | ")[0].split()
    out = []
    for a in args:
        dtype, dims = re.fullmatch(r"(\w+)\[([\d,]*)\]", a).groups()
        out.append(jax.ShapeDtypeStruct(tuple(int(d) for d in dims.split(",") if d),
                                        np.dtype(dtype)))
    return tuple(out)


def test_a_changed_table_entry_changes_the_specialisation(monkeypatch, rng):
    k = _fresh("softmax")
    x = rng.standard_normal((64, 200)).astype(np.float32)
    table = _tiles.table_name(_tiles.active_target())
    if table is None:
        pytest.skip("the tables are for x86-64 CPUs with AVX2 (and CUDA GPUs)")
    key = _tiles.bucket(k, (jax.ShapeDtypeStruct(x.shape, x.dtype),), {})
    assert key == "float32[64,256]"
    monkeypatch.setattr(_tiles, "load", lambda name: {"softmax": {key: {"config": {
        "rows": 16}}}} if name == table else {})
    assert k._specialise((x,), {}).params["rows"] == 16
    y = k(x)
    np.testing.assert_allclose(y, k.reference(x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y, jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-7)
    # Another entry, another specialisation (a new kernel: the first one keeps its own).
    monkeypatch.setattr(_tiles, "load", lambda name: {"softmax": {key: {"config": {
        "rows": 2}}}} if name == table else {})
    assert _fresh("softmax")._specialise((x,), {}).params["rows"] == 2
    # A call that passes the tile itself passes over the table.
    assert k._specialise((x,), {"rows": 8}).params["rows"] == 8


def test_the_shipped_table_is_what_a_call_gets():
    name = _tiles.table_name(_tiles.active_target())
    if name is None:
        pytest.skip("the tables are for x86-64 CPUs with AVX2 (and CUDA GPUs)")
    table = _tiles.load(name)
    assert set(table) == set(_tiles.SPACES)
    for name, entries in table.items():
        k = _fresh(name)
        for key, entry in entries.items():
            specs = _specs(key)
            assert _tiles.bucket(k, specs, {}) == key
            assert _tiles.choose(k, specs, {}, None) == entry["config"], (name, key)


def test_a_shape_not_in_the_table_gets_the_rule():
    mm = _fresh("matmul")
    a = jax.ShapeDtypeStruct((48, 40), np.float32)
    b = jax.ShapeDtypeStruct((40, 24), np.float32)
    assert mm._specialise((a, b), {}).params | {"bm": 0} == {
        "bm": 0, "bn": 64, "bk": 32, "stages": 2, "transpose_a": False, "transpose_b": False}
    assert mm._specialise((a, b), {}).params["bm"] == 64
    # Transposed operands are buckets of their own, which the table lacks.
    sq = jax.ShapeDtypeStruct((1024, 1024), np.float32)
    assert _tiles.choose(mm, (sq, sq), {"transpose_b": True}, None) == \
        _tiles.rule(mm, (sq, sq))
    # attention's rule depends on the operands (default_tiles): head_dim 128 float32.
    att = _fresh("attention_fwd")
    q = jax.ShapeDtypeStruct((1, 2, 64, 128), np.float32)
    lengths = jax.ShapeDtypeStruct((1,), np.int32)
    assert _tiles.choose(att, (q, q, q, lengths), {}, None) == {"bm": 32, "bn": 32}
    # Passing one tile gets the rule's for the other.
    assert _tiles.choose(att, (q, q, q, lengths), {"bm": 16}, None) == {"bn": 32}
    # A target without a table (an ARM CPU) gets the rule everywhere.
    arm = Target("cpu", "cpu", CpuCaps("aarch64", ("neon",), "arm", 128), "tvm")
    assert _tiles.table_name(arm) is None
    assert _tiles.choose(mm, (sq, sq), {}, arm) == _tiles.rule(mm, (sq, sq))


def test_the_table_follows_the_targets_capabilities():
    name = {t: _tiles.table_name(parse_target(t)) for t in (
        "cpu:x86-64-v3", "cpu:x86-64-v4", "cuda:sm_80", "cuda:sm_86", "cuda:sm_87",
        "cuda:sm_89", "cuda:sm_90", "cuda:sm_90a", "cuda:sm_100", "cuda:sm_120")}
    assert name == {
        "cpu:x86-64-v3": "cpu:x86-64-v3", "cpu:x86-64-v4": "cpu:x86-64-v4",
        "cuda:sm_80": "cuda:sm_80", "cuda:sm_86": None,  # 99 KiB of shared memory
        "cuda:sm_87": "cuda:sm_80", "cuda:sm_89": None, "cuda:sm_90": "cuda:sm_90",
        "cuda:sm_90a": "cuda:sm_90", "cuda:sm_100": "cuda:sm_90", "cuda:sm_120": None}
    # lower(target=) uses that target's table: the CUDA tables hold bigger GEMM tiles.
    mm = _fresh("matmul")
    sq = jax.ShapeDtypeStruct((1024, 1024), np.float32)
    entry = _tiles.load("cuda:sm_90")["matmul"][_tiles.bucket(mm, (sq, sq), {})]["config"]
    assert entry != _tiles.rule(mm, (sq, sq))
    assert mm.lower(sq, sq, target="cuda:sm_90").key == \
        mm.lower(sq, sq, target="cuda:sm_90", **entry).key


@pytest.mark.parametrize("table", ["cpu:x86-64-v3", "cpu:x86-64-v4", "cuda:sm_80",
                                   "cuda:sm_90"])
def test_every_stored_entry_passes_the_pruning_rules_of_its_target(table):
    target = parse_target(table)
    assert _tiles.table_name(target) == table
    entries = _tiles.load(table)
    assert entries, f"no table for {table}"
    for name, buckets in entries.items():
        lib = getattr(jt.ops, name)
        tuner = TunedKernel(lib, [e["config"] for e in buckets.values()])
        for key, entry in buckets.items():
            specs = _specs(key)
            config = entry["config"]
            assert set(config) == set(_tiles.SPACES[name].tuned), (name, key)
            k, tuned = tuner._with(config)
            with warnings.catch_warnings():
                warnings.simplefilter("error", ClampedIndexWarning)  # the tile fits
                k._specialise(specs, tuned).check_threads(target)  # the verifier
            if target.kind == "cuda":
                # Shared memory within the architecture's limit (ptxas spills: the slow
                # test below).
                k.lower(*specs, target=table, **tuned).shared_memory  # noqa: B018


@pytest.mark.slow
@pytest.mark.parametrize("table", ["cuda:sm_80", "cuda:sm_90"])
def test_stored_cuda_entries_do_not_spill(table):
    target = parse_target(table)
    for name, buckets in _tiles.load(table).items():
        lib = getattr(jt.ops, name)
        tuner = TunedKernel(lib, [e["config"] for e in buckets.values()])
        for key, entry in buckets.items():
            k, tuned = tuner._with(entry["config"])
            assert _target_limits(k, tuned, _specs(key), {}, target) is None, \
                (name, key)


def test_a_first_call_times_nothing_and_tuning_is_an_opt_in(monkeypatch, rng):
    x = rng.standard_normal((24, 130)).astype(np.float32)
    before = autotune_stats()
    k = _fresh("rms_norm")
    w = rng.standard_normal(130).astype(np.float32)
    y = k(x, w)
    assert autotune_stats() == before  # no timing, no tuning record read
    assert jt.stats()["rms_norm"].compiles >= 1
    expect = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-6)

    monkeypatch.setenv("JAXTILE_TUNE_OPS", "1")
    k = _fresh("rms_norm")
    y = jax.jit(lambda x, w: k(x, w))(x, w)
    after = autotune_stats()
    assert after["tuned"] + after["disk_hits"] > before["tuned"] + before["disk_hits"]
    tuner = _tiles._tuners[("rms_norm", "cpu")]
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(w.shape, w.dtype)
    best = tuner.best_config(*spec)
    assert k._specialise((x, w), {}).params["rows"] == best["rows"]
    np.testing.assert_allclose(y, k.reference(x, w), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-6)
    assert jnp.asarray(y).dtype == jnp.float32


_Q = jax.ShapeDtypeStruct((1, 8, 1024, 64), np.float32)  # in every shipped table
_LENGTHS = jax.ShapeDtypeStruct((1,), np.int32)


def _entry(table, kernel, specs):
    return _tiles.load(table)[kernel.name][_tiles.bucket(kernel, specs, {})]["config"]


def test_each_lowering_target_gets_its_own_tables_tiles():
    # The trace chooses for the active backend's target; a lowering for another target
    # (jax.export for CUDA on a CPU host) must choose again: the x86 tables hold f32
    # attention at 128 x 128, which needs more shared memory than an sm_80 block has.
    att = _fresh("attention_fwd")
    args = (_Q, _Q, _Q, _LENGTHS)
    sm80, sm90 = parse_target("cuda:sm_80"), parse_target("cuda:sm_90")
    cpu = parse_target("cpu:x86-64-v4")
    spec = att._specialise(args, {}, cpu)
    assert {k: spec.params[k] for k in ("bm", "bn")} == _entry("cpu:x86-64-v4", att, args) \
        == {"bm": 128, "bn": 128}
    assert spec.for_target(cpu) is spec
    on_gpu = spec.for_target(sm80)
    assert {k: on_gpu.params[k] for k in ("bm", "bn")} == _entry("cuda:sm_80", att, args)
    # The same specialisation as a lowering for sm_80 makes (one trace, one content key).
    assert on_gpu is att._specialise(args, {}, sm80) and on_gpu.for_target(sm80) is on_gpu
    assert att.lower(*args, target="cuda:sm_80").key == \
        att.lower(*args, target="cuda:sm_80", **_entry("cuda:sm_80", att, args)).key
    # sm_90's table agrees with sm_80's here: no second specialisation.
    assert spec.for_target(sm90) is on_gpu.for_target(sm90) is on_gpu
    # The other parameters stay the call's.
    causal = att._specialise(args, {"causal": True, "scale": 0.5}, cpu).for_target(sm80)
    assert causal.params["causal"] is True and causal.params["scale"] == 0.5
    assert causal.params["bm"] == 64  # no table entry for causal: the rule (default_tiles)


def test_tiles_the_call_passed_are_kept_on_every_target():
    att = _fresh("attention_fwd")
    args = (_Q, _Q, _Q, _LENGTHS)
    cpu, sm80 = parse_target("cpu:x86-64-v4"), parse_target("cuda:sm_80")
    chosen = att._specialise(args, {}, cpu)
    fixed = att._specialise(args, {"bm": 128, "bn": 128}, cpu)
    # Same parameters, but only the table's choice is the table's to change.
    assert fixed.params == chosen.params and fixed is not chosen
    assert fixed.for_target(sm80) is fixed
    assert chosen.for_target(sm80) is not chosen
    # One tile passed: the other is the rule's on every target, not re-chosen.
    half = att._specialise(args, {"bm": 32}, cpu)
    assert half.for_target(sm80) is half and half.params["bn"] == 32


def test_the_cuda_emulator_chooses_from_the_sm_80_table():
    att = _fresh("attention_fwd")
    args = (_Q, _Q, _Q, _LENGTHS)
    jt.set_backend("cuda-emulator")
    try:
        spec = att._specialise(args, {})
    finally:
        jt.set_backend("cpu")
    sm80 = parse_target("cuda:sm_80")
    assert spec.backend == "cuda-emulator" and spec.cpu_platform_target == sm80
    assert {k: spec.params[k] for k in ("bm", "bn")} == _entry("cuda:sm_80", att, args)
    assert spec.for_target(sm80) is spec


def test_a_tile_rule_that_changes_the_outputs_is_a_clear_error():
    @jt.kernel
    def head(x, *, rows=1):
        out = jt.empty((rows,), x.dtype)
        out[...] = x[:rows]
        return out

    head.tile_rule = lambda specs, params, target: \
        {} if "rows" in params else {"rows": 2 if target.kind == "cuda" else 1}
    x = jax.ShapeDtypeStruct((8,), np.float32)
    spec = head._specialise((x,), {}, parse_target("cpu"))
    with pytest.raises(jt.KernelError, match=r"'head'.*cuda:sm_80.*change the kernel's "
                       r"outputs.*test_ops_tiles.py"):
        spec.for_target(parse_target("cuda:sm_80"))
