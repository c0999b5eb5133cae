"""``jt.print``: one line per block, the same text on the CPU, in the reference semantics
(``interpret=True``, ``kernel.reference``) and in the CUDA emulator (the ``emu`` runs, slow:
there thread 0 alone prints, so each block's line appears once), read from the process's
stdout (``capfd``: C's stdout and Python's); format errors at the user's line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt


def _row_max(x, *, upto=2):
    out = jt.empty((x.shape[0],), x.dtype)
    i = jt.grid(x.shape[0])
    t = jt.fragment((x.shape[1],), x.dtype)
    jt.copy(x.at[i], t)
    m = jnp.max(t[...])
    jt.print("row {} max {} big {}", i, m, m > 2.0, when=i < upto)
    out[i] = m
    return out


row_max = jt.kernel(_row_max)


def _x():
    # Quarters and a large value: %g writes them exactly, as Python's format(v, "g") does.
    x = np.arange(4 * 8, dtype=np.float32).reshape(4, 8) / 4 - 3.0
    x[1, 3] = 1234567.0
    return jnp.asarray(x)


def _want(x, upto=2):
    """The lines, computed from jnp's row maxima and Python's own formatting."""
    maxima = np.asarray(jnp.max(x, axis=1))
    return sorted(f"[block {i}] row {i} max {float(maxima[i]):g} big {maxima[i] > 2.0}"
                  for i in range(min(upto, x.shape[0])))


def _lines(capfd):
    return sorted(ln for ln in capfd.readouterr().out.splitlines() if ln.startswith("[block"))


def test_a_compiled_kernel_prints_one_line_per_block_where_the_condition_holds(capfd):
    x = _x()
    capfd.readouterr()
    got = jax.block_until_ready(row_max(x))
    lines = _lines(capfd)
    assert lines == _want(x)
    assert lines[1] == "[block 1] row 1 max 1.23457e+06 big True"   # %g: 6 digits
    np.testing.assert_array_equal(got, jnp.max(x, axis=1))
    # Under jit too (the print is in the compiled kernel, not in Python).
    jax.block_until_ready(jax.jit(lambda a: row_max(a, upto=4))(x))
    assert _lines(capfd) == _want(x, 4)


def test_the_reference_prints_the_same_lines(capfd):
    x = _x()
    capfd.readouterr()
    got = jax.block_until_ready(row_max.reference(x))
    assert _lines(capfd) == _want(x)
    np.testing.assert_array_equal(got, jnp.max(x, axis=1))
    jax.block_until_ready(jt.kernel(interpret=True)(_row_max)(x, upto=3))
    assert _lines(capfd) == _want(x, 3)


@jt.kernel
def _dtypes(a, b, c, d):
    out = jt.empty((1,), jnp.int32)
    jt.grid(1)
    jt.print("i8 {} u32 {} f16 {} pct 100% {{braces}} const {} nan {}", a[0], b[0], c[0], 7,
             d[0])
    out[0] = jnp.int32(0)
    return out


def test_integer_unsigned_half_and_literal_text_print_alike(capfd):
    a = jnp.asarray([-5], jnp.int8)
    b = jnp.asarray([4000000000], jnp.uint32)
    c = jnp.asarray([0.1], jnp.float16)
    d = jnp.asarray([-np.nan], jnp.float32)    # the sign bit set: still "nan" everywhere
    want = [f"[block 0] i8 -5 u32 4000000000 f16 {float(np.float16(0.1)):g} pct 100% "
            "{braces} const 7 nan nan"]
    capfd.readouterr()
    jax.block_until_ready(_dtypes(a, b, c, d))
    assert _lines(capfd) == want
    jax.block_until_ready(_dtypes.reference(a, b, c, d))
    assert _lines(capfd) == want


@jt.kernel
def _two_axes(x):
    out = jt.empty((2, 3), jnp.float32)
    i, j = jt.grid(2, 3)
    out[i, j] = x[i, j]
    jt.print("v {}", x[i, j], when=j == 2)
    return out


def test_a_grid_of_several_axes_tags_each_line_with_all_indices(capfd):
    x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    want = sorted(f"[block ({i}, 2)] v {i * 3 + 2}" for i in range(2))
    capfd.readouterr()
    jax.block_until_ready(_two_axes(x))
    assert _lines(capfd) == want
    jax.block_until_ready(_two_axes.reference(x))
    assert _lines(capfd) == want


def _bad(kind):
    def body(x):
        out = jt.empty(x.shape, x.dtype)
        jt.grid(1)
        t = x[...]
        if kind == "count":
            jt.print("a {} b {}", t[0])
        elif kind == "tile":
            jt.print("t {}", t)
        elif kind == "named":
            jt.print("t {x}", t[0])
        else:
            jt.print("t {}", t[0], when=t[0])
        out[...] = t
        return out
    return jt.kernel(body)


def _line_of(text):
    lines = open(__file__).read().splitlines()
    return f"{__file__}:{next(n for n, ln in enumerate(lines, 1) if text in ln)}"


@pytest.mark.parametrize("kind,call,message", [
    ("count", 'jt.print("a {} b {}"', r"has 2 placeholder\(s\) for 1 value"),
    ("tile", 'jt.print("t {}", t)', r"value 0 is a tile of shape \(8,\); jt.print prints "
     "scalars"),
    ("named", 'jt.print("t {x}"', r"placeholder \{x\}.*only plain \{\} placeholders"),
    ("when", "when=t[0])", r"when= must be a scalar bool, got float32"),
])
def test_a_bad_print_is_a_kernel_error_at_the_users_line(kind, call, message):
    x = jnp.zeros((8,), jnp.float32)
    with pytest.raises(jt.KernelError, match=message) as info:
        _bad(kind)(x)
    assert f"(at {_line_of(call)})" in str(info.value)



@jt.kernel
def _running(x):
    out = jt.empty((x.shape[0],), jnp.float32)
    i = jt.grid(x.shape[0])
    acc = jt.local((1,), jnp.float32)
    acc[0] = 0.0

    @jt.loop(0, x.shape[1])
    def _(j):
        acc[0] += x[i, j]
        jt.print("step {} acc {}", j, acc[0], when=j >= 1)

    @jt.when(i == 1)
    def _():
        jt.print("last {}", acc[0])
    out[i] = acc[0]
    return out


def _running_want(x, batch=None):
    tag = (lambda i: f"[block {i}]") if batch is None else (lambda i: f"[block ({i}, {batch})]")
    sums = np.cumsum(np.asarray(x), axis=1)
    lines = [f"{tag(i)} step {j} acc {sums[i, j]:g}" for i in range(x.shape[0])
             for j in range(1, x.shape[1])]
    return lines + [f"{tag(1)} last {sums[1, -1]:g}"]


def test_prints_inside_loops_and_conditionals_and_under_vmap(capfd):
    x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    capfd.readouterr()
    np.testing.assert_array_equal(jax.block_until_ready(_running(x)), jnp.sum(x, axis=1))
    assert _lines(capfd) == sorted(_running_want(x))
    np.testing.assert_array_equal(jax.block_until_ready(_running.reference(x)),
                                  jnp.sum(x, axis=1))
    assert _lines(capfd) == sorted(_running_want(x))
    # A batch level is one more grid axis, in the tag too, compiled or not.
    xs = jnp.stack([x, x + 10])
    want = sorted(_running_want(x, 0) + _running_want(x + 10, 1))
    jax.block_until_ready(jax.vmap(_running)(xs))
    assert _lines(capfd) == want
    jax.block_until_ready(jax.vmap(_running.reference)(xs))
    assert _lines(capfd) == want


@jt.kernel
def _first(x):
    out = jt.empty((1,), jnp.float32)
    jt.grid(1)
    jt.print("v {}", x[0])
    out[0] = x[0]
    return out


def test_nested_vmaps_tag_the_inner_batch_index_first(capfd):
    xs = jnp.arange(6, dtype=jnp.float32).reshape(2, 3, 1)
    want = sorted(f"[block (0, {b}, {a})] v {a * 3 + b}" for a in range(2) for b in range(3))
    capfd.readouterr()
    got = jax.block_until_ready(jax.vmap(jax.vmap(_first))(xs))
    assert _lines(capfd) == want
    np.testing.assert_array_equal(got, xs)
    jax.block_until_ready(jax.vmap(jax.vmap(_first.reference))(xs))
    assert _lines(capfd) == want
