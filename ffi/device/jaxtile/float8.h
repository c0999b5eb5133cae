// 8-bit floats on the GPU (CUDA and AMD): float8_e4m3fn and float8_e5m2 as ml_dtypes and XLA
// define them, in integer arithmetic that is the same on every target.
//
// Included by device_ptx.h and device_hip.h (after JT_DEVICE); the emulator
// has its own, independently written conversions (device_emu.h), so that a mistake here
// shows as a difference there.
//
// float32 -> 8 bits rounds to nearest, ties to even, once. Overflow: float8_e5m2 gives inf,
// float8_e4m3fn (which has no inf) gives NaN, and so does inf. NaN stays NaN (sign kept).
// float64 is first narrowed to float32 rounding to odd: then the second rounding, to 3 or 2
// mantissa bits, is the one a direct rounding would make (24 >= 2 * 4 + 2 bits).
// Not cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (sm_89+): it saturates where XLA gives NaN or inf.
#pragma once

namespace jaxtile {
namespace f8_ {

JT_DEVICE unsigned f32_bits_of_(float f) {
  union {
    float f;
    unsigned u;
  } v{f};
  return v.u;
}
JT_DEVICE float f32_of_bits_(unsigned u) {
  union {
    unsigned u;
    float f;
  } v{u};
  return v.f;
}

// The bits of |f| (float32 bits `a`, sign removed) in a format with E exponent and M
// mantissa bits; `fn`: no inf, the all-ones pattern is NaN (e4m3fn).
template <int E, int M, bool FN>
JT_DEVICE unsigned magnitude_bits(unsigned a) {
  constexpr int kBias = (1 << (E - 1)) - 1;
  constexpr unsigned kNan = FN ? 0x7fu : (0x1fu << M) | (1u << (M - 1));
  constexpr unsigned kOverflow = FN ? 0x7fu : 0x1fu << M;       // NaN, or inf
  constexpr unsigned kMaxFinite = FN ? 0x7eu : (0x1fu << M) - 1;
  if (a > 0x7f800000u) return kNan;
  unsigned bits;
  if (a >= static_cast<unsigned>(128 - kBias) << 23) {
    // A normal result (or overflow): round away the low 23 - M bits, then rebias.
    constexpr int kShift = 23 - M;
    const unsigned rounded = a + ((1u << (kShift - 1)) - 1) + ((a >> kShift) & 1u);
    const unsigned wide = rounded >> kShift;  // exponent and mantissa, float32's bias
    constexpr unsigned kRebias = static_cast<unsigned>(127 - kBias) << M;
    bits = wide - kRebias;
    if (wide > kRebias + kMaxFinite) bits = kOverflow;
  } else {
    // Subnormal (or zero): the significand in units of the smallest subnormal,
    // 2^(1 - bias - M), rounded to nearest even. A float32 subnormal is far below them.
    const unsigned exp = a >> 23;
    if (exp == 0) return 0;
    const unsigned sig = (a & 0x7fffffu) | 0x800000u;
    const unsigned shift = static_cast<unsigned>(151 - kBias - M) - exp;  // >= 24 - M
    if (shift > 25) return 0;  // below half the smallest subnormal
    const unsigned q = sig >> shift;
    const unsigned rest = sig & ((1u << shift) - 1);
    const unsigned half = 1u << (shift - 1);
    bits = q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u);
  }
  return bits;
}

template <int E, int M, bool FN>
JT_DEVICE uint8_t from_float(float f) {
  const unsigned x = f32_bits_of_(f);
  return static_cast<uint8_t>(((x >> 24) & 0x80u) | magnitude_bits<E, M, FN>(x & 0x7fffffffu));
}

// float64 -> float32, rounded to odd: truncate, and set the last bit if anything was lost.
JT_DEVICE float narrow_to_odd(double d) {
  const float f = static_cast<float>(d);
  if (d != d || static_cast<double>(f) == d) return f;
  unsigned x = f32_bits_of_(f);
  if ((f < 0 ? -static_cast<double>(f) : static_cast<double>(f)) > (d < 0 ? -d : d)) x -= 1;
  return f32_of_bits_(x | 1u);
}

template <int E, int M, bool FN>
JT_DEVICE float to_float(uint8_t b) {
  constexpr int kBias = (1 << (E - 1)) - 1;
  const unsigned sign = static_cast<unsigned>(b & 0x80u) << 24;
  const unsigned exp = (b >> M) & ((1u << E) - 1);
  const unsigned man = b & ((1u << M) - 1);
  if (FN ? (b & 0x7fu) == 0x7fu : exp == (1u << E) - 1) {
    return f32_of_bits_(sign | 0x7f800000u | (FN ? 0x400000u : man << (23 - M)));
  }
  if (exp == 0) {  // subnormal: man * 2^(1 - bias - M), exact in float32
    const float mag = static_cast<float>(man) * f32_of_bits_((128u - kBias - M) << 23);
    return f32_of_bits_(sign | f32_bits_of_(mag));
  }
  return f32_of_bits_(sign | (exp + 127 - kBias) << 23 | man << (23 - M));
}

}  // namespace f8_

JT_DEVICE float to_float(fp8e4m3 h) { return f8_::to_float<4, 3, true>(h.bits); }
JT_DEVICE float to_float(fp8e5m2 h) { return f8_::to_float<5, 2, false>(h.bits); }
JT_DEVICE fp8e4m3 to_fp8e4m3(float f) { return {f8_::from_float<4, 3, true>(f)}; }
JT_DEVICE fp8e5m2 to_fp8e5m2(float f) { return {f8_::from_float<5, 2, false>(f)}; }
JT_DEVICE fp8e4m3 to_fp8e4m3(double d) { return to_fp8e4m3(f8_::narrow_to_odd(d)); }
JT_DEVICE fp8e5m2 to_fp8e5m2(double d) { return to_fp8e5m2(f8_::narrow_to_odd(d)); }

}  // namespace jaxtile
