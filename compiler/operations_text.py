"""What each Tile IR operation computes, in words, for ``docs/operations.md``: its
semantics, dtypes and limits, as markdown.

:data:`DESCRIPTIONS` maps an operation's name in that page -- an op kind (``"reduce"``), or a
kind and its function (``"elementwise.exp"``) for the kinds that take one (``fn``) -- to
markdown that ``operations_doc.py`` prints under the operation. :data:`PRIMITIVES` says, for
the JAX primitives that do not map one to one onto an operation (control flow, calls,
``integer_pow``, ``clamp``...), what a kernel body may do with them, and :data:`RULES` the
rules every operation shares, for the page's preamble. ``tests/compiler/test_operations_text.py``
keeps the names equal to the operations ``op_defs`` defines and the primitives the converter
accepts. The per-element rules themselves are code in ``semantics.py``; this is their
description for users.
"""

from __future__ import annotations

RULES = """\
- **Dtypes.** Kernel arrays and tiles may be float16, bfloat16, float32, float64, int8 to
  int64, uint8 to uint64, bool, float8_e4m3fn and float8_e5m2. An operation accepts the
  dtypes its `jnp`/`lax` function accepts (the float functions take floats, the bitwise ones
  integers and bool), and gives the result dtype JAX gives; float64 and int64 need
  `jax_enable_x64`, as in JAX.
- **Half precision.** float16 and bfloat16 elementwise math is computed in float32 and
  rounded to the storage type (to nearest even) after every operation, as XLA does; sums,
  running sums and products of them accumulate in float32 and are rounded once, when stored.
- **8-bit floats.** float8_e4m3fn and float8_e5m2 are storage types: kernels load, store,
  copy (with pads at edges), select, reshape, slice, transpose and convert them, and take
  them as `jt.gemm` operands into a float32 accumulator; every other operation on them is a
  `KernelError` that says to convert to float32 first (XLA would compute in them, rounding
  after each op; an FP8 kernel's math belongs in float32). Per-tensor scales multiply the
  float32 accumulator (`jt.ops.scaled_matmul`).
- **No traps, no undefined results.** Every operation gives what XLA gives for the same
  `jnp` program, including integer division by zero, overflow and NaN operands (below).
- **Tiles.** Operations work on tile values (what `x[...]` reads) of static shape; a shape
  may not depend on a dynamic size. Tiles live in registers or on-chip memory, whose size the
  target bounds (on CUDA, shared tiles beyond the GPU's shared memory are a `KernelError`).
"""

_NAN = "A NaN operand gives NaN."


def _float(what: str) -> str:
    return f"{what} Floating dtypes; float16 and bfloat16 are computed in float32. {_NAN}"


def _compare(op: str, fn: str) -> str:
    return (f"`x {op} y` (`jnp.{fn}`), element by element; the result is bool. A comparison "
            "with a NaN operand is false (for `ne`: true).")


def _reduce(what: str, fn: str, identity: str) -> str:
    return (f"{what} over one or more axes (`{fn}`), starting from {identity}; the kept axes "
            "keep their order. 16-bit floats accumulate in float32 and are rounded once.")


def _scan(what: str, fn: str) -> str:
    return (f"`{fn}` along one axis, forward or reverse: the inclusive running {what}. "
            "16-bit floats accumulate in float32 and are rounded once per element.")


DESCRIPTIONS: dict[str, str] = {
    "const": "A Python scalar broadcast to a tile (`jnp.zeros`, `jnp.full`, literals).",
    "iota": ("`lax.broadcasted_iota` / `jnp.arange` of a static size: the positions along one "
             "dimension, in the requested dtype."),
    "size": ("A dynamic size (`x.shape[0]` of a kernel with `dynamic=`) used as a value: an "
             "integer scalar known when the kernel runs."),
    # --- elementwise: float math ---
    "elementwise.exp": _float("`e^x`."),
    "elementwise.exp2": _float("`2^x`."),
    "elementwise.expm1": _float("`e^x - 1`, accurate near 0."),
    "elementwise.log": _float("Natural logarithm; `log(0)` is `-inf`, below 0 NaN."),
    "elementwise.log1p": _float("`log(1 + x)`, accurate near 0."),
    "elementwise.sqrt": _float("Square root; below 0 NaN."),
    "elementwise.rsqrt": _float("`1 / sqrt(x)`; `rsqrt(0)` is `inf`."),
    "elementwise.logistic": _float("`1 / (1 + e^-x)` (`jax.nn.sigmoid`)."),
    "elementwise.tanh": _float("Hyperbolic tangent."),
    "elementwise.sin": _float("Sine (radians)."),
    "elementwise.cos": _float("Cosine (radians)."),
    "elementwise.tan": _float("Tangent (radians)."),
    "elementwise.asin": _float("Arcsine; outside [-1, 1] NaN."),
    "elementwise.acos": _float("Arccosine; outside [-1, 1] NaN."),
    "elementwise.atan": _float("Arctangent."),
    "elementwise.atan2": _float("`atan2(y, x)`: the angle of the point (x, y)."),
    "elementwise.sinh": _float("Hyperbolic sine."),
    "elementwise.cosh": _float("Hyperbolic cosine."),
    "elementwise.asinh": _float("Inverse hyperbolic sine."),
    "elementwise.acosh": _float("Inverse hyperbolic cosine; below 1 NaN."),
    "elementwise.atanh": _float("Inverse hyperbolic tangent; outside [-1, 1] NaN."),
    "elementwise.erf": _float("The error function (`jax.nn.gelu(approximate=False)` uses it)."),
    "elementwise.erfc": _float("`1 - erf(x)`, accurate for large `x`."),
    "elementwise.pow": _float("`x ** y` for a float exponent (`jnp.power`); a static integer "
                              "exponent becomes multiplications instead (`integer_pow`)."),
    "elementwise.is_finite": ("`jnp.isfinite`: false for `inf` and NaN. Floating dtypes; the "
                              "result is bool."),
    "elementwise.floor": "Round toward -inf (`jnp.floor`). Floating dtypes.",
    "elementwise.ceil": "Round toward +inf (`jnp.ceil`). Floating dtypes.",
    "elementwise.round": "Round half to even (`jnp.round`). Floating dtypes.",
    "elementwise.round_away": ("Round half away from zero (`lax.round` with "
                               "`RoundingMethod.AWAY_FROM_ZERO`). Floating dtypes."),
    # --- elementwise: arithmetic ---
    "elementwise.add": "`x + y`. Integers wrap around on overflow.",
    "elementwise.sub": "`x - y`. Integers wrap around on overflow.",
    "elementwise.mul": "`x * y`. Integers wrap around on overflow.",
    "elementwise.div": ("`x / y`. Floats: IEEE division. Integers truncate toward zero and "
                        "never trap: `x / 0` is -1 (all ones for unsigned types), "
                        "`INT_MIN / -1` is `INT_MIN`."),
    "elementwise.rem": ("`lax.rem`: the remainder with the sign of the dividend (`jnp.remainder` "
                        "and `%` add the correction for the divisor's sign around it). "
                        "Integers: `x % 0` is `x`, `INT_MIN % -1` is 0. Floats: `fmod`."),
    "elementwise.neg": "`-x`.",
    "elementwise.abs": "Absolute value (`jnp.abs`).",
    "elementwise.sign": "-1, 0 or 1 (`jnp.sign`); NaN for NaN.",
    "elementwise.square": "`x * x` (`jnp.square`).",
    "elementwise.max": ("`jnp.maximum`. NaN wins (either operand NaN gives NaN); "
                        "`max(-0.0, 0.0)` may be either zero."),
    "elementwise.min": "`jnp.minimum`. NaN wins, as for `max`.",
    # --- elementwise: logic and comparisons ---
    "elementwise.and": "Bitwise and (`&`), logical for bool. Integers and bool.",
    "elementwise.or": "Bitwise or (`jnp.bitwise_or`), logical for bool. Integers and bool.",
    "elementwise.xor": "Bitwise exclusive or (`^`), logical for bool. Integers and bool.",
    "elementwise.not": "Bitwise not (`~`), logical for bool. Integers and bool.",
    "elementwise.eq": _compare("==", "equal"),
    "elementwise.ne": _compare("!=", "not_equal"),
    "elementwise.lt": _compare("<", "less"),
    "elementwise.le": _compare("<=", "less_equal"),
    "elementwise.gt": _compare(">", "greater"),
    "elementwise.ge": _compare(">=", "greater_equal"),
    "select": ("`jnp.where(pred, a, b)` / `lax.select`: two-way selection by a bool tile or "
               "scalar. `lax.select_n` with more than two cases is a `KernelError`."),
    "convert": ("`x.astype(dtype)`. Float to integer saturates at the integer type's bounds "
                "and maps NaN to 0; float to bool is `x != 0` (NaN is true); to a 16- or "
                "8-bit float rounds to nearest even, once (as `ml_dtypes`): float8_e5m2 "
                "overflows to inf, float8_e4m3fn (no inf) to NaN, and inf becomes NaN "
                "there."),
    # --- reductions, scans, sorting ---
    "reduce.sum": _reduce("Sum", "jnp.sum", "0; a sum of bools is their `or`"),
    "reduce.prod": _reduce("Product", "jnp.prod", "1"),
    "reduce.max": _reduce("Maximum", "jnp.max", "the dtype's lowest value, NaN winning"),
    "reduce.min": _reduce("Minimum", "jnp.min", "the dtype's highest value, NaN winning"),
    "reduce.and": _reduce("Logical and", "jnp.all", "true"),
    "reduce.or": _reduce("Logical or", "jnp.any", "false"),
    "scan.sum": _scan("sum", "jnp.cumsum"),
    "scan.prod": _scan("product", "jnp.cumprod"),
    "scan.max": "`lax.cummax` along one axis, forward or reverse; NaN wins.",
    "scan.min": "`lax.cummin` along one axis, forward or reverse; NaN wins.",
    "argreduce.max": ("`jnp.argmax` along one axis: the index of the first maximum, NaN "
                      "counting as the largest (as XLA); an integer tile without that axis."),
    "argreduce.min": ("`jnp.argmin` along one axis: the index of the first minimum, NaN "
                      "counting as the smallest (as XLA); an integer tile without that axis."),
    "sort": ("`jnp.sort`, `jnp.argsort`, `lax.sort` of several operands (`num_keys` of them "
             "keys) and `lax.top_k` (`take` elements, descending in IEEE total order) of tiles "
             "along one axis, in XLA's order: ascending unless asked, stable, NaNs last, -0.0 "
             "equal to 0.0 (except in total order). A bitonic network, O(n log^2 n)."),
    # --- shapes ---
    "broadcast": "Broadcasting (`v[None, :]`, `jnp.broadcast_to`, scalar operands).",
    "reshape": ("`v.reshape(shape)`, `jnp.squeeze`, `jnp.expand_dims`: the same elements in "
                "row-major order; static shapes."),
    "transpose": "`v.T`, `jnp.transpose(v, perm)`: any permutation of the axes.",
    "rev": "`jnp.flip`: the tile reversed along the given axes.",
    "slice": ("Static slices of a tile value (`v[:, 1:]`, `v[::2]`), with strides. Slices of a "
              "*ref* are views instead (`x.at[...]`, `jt.ds`)."),
    "concatenate": "`jnp.concatenate` of one or more tiles along one axis.",
    # --- refs and tile operations ---
    "load": ("Reading a ref: `x[...]`, `x[i, j]`, `x[jt.ds(s, n), :]`. Starts that run past "
             "the end are clamped into range, as in JAX (a warning says where; `jt.copy` "
             "pads instead)."),
    "store": ("Writing a ref: `x[...] = v`, `x[...] += v`. Kernel inputs are read-only "
              "(`KernelError`); starts are clamped as for reads."),
    "copy": ("`jt.copy`, `jt.gather`, `jt.scatter`: a tile copy between refs, casting to the "
             "destination's dtype. Reads past the end of a global tensor give `pad` (default "
             "0), writes past it are dropped; `gather`/`scatter` take the positions along one "
             "dimension from a 1-D integer tile, and out-of-range positions read `pad` or are "
             "dropped."),
    "gemm": ("`jt.gemm(a, b, c)`: `c += op(a) @ op(b)` on 2-D on-chip tiles (shared, fragment "
             "or local, or views of them), `op` transposing when asked. The products of "
             "16-bit operands are exact in a float32 accumulator; 8-bit float operands need "
             "one (CUDA sums them with FMAs for now). `jnp.dot` of tile values is a "
             "`KernelError` pointing here."),
    "atomic.add": ("`jt.atomic_add` on a global output or an on-chip tile: each element updated "
                   "atomically; writes past a global edge are dropped. float32, float64, "
                   "int32, int64."),
    "atomic.max": "`jt.atomic_max`: as `atomic.add`, keeping the maximum (NaN wins).",
    "atomic.min": "`jt.atomic_min`: as `atomic.add`, keeping the minimum (NaN wins).",
    "load_acquire": ("`jt.load_acquire(flags.at[i])`: one element of a global buffer read with "
                     "acquire ordering (`ld.acquire.gpu`; a C11 acquire load on the CPU): later "
                     "reads see what the writer published before its release. float32, "
                     "float64, int32, int64."),
    "store_release": ("`jt.store_release(flags.at[i], v)`: one element of a global output "
                      "written with release ordering after every earlier write of the block "
                      "(`st.release.gpu` after a block barrier; a C11 release store on the "
                      "CPU). Reached by all the block's threads."),
    "fence": ("`jt.fence()`: orders the block's global accesses before it against those after "
              "it (`fence.acq_rel.gpu` after a block barrier; a sequentially consistent fence "
              "on the CPU)."),
    "print": ("`jt.print(\"row {} max {}\", r, m, when=c)`: one line per block where `c` "
              "holds, tagged with the block's indices; scalar values, printed as C's printf "
              "does (`%d`, `%g`). A runtime call writing to stdout on the CPU, device "
              "`printf` from thread 0 on CUDA, `jax.debug.callback` in the reference."),
    "relayout": ("Inserted by the GPU passes, never written: a value moved to another thread "
                 "layout through shared memory where two operations need different ones."),
    "barrier": ("Inserted by the GPU passes, never written: all threads of a block wait, and "
                "see each other's shared-memory writes (`__syncthreads`)."),
    "async_issue": ("Inserted by the GPU pipelining pass, never written: issues a `jt.pipelined` "
                    "loop's staged copies for a later iteration as `cp.async` (GPU only: the "
                    "CPU runs the copies where they stand)."),
    "async_commit": ("Inserted by the GPU pipelining pass, never written: closes the thread's "
                     "group of `cp.async` copies (`cp.async.commit_group`; GPU only)."),
    "async_wait": ("Inserted by the GPU pipelining pass, never written: waits until at most "
                   "`count` groups of `cp.async` copies are in flight "
                   "(`cp.async.wait_group`; GPU only)."),
    "tma_issue": ("Inserted by the GPU pipelining pass, never written: on a GPU with TMA, one "
                  "thread announces the tile's `bytes` on its stage's mbarrier and issues a "
                  "`jt.pipelined` loop's staged copies for a later iteration as TMA loads "
                  "(`cp.async.bulk.tensor`) completing on it."),
    "tma_wait": ("Inserted by the GPU pipelining pass, never written: waits until the TMA "
                 "loads of the iteration's stage have landed (`mbarrier.try_wait.parity`)."),
    "mbarrier_init": ("Inserted by the GPU pipelining pass, never written: declares a TMA "
                      "ring's mbarriers, one per stage; one thread initialises them "
                      "(`mbarrier.init`) and fences that (`fence.mbarrier_init`), between two "
                      "block barriers."),
    "tma_store": ("Inserted by the GPU TMA-store pass, never written: on a GPU with TMA, a "
                  "`jt.copy` of a shared tile to a global output made a TMA store "
                  "(`cp.async.bulk.tensor`, global from shared) that one thread issues and "
                  "commits as a bulk async-group; TMA clips the box at the output's edges."),
    "tma_store_wait": ("Inserted by the GPU TMA-store pass, never written: the issuing thread "
                       "waits for its TMA stores (`cp.async.bulk.wait_group`) before their "
                       "shared source is written again and before the kernel ends."),
    "tma_release": ("Inserted by the GPU warp-specialisation pass, never written: the "
                    "consumer warps are done with the iteration's stage of a TMA ring; each "
                    "warp's lane 0 arrives on the stage's empty mbarrier, which the producer "
                    "waits on before refilling it."),
    "warp_specialise": ("Inserted by the GPU warp-specialisation pass, never written (sm_90a): "
                        "the block is the kernel's `consumers` threads plus `producers` (one "
                        "warpgroup) whose elected thread issues the TMA ring's loads; "
                        "`setmaxnreg` gives each role `producer_regs` / `consumer_regs` "
                        "registers per thread, the consumers synchronise on named barrier "
                        "`barrier`."),
    "pingpong": ("Inserted by the GPU ping-pong pass, never written (sm_90a): the consumer "
                 "warpgroups of a warp-specialised kernel take turns at its ring loop's "
                 "gemms, warpgroup `w`'s turn on named barrier `barrier + w` of `count` "
                 "threads (the waiting warpgroup's and the handing one's)."),
    "turn_wait": ("Inserted by the GPU ping-pong pass, never written: before a run of gemms, "
                  "the warpgroup waits for its turn (`bar.sync`); where `first`, warpgroup 0 "
                  "does not in the loop's first iteration."),
    "turn_pass": ("Inserted by the GPU ping-pong pass, never written: after a run of gemms, "
                  "the warpgroup hands the turn to the next one (`bar.arrive`); where "
                  "`last`, the last warpgroup does not in the loop's last iteration."),
}
"""Operation name (op kind, or ``kind.fn``) -> markdown: what it computes, its dtypes and
limits."""

PRIMITIVES: dict[str, str] = {
    "integer_pow": ("`x ** n` for a static integer `n`: multiplications in XLA's order, then "
                    "a reciprocal for negative `n`."),
    "clamp": "`lax.clamp(lo, x, hi)`: `min(max(x, lo), hi)`, NaN as in `max`/`min`.",
    "while": ("`lax.while_loop`: `jt.loop`/`jt.pipelined` with bounds computed on the "
              "device (a `fori_loop` whose condition is `i < stop`) are counted loops, a "
              "`jt.while_` loops on a device condition, any other loops on its condition "
              "function. Values carried between iterations (scalars, tiles) live in on-chip "
              "tiles, a store and a load per iteration."),
    "scan": ("`lax.scan` without `xs` or `ys`: `jt.loop`/`jt.pipelined` and `fori_loop` with "
             "a static trip count; values carried between iterations live in on-chip tiles. "
             "A scan over `xs` or stacking `ys` is a `KernelError`."),
    "cond": ("`lax.cond`/`lax.switch` (and `jt.when`) on a scalar computed on the device, with "
             "operands and results (scalars, tiles: each result passes through an on-chip "
             "tile)."),
    "jit": "A nested `jax.jit` call: inlined.",
    "closed_call": "A nested call of a closed function: inlined.",
    "remat2": "`jax.checkpoint`: inlined (nothing is rematerialised inside a kernel).",
    "custom_jvp_call": ("A function with a `jax.custom_jvp` rule (`jax.nn.relu`, ...): its "
                        "primal body is inlined."),
    "custom_vjp_call": "A function with a `jax.custom_vjp` rule: its primal body is inlined.",
    "stop_gradient": "`lax.stop_gradient`: the value itself.",
    "optimization_barrier": "`lax.optimization_barrier`: the values themselves.",
    "copy": "`jnp.copy` of a tile value: the value itself.",
    "stack": ("`jnp.stack` of tile values: each operand reshaped with a unit dimension at "
              "the axis, then a `concatenate` along it."),
    "dot_general": ("`jnp.dot`/`@` of two 2-D tile values contracting one dimension each "
                    "(`q @ k.T`): the operands stored in on-chip tiles (A a fragment, B "
                    "shared), a `gemm` into a zeroed accumulator of the result's dtype, "
                    "and its value; float results only."),
}
"""JAX primitive -> markdown, for the primitives that are not one Tile IR operation each."""
