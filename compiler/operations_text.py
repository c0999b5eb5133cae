"""What each operation a kernel body may use computes: its semantics, dtypes and limits, as
markdown, for ``docs/operations.md``.

:data:`DESCRIPTIONS` maps the name of every JAX primitive the converter accepts
(``from_jaxpr.CONVERTERS``, less the rejected ones) to its text; the generator of
``docs/operations.md`` (``operations_doc.py``) shows it next to the name, and a test
(``tests/reliability/test_docs.py``) keeps the two sets of names equal. :data:`RULES` holds
the rules every operation shares (dtypes, half precision), stated once for the page's
preamble. The per-element rules themselves are code in ``semantics.py``; this is their
description for users.
"""

from __future__ import annotations

RULES = """\
- **Dtypes.** Kernel arrays and tiles may be float16, bfloat16, float32, float64, int8 to
  int64, uint8 to uint64 and bool. An operation accepts the dtypes its `jnp`/`lax` function
  accepts (the float functions take floats, the bitwise ones integers and bool), and gives
  the result dtype JAX gives; float64 and int64 need `jax_enable_x64`, as in JAX.
- **Half precision.** float16 and bfloat16 elementwise math is computed in float32 and
  rounded to the storage type (to nearest even) after every operation, as XLA does; sums,
  running sums and products of them accumulate in float32 and are rounded once, when stored.
- **No traps, no undefined results.** Every operation gives what XLA gives for the same
  `jnp` program, including integer division by zero, overflow and NaN operands (below).
- **Tiles.** Operations work on tile values (what `x[...]` reads) of static shape; a shape
  may not depend on a dynamic size. Tiles live in registers or on-chip memory, whose size the
  target bounds (on CUDA, shared tiles beyond the GPU's shared memory are a `KernelError`).
"""

_FLOAT_MATH = "Floating dtypes (16-bit computed in float32). "
_NAN = "A NaN operand gives NaN."


def _float(what: str) -> str:
    return f"{what} {_FLOAT_MATH}{_NAN}"


def _compare(op: str) -> str:
    return (f"`{op}`, element by element; the result is bool. Any dtype; a comparison with a "
            "NaN operand is false (`ne`: true).")


def _reduce(what: str, fn: str, identity: str) -> str:
    return (f"{what} over the given axes (`{fn}`), starting from {identity}. Any number of "
            "axes; the kept axes keep their order.")


DESCRIPTIONS: dict[str, str] = {
    # --- elementwise: float math ---
    "exp": _float("`e^x`."),
    "exp2": _float("`2^x`."),
    "expm1": _float("`e^x - 1`, accurate near 0."),
    "log": _float("Natural logarithm; `log(0)` is `-inf`, negative arguments give NaN."),
    "log1p": _float("`log(1 + x)`, accurate near 0."),
    "sqrt": _float("Square root; negative arguments give NaN."),
    "rsqrt": _float("`1 / sqrt(x)`; `rsqrt(0)` is `inf`."),
    "logistic": _float("`1 / (1 + e^-x)` (`jax.nn.sigmoid`)."),
    "tanh": _float("Hyperbolic tangent."),
    "sin": _float("Sine (radians)."),
    "cos": _float("Cosine (radians)."),
    "tan": _float("Tangent (radians)."),
    "asin": _float("Arcsine; outside [-1, 1] NaN."),
    "acos": _float("Arccosine; outside [-1, 1] NaN."),
    "atan": _float("Arctangent."),
    "atan2": _float("`atan2(y, x)`: the angle of the point (x, y)."),
    "sinh": _float("Hyperbolic sine."),
    "cosh": _float("Hyperbolic cosine."),
    "asinh": _float("Inverse hyperbolic sine."),
    "acosh": _float("Inverse hyperbolic cosine; below 1 NaN."),
    "atanh": _float("Inverse hyperbolic tangent; outside [-1, 1] NaN."),
    "erf": _float("The error function (`jax.nn.gelu(approximate=False)` uses it)."),
    "erfc": _float("`1 - erf(x)`, accurate for large `x`."),
    "pow": _float("`x ** y` for float `y` (`jnp.power`); integer powers are `integer_pow`."),
    "is_finite": "`jnp.isfinite`: false for `inf` and NaN. Floating dtypes; the result is bool.",
    "floor": "Round toward -inf. Floating dtypes.",
    "ceil": "Round toward +inf. Floating dtypes.",
    "round": ("`jnp.round` (half to even) or `lax.round` with `AWAY_FROM_ZERO`. Floating "
              "dtypes."),
    # --- elementwise: arithmetic ---
    "add": "`x + y`. Any numeric dtype; integers wrap around on overflow.",
    "sub": "`x - y`. Any numeric dtype; integers wrap around on overflow.",
    "mul": "`x * y`. Any numeric dtype; integers wrap around on overflow.",
    "div": ("`x / y`. Floats: IEEE division. Integers truncate toward zero and never trap: "
            "`x / 0` is -1 (all ones for unsigned types), `INT_MIN / -1` is `INT_MIN`."),
    "rem": ("`x % y` with the sign of the dividend (`lax.rem`; `jnp.remainder` adds the "
            "correction for the divisor's sign). Integers: `x % 0` is `x`, `INT_MIN % -1` is "
            "0. Floats: `fmod`."),
    "neg": "`-x`. Any numeric dtype.",
    "abs": "Absolute value (`jnp.abs`). Any numeric dtype.",
    "sign": "-1, 0 or 1 (NaN for NaN). Any numeric dtype.",
    "square": "`x * x`. Any numeric dtype.",
    "integer_pow": ("`x ** n` for a static integer `n` (`x ** 3`, `jnp.square`): repeated "
                    "multiplication in XLA's order, a reciprocal for negative `n`."),
    "max": ("`jnp.maximum`. NaN wins (either operand NaN gives NaN); `max(-0.0, 0.0)` may be "
            "either zero. Any dtype."),
    "min": "`jnp.minimum`. NaN wins, as for `max`. Any dtype.",
    "clamp": "`lax.clamp(lo, x, hi)`: `min(max(x, lo), hi)`, NaN as in `max`/`min`.",
    # --- elementwise: logic and comparisons ---
    "and": "Bitwise and (`&`), logical for bool. Integer and bool dtypes.",
    "or": "Bitwise or (`jnp.bitwise_or`), logical for bool. Integer and bool dtypes.",
    "xor": "Bitwise exclusive or (`^`), logical for bool. Integer and bool dtypes.",
    "not": "Bitwise not (`~`), logical for bool. Integer and bool dtypes.",
    "eq": _compare("=="),
    "ne": _compare("!="),
    "lt": _compare("<"),
    "le": _compare("<="),
    "gt": _compare(">"),
    "ge": _compare(">="),
    "select_n": ("`jnp.where(pred, a, b)` / `lax.select`: two-way selection by a bool tile "
                 "(or scalar). More than two cases (`lax.select_n` with several) is a "
                 "`KernelError`."),
    "convert_element_type": (
        "`x.astype(dtype)`. Float to integer saturates at the integer type's bounds and maps "
        "NaN to 0; float to bool is `x != 0` (NaN is true); to a 16-bit float rounds to "
        "nearest even."),
    # --- reductions, scans, sorting ---
    "reduce_sum": _reduce("Sum", "jnp.sum", "0; a sum of bools is their `or`"),
    "reduce_prod": _reduce("Product", "jnp.prod", "1"),
    "reduce_max": _reduce("Maximum", "jnp.max", "the dtype's lowest value, NaN winning"),
    "reduce_min": _reduce("Minimum", "jnp.min", "the dtype's highest value, NaN winning"),
    "reduce_and": _reduce("Logical and", "jnp.all", "true"),
    "reduce_or": _reduce("Logical or", "jnp.any", "false"),
    "argmax": ("`jnp.argmax` along one axis: the index of the first maximum, NaN counting as "
               "the largest (as XLA). The result is an integer tile without that axis."),
    "argmin": ("`jnp.argmin` along one axis: the index of the first minimum, NaN counting as "
               "the smallest (as XLA). The result is an integer tile without that axis."),
    "cumsum": ("`jnp.cumsum` along one axis, forward or reverse: the inclusive running sum. "
               "16-bit floats accumulate in float32 and are rounded once per element."),
    "cumprod": "`jnp.cumprod` along one axis, forward or reverse: the inclusive running product.",
    "cummax": "`lax.cummax` along one axis, forward or reverse; NaN wins.",
    "cummin": "`lax.cummin` along one axis, forward or reverse; NaN wins.",
    "sort": ("`jnp.sort` of one tile along one axis, in XLA's order: ascending, stable, NaNs "
             "last, -0.0 equal to 0.0. Sorting several arrays together (`jnp.argsort`, "
             "`lax.sort` with several operands) is a `KernelError`."),
    # --- shapes ---
    "broadcast_in_dim": "Broadcasting (`v[None, :]`, `jnp.broadcast_to`, scalar operands).",
    "reshape": "`v.reshape(shape)`: same elements in row-major order; static shapes.",
    "squeeze": "`jnp.squeeze`: drops axes of size 1.",
    "expand_dims": "`jnp.expand_dims` / `v[:, None]`: adds axes of size 1.",
    "transpose": "`v.T`, `jnp.transpose(v, perm)`: any permutation of the axes.",
    "rev": "`jnp.flip`: the tile reversed along the given axes.",
    "slice": ("Static slices of a tile value (`v[:, 1:]`, `v[::2]`), with strides. Slices of a "
              "*ref* are views instead (`x.at[...]`, `jt.ds`)."),
    "concatenate": "`jnp.concatenate` of one or more tiles along one axis.",
    "iota": ("`lax.broadcasted_iota` / `jnp.arange` of a static size: positions along one "
             "dimension, in the requested dtype."),
    "dim_as_value": ("A dynamic size (`x.shape[0]` of a kernel with `dynamic=`) used as a "
                     "value: an integer scalar known when the kernel runs."),
    # --- refs and tile operations ---
    "get": ("Reading a ref: `x[...]`, `x[i, j]`, `x[jt.ds(s, n), :]`. Starts that run past "
            "the end are clamped into range, as in JAX (`jt.copy` pads instead)."),
    "swap": ("Writing a ref: `x[...] = v`. Kernel inputs are read-only (`KernelError`); "
             "starts are clamped as for reads."),
    "addupdate": "`x[...] += v` on a ref, with the same indexing as `swap`.",
    "jt_copy": ("`jt.copy`, `jt.gather`, `jt.scatter`: a tile copy between refs, casting to the "
                "destination's dtype. Reads past the end of a global tensor give `pad`, "
                "writes past it are dropped; "
                "`gather`/`scatter` take their rows from an integer tile."),
    "jt_gemm": ("`jt.gemm(a, b, c)`: `c += op(a) @ op(b)` on 2-D on-chip tiles (shared, "
                "fragment or local, or views of them), accumulated in `c`'s dtype; 16-bit "
                "operands are multiplied exactly and summed in a float32 `c`."),
    "jt_atomic": ("`jt.atomic_add`/`atomic_max`/`atomic_min` on a global output or an on-chip "
                  "tile: each element updated atomically. float32, float64, int32, int64."),
    "jt_loop_info": ("The counter of a `jt.loop`/`jt.pipelined` loop (internal: marks the "
                     "loop's kind and stages)."),
    # --- control flow and calls ---
    "while": ("`jt.loop`/`jt.pipelined` with bounds computed on the device (a `fori_loop` "
              "whose condition is `i < stop`), or a `jt.while_` loop on a device condition. "
              "Other `lax.while_loop`s, with values carried between iterations, are a "
              "`KernelError`: keep loop state in refs."),
    "scan": ("`jt.loop`/`jt.pipelined` with static bounds (a `fori_loop` with a static trip "
             "count). `lax.scan` with carried values or reversed is a `KernelError`."),
    "cond": ("`jt.when(cond)`: a two-way branch on a scalar computed on the device, without "
             "results (write them to refs). `lax.cond` with results or `lax.switch` with more "
             "branches is a `KernelError`."),
    "jit": "A nested `jax.jit` call: inlined.",
    "closed_call": "A nested call of a closed function: inlined.",
    "remat2": "`jax.checkpoint` / `jax.remat`: inlined (nothing is rematerialised in a kernel).",
    "custom_jvp_call": ("A function with a `jax.custom_jvp` rule (`jax.nn.relu`, "
                        "...): its primal body is inlined."),
    "custom_vjp_call": "A function with a `jax.custom_vjp` rule: its primal body is inlined.",
    "stop_gradient": "`lax.stop_gradient`: the value itself.",
    "optimization_barrier": "`lax.optimization_barrier`: the values themselves.",
    "copy": "`jnp.copy` of a tile value: the value itself.",
}
"""Operation name -> markdown: what it computes, the dtypes it takes, its limits."""
