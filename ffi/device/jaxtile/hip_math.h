// The C math functions generated device code calls (expf, logf, sinf, ... and their double
// forms), for AMD GPUs compiled with -nogpulib: there is no device math library (ocml), so
// they are written here in plain C++ over clang builtins that lower to single instructions
// (fma, floor, rint, trunc, ldexp, frexp, sqrt: v_fma_f64, v_floor_f64, v_rndne_f64,
// v_trunc_f64, v_ldexp_f64, v_frexp_*_f64, and LLVM's correctly rounded sqrt expansion).
// Included by device_hip.h, which also takes its float -> bfloat16 / tf32 rounding from here;
// it is also compiled on the host by the tests, which check every function against the C
// library (and the roundings against ml_dtypes).
//
// Method: every function is computed in double (CDNA runs float64 at the float32 rate), and
// the float form rounds the double result once, so the float functions are within 1 ulp. The
// double forms reduce the argument exactly or in extra precision (Cody-Waite with a 3-part
// pi/2, Payne-Hanek past 2^20 pi/2; log and exp carry a low part) and sum Taylor series far enough for 2^-60; measured
// by the tests: within 4 ulp (erf and erfc: 8, their series and continued fraction
// accumulate roundings).
// Special values follow C99 Annex F (NaN in, NaN out; signed zeros and infinities as the C
// library gives them), which is what XLA's per-element rules assume.
#pragma once

namespace jaxtile {
namespace math_ {

constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2's high 32 bits: k * kLn2Hi exact
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kLn2 = 6.93147180559945286227e-01;
constexpr double kLn2Tail = 2.31904681384629955842e-17;  // ln 2 - kLn2
constexpr double kLog2e = 1.44269504088896338700e+00;
constexpr double kPi = 3.14159265358979311600e+00;
constexpr double kPiLo = 1.22464679914735317720e-16;  // pi - kPi
constexpr double kPio2 = 1.57079632679489655800e+00;
constexpr double kPio2Lo = 6.12323399573676588610e-17;
// pi/2 in three 33-bit parts and their tails (fdlibm's split), for Cody-Waite reduction.
constexpr double kPio2_1 = 1.57079632673412561417e+00;
constexpr double kPio2_2 = 6.07710050630396597660e-11;
constexpr double kPio2_3 = 2.02226624871116645580e-21;
constexpr double kPio2_3t = 8.47842766036889956997e-32;
constexpr double kInvPio2 = 6.36619772367581382433e-01;
constexpr double kInf = __builtin_inf();
constexpr double kNaN = __builtin_nan("");

JT_DEVICE bool isnan_(double x) { return x != x; }
JT_DEVICE bool isinf_(double x) { return __builtin_fabs(x) == kInf; }

// e^(hi + lo) for |lo| << |hi|: hi - k ln2 is reduced in two parts (exact for the first),
// the residual r (|r| <= ln2 / 2) goes through a degree-13 Taylor polynomial, and 2^k is
// applied in two steps so that results near the overflow and underflow edges are right.
JT_DEVICE double exp_hilo_(double hi, double lo) {
  if (isnan_(hi)) return hi;
  if (hi > 709.8) return kInf;
  if (hi < -745.2) return 0.0;
  const double k = __builtin_rint(hi * kLog2e);
  const double r = ((hi - k * kLn2Hi) - k * kLn2Lo) + lo;
  double p = 1.0 / 6227020800.0;  // 1/13!
  const double inv[] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                        1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,     1.0 / 120.0,
                        1.0 / 24.0,        1.0 / 6.0,        0.5,             1.0,
                        1.0};
  for (double c : inv) p = __builtin_fma(p, r, c);
  const int ki = static_cast<int>(k);
  const int half = ki / 2;
  return __builtin_ldexp(__builtin_ldexp(p, half), ki - half);
}

// log(x) = hi + lo for finite x > 0, to about 2^-60 absolute: x = m 2^e with
// m in [sqrt(1/2), sqrt(2)), f = m - 1 exact, log(1 + f) = f + g with
// g = -(f^2/2 - s (f^2/2 + R)), s = f / (2 + f) and R = sum 2 s^(2k) / (2k + 1) (fdlibm's form
// of 2 atanh(s), with the series' own coefficients).
JT_DEVICE void log_hilo_(double x, double& hi, double& lo) {
  int e;
  double m = __builtin_frexp(x, &e);  // m in [0.5, 1)
  if (m < 0.70710678118654752440) {
    m *= 2.0;
    e -= 1;
  }
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  double R = 2.0 / 23.0;
  for (int k = 10; k >= 1; --k) R = __builtin_fma(R, z, 2.0 / (2 * k + 1));
  R *= z;
  const double hfsq = 0.5 * f * f;
  const double g = -(hfsq - s * (hfsq + R));
  const double de = static_cast<double>(e);
  // de * kLn2Hi is exact; adding f is a two-sum, so hi + lo keeps every bit.
  const double a = de * kLn2Hi;
  hi = a + f;
  const double bv = hi - a;
  const double err = (a - (hi - bv)) + (f - bv);
  lo = err + g + de * kLn2Lo;
  const double t = hi + lo;
  lo = lo - (t - hi);
  hi = t;
}

JT_DEVICE double exp(double x) { return exp_hilo_(x, 0.0); }

JT_DEVICE double exp2(double x) {
  if (isnan_(x)) return x;
  if (x >= 1024.0) return kInf;
  if (x < -1080.0) return 0.0;
  const double k = __builtin_rint(x);
  // (x - k) ln 2 in two parts: x - k is exact, its product with ln 2 is rounded once.
  const double f = x - k;
  const double r = f * kLn2;
  const double p = exp_hilo_(r, __builtin_fma(f, kLn2, -r) + f * kLn2Tail);
  const int ki = static_cast<int>(k);
  const int half = ki / 2;
  return __builtin_ldexp(__builtin_ldexp(p, half), ki - half);
}

JT_DEVICE double log(double x) {
  if (isnan_(x) || x < 0.0) return kNaN;
  if (x == 0.0) return -kInf;
  if (x == kInf) return x;
  double hi, lo;
  log_hilo_(x, hi, lo);
  return hi + lo;
}

// log1p and expm1 by Goldberg's and Kahan's corrections: the rounding of 1 + x (or of
// e^x - 1) is divided back out, which keeps small arguments exact to a few ulp.
JT_DEVICE double log1p(double x) {
  if (isnan_(x) || x < -1.0) return kNaN;
  if (x == -1.0) return -kInf;
  if (x == kInf) return x;
  const double u = 1.0 + x;
  if (u == 1.0) return x;
  return log(u) * (x / (u - 1.0));
}

JT_DEVICE double expm1(double x) {
  if (isnan_(x)) return x;
  if (x > 709.8) return kInf;
  if (x < -40.0) return -1.0;
  if (x == 0.0) return x;  // keeps -0
  if (__builtin_fabs(x) < 1e-5) return x + 0.5 * x * x + x * x * x / 6.0;
  const double u = exp(x);
  if (u == 1.0) return x;
  const double um1 = u - 1.0;
  if (um1 == -1.0) return -1.0;
  return um1 * (x / log(u));
}

// x^y with C99's special cases; the finite case is e^(y log|x|) with log in two parts.
JT_DEVICE double pow(double x, double y) {
  if (y == 0.0 || x == 1.0) return 1.0;
  if (isnan_(x) || isnan_(y)) return kNaN;
  const double ax = __builtin_fabs(x);
  const bool y_int = __builtin_trunc(y) == y;
  // Odd: an integer below 2^53 whose half is not (y - 2 trunc(y / 2) is exact there).
  const bool y_odd = y_int && __builtin_fabs(y) < 9007199254740992.0 &&
                     __builtin_trunc(y * 0.5) * 2.0 != y;
  if (isinf_(y)) {
    if (ax == 1.0) return 1.0;
    return (ax < 1.0) == (y < 0.0) ? kInf : 0.0;
  }
  if (x == 0.0 || isinf_(x)) {
    // |x| is 0 or inf: the magnitude is 0 or inf, the sign is x's for odd integer y.
    const bool big = (x == 0.0) == (y < 0.0);
    const double mag = big ? kInf : 0.0;
    return (y_odd && __builtin_signbit(x)) ? -mag : mag;
  }
  if (x < 0.0 && !y_int) return kNaN;
  double hi, lo;
  log_hilo_(ax, hi, lo);
  const double phi = y * hi;
  const double plo = __builtin_fma(y, hi, -phi) + y * lo;
  const double r = exp_hilo_(phi, plo);
  return (x < 0.0 && y_odd) ? -r : r;
}

// 2/pi's first 1280 bits after the binary point, 32 a word (enough for any double: a
// reduction reads at most bit 1130). Computed with integer arithmetic;
// tests/compiler/hip/test_hip_math.py recomputes them.
constexpr unsigned kTwoOverPiBits[40] = {
    0xA2F9836Eu, 0x4E441529u, 0xFC2757D1u, 0xF534DDC0u, 0xDB629599u, 0x3C439041u, 0xFE5163ABu,
    0xDEBBC561u, 0xB7246E3Au, 0x424DD2E0u, 0x06492EEAu, 0x09D1921Cu, 0xFE1DEB1Cu, 0xB129A73Eu,
    0xE88235F5u, 0x2EBB4484u, 0xE99C7026u, 0xB45F7E41u, 0x3991D639u, 0x835339F4u, 0x9C845F8Bu,
    0xBDF9283Bu, 0x1FF897FFu, 0xDE05980Fu, 0xEF2F118Bu, 0x5A0A6D1Fu, 0x6D367ECFu, 0x27CB09B7u,
    0x4F463F66u, 0x9E5FEA2Du, 0x7527BAC7u, 0xEBE5F17Bu, 0x3D0739F7u, 0x8A5292EAu, 0x6BFB5FB1u,
    0x1F8D5D08u, 0x56033046u, 0xFC7B6BABu, 0xF0CFBC20u, 0x9AF4361Du};

// The 32 bits of 2/pi starting at bit k (1 is the first after the binary point).
JT_DEVICE unsigned two_over_pi_bits_(int k) {
  const int q = (k - 1) / 32, o = (k - 1) % 32;
  const unsigned long long v =
      (static_cast<unsigned long long>(kTwoOverPiBits[q]) << 32) | kTwoOverPiBits[q + 1];
  return static_cast<unsigned>(v >> (32 - o));
}
// The 64 bits at bit offset `bit` of the 256-bit number p (eight words, least significant
// first).
JT_DEVICE unsigned long long bits64_(const unsigned (&p)[8], int bit) {
  unsigned long long out = 0;
  for (int i = 0; i < 2; ++i) {
    const int b = bit + 32 * i, j = b / 32, o = b % 32;
    const unsigned long long pair =
        (static_cast<unsigned long long>(j + 1 < 8 ? p[j + 1] : 0u) << 32) | p[j];
    out |= static_cast<unsigned long long>(static_cast<unsigned>(pair >> o)) << (32 * i);
  }
  return out;
}

// Payne-Hanek reduction for |x| >= 2^20 pi/2, where Cody-Waite's n * (pi/2 parts) is no
// longer exact: x = m 2^e (m a 53-bit integer) times 2/pi, keeping only the bits of 2/pi
// that reach the product's last two integer bits and 192 bits below them (the product's
// fraction needs at most 61 leading zeros plus 53 bits for any double). Returns n mod 4 and
// r = x - n pi/2 in [-pi/4, pi/4].
JT_DEVICE int rem_pio2_large_(double x, double& r) {
  int ex;
  const double mant = __builtin_frexp(__builtin_fabs(x), &ex);
  const unsigned long long m = static_cast<unsigned long long>(__builtin_ldexp(mant, 53));
  const int e = ex - 53;                // |x| = m 2^e
  const int s = e - 1 > 1 ? e - 1 : 1;  // bits of 2/pi before s add multiples of 4
  unsigned p[8] = {};                   // m times bits s .. s+191 of 2/pi
  unsigned long long carry = 0;
  for (int i = 5; i >= 0; --i) {
    const unsigned __int128 t =
        static_cast<unsigned __int128>(m) * two_over_pi_bits_(s + 32 * i) + carry;
    p[5 - i] = static_cast<unsigned>(t);
    carry = static_cast<unsigned long long>(t >> 32);
  }
  p[6] = static_cast<unsigned>(carry);
  p[7] = static_cast<unsigned>(carry >> 32);
  const int point = s + 191 - e;  // bits below the binary point
  int n = static_cast<int>(bits64_(p, point) & 3u);
  unsigned long long hi = bits64_(p, point - 64), lo = bits64_(p, point - 128);
  bool negative = false;
  if (hi >> 63) {  // fraction >= 1/2: the next quadrant, r negative
    n += 1;
    negative = true;
    lo = ~lo + 1;
    hi = ~hi + (lo == 0 ? 1 : 0);
  }
  // The 128-bit fraction as hi + lo doubles (normalised: its leading zeros shifted out).
  const int lz = hi ? __builtin_clzll(hi) : 64 + __builtin_clzll(lo | 1);
  unsigned long long top, rest;
  if (lz == 0) {
    top = hi;
    rest = lo;
  } else if (lz < 64) {
    top = (hi << lz) | (lo >> (64 - lz));
    rest = lo << lz;
  } else {
    top = lo << (lz - 64);
    rest = 0;
  }
  const double fhi = __builtin_ldexp(static_cast<double>(top >> 11), -53 - lz);
  const double flo = __builtin_ldexp(static_cast<double>(top & 0x7FFu), -64 - lz) +
                     __builtin_ldexp(static_cast<double>(rest >> 11), -117 - lz);
  const double rhi = fhi * kPio2;
  const double rlo = __builtin_fma(fhi, kPio2, -rhi) + fhi * kPio2Lo + flo * kPio2;
  r = rhi + rlo;
  if (negative) r = -r;
  if (x < 0) {
    r = -r;
    n = -n;
  }
  return n & 3;
}

// Reduces x to r in [-pi/4, pi/4] with x = r + n pi/2, returning n mod 4.
JT_DEVICE int rem_pio2_(double x, double& r) {
  if (__builtin_fabs(x) >= 1647099.0) return rem_pio2_large_(x, r);  // 2^20 pi/2
  const double n = __builtin_rint(x * kInvPio2);
  double y = x - n * kPio2_1;
  y -= n * kPio2_2;
  r = (y - n * kPio2_3) - n * kPio2_3t;
  return static_cast<int>(static_cast<long long>(n) & 3);
}
// Taylor polynomials on [-pi/4, pi/4] (terms to x^19 and x^20: below 2^-60 there).
JT_DEVICE double sin_poly_(double r) {
  const double z = r * r;
  double p = -1.0 / 121645100408832000.0;  // -1/19!
  const double c[] = {1.0 / 355687428096000.0, -1.0 / 1307674368000.0, 1.0 / 6227020800.0,
                      -1.0 / 39916800.0,       1.0 / 362880.0,         -1.0 / 5040.0,
                      1.0 / 120.0,             -1.0 / 6.0};
  for (double k : c) p = __builtin_fma(p, z, k);
  return __builtin_fma(r * z, p, r);
}
JT_DEVICE double cos_poly_(double r) {
  const double z = r * r;
  double p = 1.0 / 2432902008176640000.0;  // 1/20!
  const double c[] = {-1.0 / 6402373705728000.0, 1.0 / 20922789888000.0, -1.0 / 87178291200.0,
                      1.0 / 479001600.0,         -1.0 / 3628800.0,       1.0 / 40320.0,
                      -1.0 / 720.0,              1.0 / 24.0,             -0.5};
  for (double k : c) p = __builtin_fma(p, z, k);
  return __builtin_fma(z, p, 1.0);
}

JT_DEVICE double sin(double x) {
  if (isnan_(x) || isinf_(x)) return kNaN;
  if (x == 0.0) return x;  // keeps -0
  double r;
  switch (rem_pio2_(x, r)) {
    case 0: return sin_poly_(r);
    case 1: return cos_poly_(r);
    case 2: return -sin_poly_(r);
    default: return -cos_poly_(r);
  }
}
JT_DEVICE double cos(double x) {
  if (isnan_(x) || isinf_(x)) return kNaN;
  double r;
  switch (rem_pio2_(x, r)) {
    case 0: return cos_poly_(r);
    case 1: return -sin_poly_(r);
    case 2: return -cos_poly_(r);
    default: return sin_poly_(r);
  }
}
JT_DEVICE double tan(double x) {
  if (isnan_(x) || isinf_(x)) return kNaN;
  if (x == 0.0) return x;
  double r;
  const int n = rem_pio2_(x, r);
  const double s = sin_poly_(r), c = cos_poly_(r);
  return (n & 1) ? -c / s : s / c;
}

// atan on [0, 1]: two argument halvings (atan t = 2 atan(t / (1 + sqrt(1 + t^2)))) bring t
// below 0.2, where the Taylor series to t^27 is below 2^-60.
JT_DEVICE double atan01_(double t) {
  t = t / (1.0 + __builtin_sqrt(__builtin_fma(t, t, 1.0)));
  t = t / (1.0 + __builtin_sqrt(__builtin_fma(t, t, 1.0)));
  const double z = t * t;
  double p = -1.0 / 27.0;
  for (int k = 12; k >= 1; --k) p = __builtin_fma(p, z, ((k & 1) ? -1.0 : 1.0) / (2 * k + 1));
  return 4.0 * __builtin_fma(t * z, p, t);
}
JT_DEVICE double atan(double x) {
  if (isnan_(x)) return x;
  const double a = __builtin_fabs(x);
  const double r = a <= 1.0 ? atan01_(a) : (kPio2 - atan01_(1.0 / a)) + kPio2Lo;
  return __builtin_copysign(r, x);
}
JT_DEVICE double atan2(double y, double x) {
  if (isnan_(x) || isnan_(y)) return kNaN;
  const double ay = __builtin_fabs(y), ax = __builtin_fabs(x);
  double r;
  if (y == 0.0) {
    r = __builtin_signbit(x) ? kPi : 0.0;
  } else if (x == 0.0) {
    r = kPio2;
  } else if (isinf_(x)) {
    r = isinf_(y) ? (x > 0 ? kPio2 / 2 : 3 * kPio2 / 2) : (x > 0 ? 0.0 : kPi);
  } else if (isinf_(y)) {
    r = kPio2;
  } else {
    // atan(ay / ax), kept exact in its own range: the smaller over the larger.
    const double a = ay <= ax ? atan01_(ay / ax) : (kPio2 - atan01_(ax / ay)) + kPio2Lo;
    r = x > 0 ? a : (kPi - a) + kPiLo;
  }
  return __builtin_copysign(r, y);
}
JT_DEVICE double asin(double x) {
  if (isnan_(x) || __builtin_fabs(x) > 1.0) return kNaN;
  return atan2(x, __builtin_sqrt((1.0 - x) * (1.0 + x)));
}
JT_DEVICE double acos(double x) {
  if (isnan_(x) || __builtin_fabs(x) > 1.0) return kNaN;
  return atan2(__builtin_sqrt((1.0 - x) * (1.0 + x)), x);
}

JT_DEVICE double sinh(double x) {
  const double a = __builtin_fabs(x);
  if (isnan_(x) || a == 0.0) return x;
  double r;
  if (a > 700.0) {
    r = exp_hilo_(a - kLn2Hi, -kLn2Lo);  // e^a / 2 without overflowing early; a - kLn2Hi is exact
  } else {
    const double t = expm1(a);
    r = 0.5 * (t + t / (t + 1.0));
  }
  return __builtin_copysign(r, x);
}
JT_DEVICE double cosh(double x) {
  const double a = __builtin_fabs(x);
  if (isnan_(x)) return x;
  if (a > 700.0) return exp_hilo_(a - kLn2Hi, -kLn2Lo);
  const double e = exp(a);
  return 0.5 * (e + 1.0 / e);
}
JT_DEVICE double tanh(double x) {
  const double a = __builtin_fabs(x);
  if (isnan_(x) || a == 0.0) return x;
  if (a > 22.0) return __builtin_copysign(1.0, x);
  const double t = expm1(2.0 * a);
  return __builtin_copysign(t / (t + 2.0), x);
}
JT_DEVICE double asinh(double x) {
  const double a = __builtin_fabs(x);
  if (isnan_(x) || isinf_(x) || a == 0.0) return x;
  double r;
  if (a > 1e150) {
    r = log(a) + kLn2Hi + kLn2Lo;
  } else {
    const double z = a * a;
    r = log1p(a + z / (1.0 + __builtin_sqrt(1.0 + z)));
  }
  return __builtin_copysign(r, x);
}
JT_DEVICE double acosh(double x) {
  if (isnan_(x) || x < 1.0) return kNaN;
  if (x > 1e150) return log(x) + kLn2Hi + kLn2Lo;
  const double t = x - 1.0;
  return log1p(t + __builtin_sqrt(2.0 * t + t * t));
}
JT_DEVICE double atanh(double x) {
  const double a = __builtin_fabs(x);
  if (isnan_(x) || a > 1.0) return kNaN;
  if (a == 0.0) return x;
  return __builtin_copysign(0.5 * log1p(2.0 * a / (1.0 - a)), x);
}

// erf by its series of positive terms, 2x/sqrt(pi) e^(-x^2) sum (2x^2)^n / (1 3 ... (2n+1)),
// below 1.5 (no cancellation; the roundings of its chained products grow with x, hence the
// bound); erfc by its continued fraction e^(-x^2)/sqrt(pi) / (x + 1/2 / (x + 1 / (x + 3/2 /
// ...))), evaluated from a fixed depth (240 levels reach full precision from x = 1), and
// erf = 1 - erfc above 1.5, erfc = 1 - erf below 0.5 (erfc_taylor_ between).
constexpr double kTwoOverSqrtPi = 1.12837916709551257390e+00;
// e^(-a^2) with a^2 in two parts (its rounding would cost a few ulp near a = 3).
JT_DEVICE double exp_minus_square_(double a) {
  const double sq = a * a;
  return exp_hilo_(-sq, -__builtin_fma(a, a, -sq));
}
// The sum in Horner form, 1 + z/3 (1 + z/5 (1 + ...)), innermost first: each level rounds
// once or twice, and no error is carried through a chain of products. 34 levels: past them
// the terms are below 2^-60 of the sum for a < 1.5.
JT_DEVICE double erf_series_(double a) {
  const double z = 2.0 * a * a;
  double sum = 1.0;
  for (int n = 34; n >= 1; --n) sum = __builtin_fma(sum, z / (2 * n + 1), 1.0);
  return kTwoOverSqrtPi * a * exp_minus_square_(a) * sum;
}
// erfc on [0.5, 1), where 1 - erf would lose digits: erfc(a) = e^(-a^2) R(a) with
// R = e^(x^2) erfc(x), an entire function with R' = 2 x R - 2/sqrt(pi), as its Taylor series
// at 3/4: (k + 1) r_(k+1) = 1.5 r_k + 2 r_(k-1) (minus 2/sqrt(pi) for k = 0), from
// r_0 = R(3/4) = 0.50693765029314480579... (computed in 60-digit decimal arithmetic).
JT_DEVICE double erfc_taylor_(double a) {
  const double h = a - 0.75;
  double prev = 0.0, r = 0.506937650293144805791, sum = r, power = 1.0;
  for (int k = 0; k < 22; ++k) {
    const double next = (1.5 * r + 2.0 * prev - (k == 0 ? kTwoOverSqrtPi : 0.0)) / (k + 1);
    prev = r;
    r = next;
    power *= h;
    sum = __builtin_fma(r, power, sum);
  }
  return exp_minus_square_(a) * sum;
}
JT_DEVICE double erfc_fraction_(double a) {
  double f = a;
  for (int k = 240; k >= 1; --k) f = a + (0.5 * k) / f;
  return exp_minus_square_(a) / f * (kTwoOverSqrtPi / 2.0);
}
JT_DEVICE double erf(double x) {
  if (isnan_(x)) return x;
  const double a = __builtin_fabs(x);
  if (a >= 6.0) return __builtin_copysign(1.0, x);
  const double r = a < 1.5 ? erf_series_(a) : 1.0 - erfc_fraction_(a);
  return __builtin_copysign(r, x);
}
JT_DEVICE double erfc(double x) {
  if (isnan_(x)) return x;
  const double a = __builtin_fabs(x);
  const double r = a >= 27.3 ? 0.0
                   : a >= 1.0 ? erfc_fraction_(a)
                   : a >= 0.5 ? erfc_taylor_(a)
                              : 1.0 - erf_series_(a);
  return x < 0.0 ? 2.0 - r : r;
}

// Exact remainder: the largest power-of-two multiple of |y| not above the remainder is taken
// off (exactly, by Sterbenz's lemma) until the remainder is below |y|.
JT_DEVICE double fmod(double x, double y) {
  if (isnan_(x) || isnan_(y) || isinf_(x) || y == 0.0) return kNaN;
  double r = __builtin_fabs(x);
  const double ay = __builtin_fabs(y);
  if (isinf_(y) || r < ay) return x;
  int ey;
  __builtin_frexp(ay, &ey);
  while (r >= ay) {
    int er;
    __builtin_frexp(r, &er);
    double t = __builtin_ldexp(ay, er - ey);
    if (t > r) t *= 0.5;
    r -= t;
  }
  return __builtin_copysign(r, x);
}

// float32 -> bfloat16 bits, rounded to nearest even in integer arithmetic; a NaN stays a
// quiet NaN of the same sign, overflow rounds to infinity.
JT_DEVICE unsigned short bf16_rne_bits(float f) {
  const unsigned u = __builtin_bit_cast(unsigned, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40u);
  return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// float32 rounded to 10 mantissa bits (tf32), to nearest with ties away from zero, as CUDA's
// cvt.rna.tf32.f32: the float32 bits with the low 13 cleared; infinities and NaNs unchanged.
JT_DEVICE unsigned tf32_rna_bits(float f) {
  const unsigned u = __builtin_bit_cast(unsigned, f);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;
  return (u + 0x1000u) & 0xffffe000u;
}

}  // namespace math_

// The C names, in double and float. Rounding, absolute value and square root are single
// instructions; the rest are math_'s double functions, rounded once for float.
JT_DEVICE double fabs(double x) { return __builtin_fabs(x); }
JT_DEVICE double floor(double x) { return __builtin_floor(x); }
JT_DEVICE double ceil(double x) { return __builtin_ceil(x); }
JT_DEVICE double trunc(double x) { return __builtin_trunc(x); }
JT_DEVICE double rint(double x) { return __builtin_rint(x); }
JT_DEVICE double round(double x) { return __builtin_round(x); }
JT_DEVICE double sqrt(double x) { return __builtin_sqrt(x); }
JT_DEVICE float fabsf(float x) { return __builtin_fabsf(x); }
JT_DEVICE float floorf(float x) { return __builtin_floorf(x); }
JT_DEVICE float ceilf(float x) { return __builtin_ceilf(x); }
JT_DEVICE float truncf(float x) { return __builtin_truncf(x); }
JT_DEVICE float rintf(float x) { return __builtin_rintf(x); }
JT_DEVICE float roundf(float x) { return __builtin_roundf(x); }
JT_DEVICE float sqrtf(float x) { return __builtin_sqrtf(x); }

#define JT_MATH1_(name)                                                            \
  JT_DEVICE double name(double x) { return math_::name(x); }                      \
  JT_DEVICE float name##f(float x) { return static_cast<float>(math_::name(x)); }
#define JT_MATH2_(name)                                                            \
  JT_DEVICE double name(double x, double y) { return math_::name(x, y); }         \
  JT_DEVICE float name##f(float x, float y) {                                     \
    return static_cast<float>(math_::name(x, y));                                 \
  }
JT_MATH1_(exp)
JT_MATH1_(exp2)
JT_MATH1_(log)
JT_MATH1_(log1p)
JT_MATH1_(expm1)
JT_MATH1_(sin)
JT_MATH1_(cos)
JT_MATH1_(tan)
JT_MATH1_(asin)
JT_MATH1_(acos)
JT_MATH1_(atan)
JT_MATH1_(sinh)
JT_MATH1_(cosh)
JT_MATH1_(tanh)
JT_MATH1_(asinh)
JT_MATH1_(acosh)
JT_MATH1_(atanh)
JT_MATH1_(erf)
JT_MATH1_(erfc)
JT_MATH2_(pow)
JT_MATH2_(atan2)
JT_MATH2_(fmod)
#undef JT_MATH1_
#undef JT_MATH2_

}  // namespace jaxtile
