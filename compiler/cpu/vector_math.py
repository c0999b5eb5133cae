"""Float math as TIR expressions where the plain TVM op is wrong or slow on the CPU.

:func:`exp_f32`, :func:`tanh_f32` and :func:`erfc_f32` vectorise (``tirx.exp`` and libm's
``erfcf`` become one scalar call per lane, ``tirx.tanh`` is inaccurate near 0);
:func:`maximum`/:func:`minimum` propagate NaN like ``lax.max``/``lax.min`` (``tirx.max`` does
not); :func:`rsqrt` keeps its loop vectorised
(``tirx.rsqrt`` does not); :func:`round_to_bfloat16` rounds explicitly, since TVM folds
``Cast("float32", Cast("bfloat16", x))`` to ``x``.
"""

from __future__ import annotations

from collections.abc import Callable

from tvm import tirx
from tvm.ir import Expr

from .tir_emit import ExprLike, as_expr, dtype_of, involves_bfloat16


def _f32(value: float) -> Expr:
    return tirx.const(value, "float32")


def _u32(value: int) -> Expr:
    return tirx.const(value, "uint32")


def _bind(name: str, value: Expr, body: Callable[[Expr], Expr]) -> Expr:
    """``let name = value in body(name)`` as a TIR expression (evaluates ``value`` once)."""
    var = tirx.Var(name, dtype_of(value))
    return tirx.Let(var, value, body(var))


def _pow2(n: Expr) -> Expr:
    """2.0**n as float32 for an int32 ``n`` in [-126, 127], built from exponent bits."""
    return tirx.reinterpret("float32", (n + 127) << 23)


# Cephes expf: exp(x) = 2**n * exp(r), n = round(x / ln 2), r = x - n ln 2 (Cody-Waite split
# of ln 2 into a 9-bit head and a tail, so n * _LN2_HI is exact), exp(r) = 1 + r + r^2 P(r).
_LOG2E = 1.44269504088896341
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)  # fmt: skip
# Inputs are clamped to [_EXP_LO, _EXP_HI]: exp(-104) rounds to 0 and exp(89) overflows, so
# the clamp only saturates results that are 0 or inf anyway.
_EXP_LO = -104.0
_EXP_HI = 89.0
# Adding 1.5 * 2**23 rounds x / ln 2 (|x / ln 2| < 2**22) to the nearest integer n, which
# the sum's low mantissa bits then hold: n = bits(t) - bits(_EXP_SHIFT). One add gives n as
# a float and as an integer, where floor and a conversion took three ops.
_EXP_SHIFT = 12582912.0
_EXP_SHIFT_BITS = 0x4B400000


def _exp_expm1(r: Expr, r2: Expr) -> Expr:
    """``exp(r) - 1 = r + r^2 P(r)`` for Cephes' degree-5 ``P``, as
    ``(r + r^2 (q0 + q1 r)) + r^4 ((q2 + q3 r) + r^2 (q4 + q5 r))``: three multiply-adds
    deep after ``r2`` where Horner's scheme is seven. A loop of exps is limited by this
    latency, not by its op count (each exp is one long dependency chain, and the
    out-of-order window holds only a few), so on AVX2, where a vector holds 8 lanes, the
    shorter chain is what makes it faster. The large terms are still added last."""
    q = _EXP_POLY[::-1]  # q[k] multiplies r**(k + 2)
    low = r2 * (r * _f32(q[1]) + _f32(q[0])) + r
    high = r2 * (r * _f32(q[5]) + _f32(q[4])) + (r * _f32(q[3]) + _f32(q[2]))
    return (r2 * r2) * high + low


def exp_f32(x: Expr) -> Expr:
    """Vectorisable float32 ``exp(x)``, within 1 ulp (checked on 2**28 inputs spanning all
    of float32, subnormal results included).

    Built only from arithmetic, integer ops and bit reinterprets, so it vectorises inside
    ``"vectorized"`` loops, unlike ``tirx.exp`` which LLVM turns into one scalar ``expf``
    call per lane. Gives +inf for x > 88.72, 0 for x < -103.98 (and -inf), NaN for NaN.
    ``x`` is evaluated once, through ``Let`` bindings, so it must not involve bfloat16 (see
    :func:`build`): pass such a value through :meth:`KernelBuilder.let` first.
    """
    if dtype_of(x) != "float32":
        raise TypeError(f"exp_f32 needs a float32 operand, got {dtype_of(x)}")
    if involves_bfloat16(x):
        raise ValueError("exp_f32 operand involves bfloat16; bind it with KernelBuilder.let")

    def from_clamped(xc: Expr) -> Expr:
        def from_shifted(t: Expr) -> Expr:
            def from_n(n: Expr) -> Expr:
                # n in [-151, 129] (NaN for a NaN x, whose integer bits below are then
                # garbage: the result is NaN through r anyway).
                ni = tirx.reinterpret("int32", t) - tirx.const(_EXP_SHIFT_BITS, "int32")
                half = ni >> 1

                def from_r(r: Expr) -> Expr:
                    def from_r2(r2: Expr) -> Expr:
                        # Two power-of-two scalings reach 2**-151 .. 2**129 without overflow
                        # in the exponent field. The first, by s = 2**half, is exact
                        # (2**-76 .. 2**64 times y in [0.7, 1.5] stays normal), so
                        # (1 + expm1) * s is one multiply-add, rounded as 1 + expm1 would
                        # be; the final multiply rounds subnormals correctly.
                        s = _pow2(half)
                        return (_exp_expm1(r, r2) * s + s) * _pow2(ni - half)

                    return _bind("exp_r2", r * r, from_r2)

                return _bind("exp_r", xc - n * _f32(_LN2_HI) - n * _f32(_LN2_LO), from_r)

            return _bind("exp_n", t - _f32(_EXP_SHIFT), from_n)

        return _bind("exp_t", xc * _f32(_LOG2E) + _f32(_EXP_SHIFT), from_shifted)

    # Selects written so that a NaN x falls through both (TIR's max/min would replace it).
    def clamp_hi(xl: Expr) -> Expr:
        return _bind("exp_x", tirx.Select(xl > _f32(_EXP_HI), _f32(_EXP_HI), xl), from_clamped)

    return _bind("exp_xl", tirx.Select(x < _f32(_EXP_LO), _f32(_EXP_LO), x), clamp_hi)


# tanh(x) = x P(x^2) / Q(x^2) for |x| <= _TANH_SAT: an odd rational approximation whose
# coefficients were fitted for this module (tools/fit_rational.py: minimax of the relative error
# on [0, _TANH_SAT] by linear programming, 7e-9 before float32 rounding). One
# division and nine multiply-adds per element, against an exp and a division for the formula
# 1 - 2 / (exp(2|x|) + 1).
_TANH_P = (1.0, 0.13753530383110046, 0.0039682467468082905, 3.0735493055544794e-05,
           4.790353713701734e-08)  # fmt: skip
_TANH_Q = (1.0, 0.47086864709854126, 0.027591152116656303, 0.0004135332419537008,
           1.5526999277426512e-06, 6.816868181047653e-10)  # fmt: skip
# tanh rounds to 1.0 in float32 from atanh(1 - 2**-25) = 9.0109 on.
_TANH_SAT = 9.02
# Below 2**-12 tanh(x) = x to within half an ulp (the next term is x^3 / 3). Returning x
# there also keeps subnormals (the rational would flush them where denormals are off, as
# in XLA's threads) and the sign of zero.
_TANH_TINY = 2.0**-12


def _horner(coeffs: tuple[float, ...], z: Expr) -> Expr:
    p = _f32(coeffs[-1])
    for coeff in reversed(coeffs[:-1]):
        p = p * z + _f32(coeff)
    return p


def tanh_f32(x: Expr) -> Expr:
    """Vectorisable float32 ``tanh(x)``, within 5 ulp like XLA:CPU's own (checked against
    float64 on millions of inputs); exactly +-1 from 9.02 on, ``x`` itself below 2**-12
    (so +-0 and subnormals are kept), NaN for NaN.

    ``tirx.tanh`` is ``(exp(2x) - 1) / (exp(2x) + 1)`` with scalar ``expf`` calls, which
    loses all accuracy near 0 (``tanh(1e-8)`` gives 0, ``tanh(1e-6)`` is 1% off). Same
    operand rules as :func:`exp_f32`.
    """
    if dtype_of(x) != "float32":
        raise TypeError(f"tanh_f32 needs a float32 operand, got {dtype_of(x)}")
    if involves_bfloat16(x):
        raise ValueError("tanh_f32 operand involves bfloat16; bind it with KernelBuilder.let")

    def from_x(xv: Expr) -> Expr:
        def from_abs(ax: Expr) -> Expr:
            def from_z(z: Expr) -> Expr:
                ratio = ax * _horner(_TANH_P, z) / _horner(_TANH_Q, z)
                # The rounding of the last ulps may reach past 1; huge or infinite |x|
                # (inf / inf) are replaced by the saturated value. Selects let NaN through.
                return tirx.Select(ratio > _f32(1.0), _f32(1.0), ratio)

            def signed(m: Expr) -> Expr:
                return tirx.Select(ax < _f32(_TANH_TINY), xv,
                                   tirx.Select(xv < _f32(0.0), -m, m))

            magnitude = tirx.Select(ax > _f32(_TANH_SAT), _f32(1.0),
                                    _bind("tanh_z", ax * ax, from_z))
            return _bind("tanh_m", magnitude, signed)

        return _bind("tanh_a", tirx.abs(xv), from_abs)

    return _bind("tanh_x", x, from_x)


# erfc(a) = exp(-a^2) R(a) for a = |x| >= 0, where R = erfcx (the scaled complementary error
# function, smooth and about 1 / (a sqrt(pi)) far out) is a rational function of degrees 6
# and 7 fitted like tanh's (tools/fit_rational.py, on [0, _ERFC_ZERO]; 7.4e-9 before rounding).
_ERFCX_P = (1.0, 1.086056713410708, 0.5547478966737908, 0.13134738076643332,
            0.005149437416703685, -0.003043909620902083, 0.00014996529937945022)  # fmt: skip
_ERFCX_Q = (1.0, 2.2144362302821605, 2.053465234931611, 0.98629514159227,
            0.23025595290922343, 0.009249958548655767, -0.005394780372584068,
            0.00026579921466978173)  # fmt: skip
# erfc(10.06) is below the smallest float32 subnormal.
_ERFC_ZERO = 10.1


def erfc_f32(x: Expr) -> Expr:
    """Vectorisable float32 ``erfc(x)`` (``libm``'s ``erfcf`` is one scalar call per lane):
    ``exp(-x^2) R(|x|)`` with a rational ``R``, and ``2 - erfc(-x)`` for negative ``x``.
    ``x^2`` is carried with its rounding error (a fused multiply-add), which ``exp`` of a
    large square would otherwise magnify. 0 from 10.1 on (and for +inf), 2 for -inf, NaN
    for NaN. Same operand rules as :func:`exp_f32`."""
    if dtype_of(x) != "float32":
        raise TypeError(f"erfc_f32 needs a float32 operand, got {dtype_of(x)}")
    if involves_bfloat16(x):
        raise ValueError("erfc_f32 operand involves bfloat16; bind it with KernelBuilder.let")

    def from_x(xv: Expr) -> Expr:
        def from_abs(a: Expr) -> Expr:
            def from_square(sq: Expr) -> Expr:
                # sq + err == a * a exactly; exp(-sq - err) = exp(-sq) (1 - err) here.
                err = tirx.call_llvm_pure_intrin("float32", "llvm.fma", a, a, -sq)
                scale = exp_f32(-sq) * (_f32(1.0) - err)
                ratio = _horner(_ERFCX_P, a) / _horner(_ERFCX_Q, a)
                return tirx.Select(a > _f32(_ERFC_ZERO), _f32(0.0), scale * ratio)

            def signed(r: Expr) -> Expr:
                return tirx.Select(xv < _f32(0.0), _f32(2.0) - r, r)

            return _bind("erfc_r", _bind("erfc_sq", a * a, from_square), signed)

        return _bind("erfc_a", tirx.abs(xv), from_abs)

    return _bind("erfc_x", x, from_x)


def _float_minmax(intrinsic: str, a: Expr, b: Expr) -> Expr:
    dtype = dtype_of(a)
    if dtype in ("float16", "bfloat16"):
        # Exact through float32: max/min only select one of the operands.
        wide = _float_minmax(intrinsic, tirx.Cast("float32", a), tirx.Cast("float32", b))
        return tirx.Cast(dtype, wide)
    return tirx.call_llvm_pure_intrin(dtype, intrinsic, a, b)


def maximum(a: Expr, b: ExprLike) -> Expr:
    """Elementwise max; for floats NaN-propagating like ``lax.max`` (``tirx.max`` is not)."""
    b = as_expr(b, dtype_of(a))
    if dtype_of(a).startswith(("float", "bfloat")):
        return _float_minmax("llvm.maximum", a, b)
    return tirx.max(a, b)


def minimum(a: Expr, b: ExprLike) -> Expr:
    """Elementwise min; for floats NaN-propagating like ``lax.min`` (``tirx.min`` is not)."""
    b = as_expr(b, dtype_of(a))
    if dtype_of(a).startswith(("float", "bfloat")):
        return _float_minmax("llvm.minimum", a, b)
    return tirx.min(a, b)


def rsqrt(x: Expr) -> Expr:
    """``1 / sqrt(x)``; unlike ``tirx.rsqrt`` it vectorises."""
    return tirx.const(1.0, dtype_of(x)) / tirx.sqrt(x)


def round_to_bfloat16(x: Expr) -> Expr:
    """Round float32 ``x`` to the nearest bfloat16 value (ties to even), as float32.

    Use this for bfloat16 rounding inside an expression: TVM drops the round trip
    ``Cast("float32", Cast("bfloat16", x))`` entirely. NaN stays NaN; vectorises.
    """
    if dtype_of(x) != "float32":
        raise TypeError(f"round_to_bfloat16 needs a float32 operand, got {dtype_of(x)}")

    def rounded(bits: Expr) -> Expr:
        is_nan = (bits & _u32(0x7FFFFFFF)) > _u32(0x7F800000)
        even = bits + _u32(0x7FFF) + ((bits >> _u32(16)) & _u32(1))
        # A NaN is kept (made quiet, so truncation cannot turn it into inf).
        out = tirx.Select(is_nan, bits | _u32(0x400000), even) & _u32(0xFFFF0000)
        return tirx.reinterpret("float32", out)

    return _bind("bf16_bits", tirx.reinterpret("uint32", x), rounded)
