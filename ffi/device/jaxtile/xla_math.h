// XLA's per-element semantics for generated device code (compiler/semantics.py states them).
// Included by device.h after the implementation of the header's operations; plain C++ that
// nvcc, NVRTC and g++ (the emulator) compile alike. The standard float functions (expf,
// logf, tanhf, erff, ...) are used directly by generated code: CUDA and the C library both
// have them.
#pragma once

namespace jaxtile {

// Float constants from their bits: infinities and NaNs without <math.h> (NVRTC has none).
// A union rather than __builtin_memcpy, which NVRTC lacks outside templates; nvcc and g++
// both define reading the other member.
JT_DEVICE float f32_bits(unsigned u) {
  union {
    unsigned u;
    float f;
  } v{u};
  return v.f;
}
JT_DEVICE double f64_bits(unsigned long long u) {
  union {
    unsigned long long u;
    double f;
  } v{u};
  return v.f;
}

// float16 / bfloat16 math is done in float32 and rounded to the storage type after every op.
JT_DEVICE float round_f16(float x) { return to_float(to_half(x)); }
JT_DEVICE float round_bf16(float x) { return to_float(to_bf16(x)); }
// A float64 converted to float16 / bfloat16, rounded once (not through float32).
JT_DEVICE float round_f16(double x) { return to_float(to_half(x)); }
JT_DEVICE float round_bf16(double x) { return to_float(to_bf16(x)); }
// A conversion to an 8-bit float, as its float32 value (from float or double: rounded once).
template <class T>
JT_DEVICE float round_f8e4m3(T x) { return to_float(to_fp8e4m3(x)); }
template <class T>
JT_DEVICE float round_f8e5m2(T x) { return to_float(to_fp8e5m2(x)); }

// min / max propagate NaN (either operand NaN gives NaN).
template <class T>
JT_DEVICE T xla_max(T a, T b) {
  return a != a ? a : (b != b ? b : (a > b ? a : b));
}
template <class T>
JT_DEVICE T xla_min(T a, T b) {
  return a != a ? a : (b != b ? b : (a < b ? a : b));
}

// sign keeps zeros (and their sign) and NaN.
template <class T>
JT_DEVICE T xla_sign(T x) {
  return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x);
}

template <class T>
JT_DEVICE bool xla_is_finite(T x) {
  return x == x && x - x == T(0);
}

JT_DEVICE float xla_logistic(float x) { return 1.0f / (1.0f + expf(-x)); }
JT_DEVICE double xla_logistic(double x) { return 1.0 / (1.0 + exp(-x)); }

// Integer division never traps: x / 0 is -1 (all ones unsigned), x % 0 is x, and
// INT_MIN / -1 is INT_MIN with remainder 0.
template <class T>
JT_DEVICE T xla_div(T a, T b) {
  if (b == T(0)) return T(-1);
  if (T(-1) < T(0) && b == T(-1)) return T(T(0) - a);  // wraps for INT_MIN as XLA does
  return a / b;
}
template <class T>
JT_DEVICE T xla_rem(T a, T b) {
  if (b == T(0)) return a;
  if (T(-1) < T(0) && b == T(-1)) return T(0);
  return a % b;
}

// Integer power by squaring; a negative exponent gives 0 unless the base is 1 or -1.
template <class T>
JT_DEVICE T xla_ipow(T base, T e) {
  if (e < T(0)) return base == T(1) ? T(1) : (base == T(-1) ? ((e & T(1)) ? T(-1) : T(1)) : T(0));
  T r = T(1);
  while (e) {
    if (e & T(1)) r = T(r * base);
    base = T(base * base);
    e = T(e >> 1);
  }
  return r;
}

// Float -> integer saturates at the integer type's bounds; NaN becomes 0.
template <class I, class F>
JT_DEVICE I xla_f2i(F x, F lo, F hi, I lo_i, I hi_i) {
  if (x != x) return I(0);
  if (x <= lo) return lo_i;
  if (x >= hi) return hi_i;
  return static_cast<I>(x);
}

// Dynamic sizes' arithmetic (compiler/sizes.py): floordiv and mod round towards negative
// infinity, as in Python and JAX.
JT_DEVICE int size_floordiv(int a, int b) {
  const int q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
JT_DEVICE int size_mod(int a, int b) { return a - size_floordiv(a, b) * b; }
JT_DEVICE int size_max(int a, int b) { return a > b ? a : b; }
JT_DEVICE int size_min(int a, int b) { return a < b ? a : b; }

}  // namespace jaxtile
