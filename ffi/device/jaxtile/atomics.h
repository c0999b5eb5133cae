// Atomic updates built on compare-and-swap, with XLA's semantics. Included by device.h after
// the implementation of the header's operations; plain C++ over `atomic_cas`, so the loop the
// emulator runs (on a real CPU compare-and-swap) is the one the GPU runs (atom.cas).
//
//   atomic_max / atomic_min on float and double   NaN wins (the first NaN stored stays), and
//                                                 -0.0 orders below 0.0, as XLA's max/min
//                                                 give (so concurrent updates commute)
//   atomic_add on double, atomic_{add,max,min} on int64_t
// Every one returns the old value.
#pragma once

namespace jaxtile {

template <class T>
struct atomic_bits_;
template <>
struct atomic_bits_<float> {
  using type = unsigned;
};
template <>
struct atomic_bits_<double> {
  using type = unsigned long long;
};
template <>
struct atomic_bits_<int64_t> {
  using type = unsigned long long;
};

template <class To, class From>
JT_DEVICE To atomic_bitcast_(From x) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  union {
    From from;
    To to;
  } u{x};
  return u.to;
}

// Zeros compare equal; the sign bit breaks the tie (negative zero is the smaller).
template <class F>
JT_DEVICE bool atomic_signed_below_(F a, F b) {
  using U = typename atomic_bits_<F>::type;
  constexpr U sign = U(1) << (sizeof(U) * 8 - 1);
  return a < b || (a == b && (atomic_bitcast_<U>(a) & sign) && !(atomic_bitcast_<U>(b) & sign));
}

struct AtomicMax_ {
  template <class T>
  JT_DEVICE T operator()(T old, T v) const {
    if (old != old) return old;
    if (v != v) return v;
    return atomic_signed_below_(old, v) ? v : old;
  }
};
struct AtomicMin_ {
  template <class T>
  JT_DEVICE T operator()(T old, T v) const {
    if (old != old) return old;
    if (v != v) return v;
    return atomic_signed_below_(v, old) ? v : old;
  }
};
struct AtomicAdd_ {
  template <class T>
  JT_DEVICE T operator()(T old, T v) const {
    return old + v;
  }
};

// The compare-and-swap loop. The first guess is a plain read, which may be stale (the GPU's
// L1 is not coherent), so it always goes through a CAS; a value seen by a failed CAS is
// current, and when combining leaves it unchanged nothing needs to be written.
template <class T, class Combine>
JT_DEVICE T atomic_update_(ptr<T> p, T v, Combine combine) {
  using U = typename atomic_bits_<T>::type;
  ptr<U> q = ptr_cast<U>(p);
  U old = q[0];
  bool current = false;
  while (true) {
    const T o = atomic_bitcast_<T>(old);
    const U next = atomic_bitcast_<U>(combine(o, v));
    if (current && next == old) return o;
    const U seen = atomic_cas(q, old, next);
    if (seen == old) return o;
    old = seen;
    current = true;
  }
}

JT_DEVICE float atomic_max(ptr<float> p, float v) { return atomic_update_(p, v, AtomicMax_{}); }
JT_DEVICE float atomic_min(ptr<float> p, float v) { return atomic_update_(p, v, AtomicMin_{}); }
JT_DEVICE double atomic_max(ptr<double> p, double v) {
  return atomic_update_(p, v, AtomicMax_{});
}
JT_DEVICE double atomic_min(ptr<double> p, double v) {
  return atomic_update_(p, v, AtomicMin_{});
}
JT_DEVICE double atomic_add(ptr<double> p, double v) {
  return atomic_update_(p, v, AtomicAdd_{});
}
JT_DEVICE int64_t atomic_max(ptr<int64_t> p, int64_t v) {
  return atomic_update_(p, v, AtomicMax_{});
}
JT_DEVICE int64_t atomic_min(ptr<int64_t> p, int64_t v) {
  return atomic_update_(p, v, AtomicMin_{});
}
// Wraps on overflow, as XLA's integer add does (unsigned arithmetic, no undefined behaviour).
JT_DEVICE int64_t atomic_add(ptr<int64_t> p, int64_t v) {
  return atomic_update_(p, v, [](int64_t a, int64_t b) {
    return static_cast<int64_t>(static_cast<unsigned long long>(a) +
                                static_cast<unsigned long long>(b));
  });
}

}  // namespace jaxtile
