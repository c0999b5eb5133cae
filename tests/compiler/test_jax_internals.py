"""The assumptions jaxtile makes about JAX's private structures, checked one by one so that
a JAX upgrade fails here first."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.interpreters import mlir

from jaxtile.compiler import jax_internals as ji


def _jaxpr(fn, *avals):
    return jax.make_jaxpr(fn)(*avals)


def test_get_and_swap_carry_an_ndindexer():
    def body(x):
        v = x[lax.div(3, 1), ji.Slice(2, 4)]
        x[0, :] = jnp.zeros((8,))
        return v

    jaxpr = _jaxpr(body, ji.ref_aval((5, 8), jnp.float32)).jaxpr
    get, swap = [e for e in jaxpr.eqns if e.primitive.name in ("get", "swap")]
    ref, (indexer,) = ji.ref_indexers(get)
    assert ref is jaxpr.invars[0]
    assert isinstance(indexer, ji.NDIndexer)
    assert isinstance(indexer.indices[1], ji.Slice) and indexer.indices[1].size == 4
    _, (indexer,) = ji.ref_indexers(swap)
    assert ji.value_operand(swap).aval.shape == (8,)
    assert not isinstance(indexer.indices[0], ji.Slice)


def test_constant_indices_are_known_at_trace_time():
    seen = []

    def body(x):
        seen.append(ji.concrete_int(x.at[12].transforms[0].indices[0]))
        return x[...]

    _jaxpr(body, ji.ref_aval((16,), jnp.float32))
    assert seen == [12]


def test_static_fori_loop_is_a_scan_with_one_carry():
    def body(x):
        def step(i, c):
            x[...] = x[...] + i
            return c

        lax.fori_loop(0, 5, step, 0)

    (eqn,) = _jaxpr(body, ji.ref_aval((), jnp.int32)).jaxpr.eqns
    assert eqn.primitive.name == "scan"
    assert eqn.params["length"] == 5 and eqn.params["num_carry"] == 1
    assert not eqn.params["reverse"]


def test_cond_has_false_then_true_branch():
    def body(p, x):
        lax.cond(p, lambda: x.__setitem__(..., 1.0), lambda: None)

    eqns = _jaxpr(body, jax.ShapeDtypeStruct((), jnp.bool_),
                  ji.ref_aval((), jnp.float32)).jaxpr.eqns
    (cond,) = [e for e in eqns if e.primitive.name == "cond"]
    false_branch, true_branch = cond.params["branches"]
    assert not false_branch.jaxpr.eqns and true_branch.jaxpr.eqns


def test_discharge_and_eval_give_final_ref_values():
    def body(x):
        x[...] = x[...] * 2

    closed = _jaxpr(body, ji.ref_aval((3,), jnp.float32))
    pure = ji.discharge_state(closed)
    (out,) = ji.eval_jaxpr(pure, jnp.arange(3.0))
    assert list(out) == [0.0, 2.0, 4.0]


def test_user_source_line_points_here():
    def body(x):
        x[...] = jnp.sin(x[...])  # THE-LINE

    eqns = _jaxpr(body, ji.ref_aval((3,), jnp.float32)).jaxpr.eqns
    (sin,) = [e for e in eqns if e.primitive.name == "sin"]
    line = ji.user_source_line(sin.source_info)
    with open(__file__) as f:
        expected = next(i for i, t in enumerate(f, 1) if "# THE-LINE" in t and "expected" not in t)
    assert line == f"{__file__}:{expected}"


def test_a_lowering_rule_sees_the_disabled_checks_of_a_running_export():
    from jax.interpreters import mlir

    seen = []
    probe = ji.Primitive("jaxtile_test_export_probe")
    probe.def_abstract_eval(lambda x: x)

    def lowering(ctx, x):
        seen.append(ji.export_disabled_checks())
        return [x]

    mlir.register_lowering(probe, lowering)
    spec = jax.ShapeDtypeStruct((2,), jnp.float32)
    checks = [jax.export.DisabledSafetyCheck.custom_call("some_target")]
    jax.export.export(jax.jit(probe.bind), disabled_checks=checks)(spec)
    jax.export.export(jax.jit(lambda x: probe.bind(x) + 1))(spec)
    jax.jit(lambda x: probe.bind(x) * 2).lower(spec)
    assert seen == [tuple(checks), (), None]


def test_symbolic_sizes_trace_to_dim_as_value():
    # Dynamic sizes rely on: symbolic dimensions in ref shapes, is_symbolic_dim, and a size
    # used as a value tracing to `dim_as_value[dim=...]`.

    (n,) = jax.export.symbolic_shape("x_0")
    assert ji.is_symbolic_dim(n) and not ji.is_symbolic_dim(3)

    def body(x):
        return jnp.asarray(x.shape[0], jnp.int32) + x[0]

    jaxpr = jax.make_jaxpr(body)(ji.ref_aval((n,), jnp.int32))
    eqns = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dim_as_value"]
    assert len(eqns) == 1 and str(eqns[0].params["dim"]) == "x_0"


def test_undecided_dimension_comparisons_reach_the_callback():
    # JAX answers an `==` of symbolic dimensions it cannot decide with False and a truth
    # test with True (no error); the hook reports those, and only those, to the callback.
    (n,) = jax.export.symbolic_shape("x_0")
    assert (n % 8 == 0) is False and bool(n % 8) is True
    seen = []
    with ji.on_undecided_dim_comparison(lambda what, caller: seen.append((what, caller))):
        assert (n == 16) is False and (n != 16) is True and bool(n % 8)
        assert (n == 0) is False and n == n and bool(n)     # decided for every size
    line = test_undecided_dimension_comparisons_reach_the_callback.__code__.co_firstlineno
    assert [w for w, _ in seen] == ["x_0 == 16", "x_0 == 16", "bool(mod(x_0, 8))"]
    assert {c for _, c in seen} == {f"{__file__}:{line + 7}"}
    assert (n == 16) is False       # outside the context: JAX's answer, no callback
    assert len(seen) == 3


def test_an_uncacheable_rule_names_its_op_and_dispatches_per_platform():
    # kernel_call relies on both: its custom call named after the kernel in the HLO (what
    # profiler timelines show), and a lowering for several platforms at once (jax.export).
    prim = ji.Primitive("named_call_probe")
    prim.def_abstract_eval(lambda x: x)

    def named(ctx, x):
        with ji.named_op_location(ctx, "probe(f32[4])"):
            return jax.ffi.ffi_lowering("named_call_probe_target")(ctx, x)

    def rule(ctx, x):
        return ji.lower_per_platform(ctx, "probe", {"cpu": named, "cuda": named}, None, x)

    mlir.register_lowering(prim, rule, cacheable=False)
    f = jax.jit(lambda x: prim.bind(prim.bind(x)))
    hlo = f.lower(jnp.ones(4)).as_text(dialect="hlo")
    calls = [line for line in hlo.splitlines() if "custom-call(" in line]
    assert len(calls) == 2 and all(" probe_f32_4__." in line for line in calls), calls
    check = jax.export.DisabledSafetyCheck.custom_call("named_call_probe_target")
    exported = jax.export.export(f, platforms=["cpu", "cuda"], disabled_checks=[check])(
        jnp.ones(4))
    assert exported.platforms == ("cpu", "cuda")


def test_the_debug_effect_is_jax_debug_callbacks_and_survives_discharge_inside_loops():
    # jt.print's primitive declares it: kept in loops (jt.loop is a fori_loop) and through
    # state discharge (the reference semantics), never dropped as dead code.
    def body(x):
        def step(i, c):
            jax.debug.callback(lambda v: None, x[0])
            return c
        lax.fori_loop(0, 2, step, 0)
        return ()

    jaxpr = _jaxpr(body, ji.ref_aval((4,), jnp.float32))
    assert ji.debug_effect in jaxpr.effects
    assert ji.debug_effect in ji.discharge_state(jaxpr).effects


def test_array_impl_is_the_type_of_concrete_arrays_only():
    # The eager hot path (jaxtile/kernel.py) checks `type(a) is ji.ArrayImpl`.
    assert type(jnp.zeros(3)) is ji.ArrayImpl
    assert type(jax.device_put(1.0)) is ji.ArrayImpl
    seen = []
    jax.jit(lambda x: seen.append(type(x)) or x)(jnp.zeros(3))
    assert seen and seen[0] is not ji.ArrayImpl


def test_refs_created_at_the_top_become_inputs_in_the_order_asked():
    def created(x):
        a = jax.ref.new_ref(jnp.zeros((4,), jnp.float32))
        b = jax.ref.new_ref(jnp.zeros((2, 3), jnp.int32))
        a[...] = x[...] * 2.0
        b[0, :] = jnp.arange(3, dtype=jnp.int32)
        x[...] = a[...] + 1.0
        return ()

    def passed(x, b, a):
        a[...] = x[...] * 2.0
        b[0, :] = jnp.arange(3, dtype=jnp.int32)
        x[...] = a[...] + 1.0
        return ()

    x = ji.ref_aval((4,), jnp.float32)
    rewritten = ji.refs_as_inputs(_jaxpr(created, x), 2, [1, 0])
    want = _jaxpr(passed, x, ji.ref_aval((2, 3), jnp.int32), ji.ref_aval((4,), jnp.float32))
    # The same eqns (no new_ref, no zeros left) on the same inputs, and effects on inputs.
    assert str(rewritten) == str(want)
    assert len(rewritten.jaxpr.effects) == len(want.jaxpr.effects)
    assert {type(e) for e in rewritten.jaxpr.effects} == {ji.ReadEffect, ji.WriteEffect}
    x_out, b_out, a_out = ji.eval_jaxpr(ji.discharge_state(rewritten), jnp.ones(4),
                                        jnp.zeros((2, 3), jnp.int32), jnp.zeros(4))
    assert list(x_out) == [3.0] * 4 and list(a_out) == [2.0] * 4
    assert b_out.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_refs_created_inside_a_loop_are_left_to_a_second_trace():
    def created(x):
        a = jax.ref.new_ref(jnp.zeros((4,), jnp.float32))

        def body(i, carry):
            t = jax.ref.new_ref(jnp.zeros((4,), jnp.float32))
            t[...] = x[...] + a[...]
            a[...] = t[...]
            return carry

        lax.fori_loop(0, 3, body, 0)
        return ()

    closed = _jaxpr(created, ji.ref_aval((4,), jnp.float32))
    assert ji.refs_as_inputs(closed, 1, [0]) is None
    assert ji.refs_as_inputs(closed, 2, [0, 1]) is None
