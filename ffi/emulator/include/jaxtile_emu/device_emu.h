// The emulator implementation of jaxtile's device header: plain C++ for g++, running each CUDA
// thread as a fiber (see runtime.h). Included only through jaxtile/device.h.
//
// With -DJAXTILE_WAVE64 (the hip-emulator) it provides device_hip.h's contract instead, for
// the HIP text generated for AMD GPUs: 64-lane waves (64-bit lane masks and ballots), no
// named barriers, ldmatrix, mma.sync or printf, and AMD's MFMA, buffer loads and s_waitcnt.
//
// Every operation takes a trailing `line` argument defaulted to __builtin_LINE(), so reports
// name the line of the device code that called it; memory accesses get theirs from the index
// of `p[i]` (see Site).
#pragma once

#include <math.h>
#include <string.h>

#include <cstdio>

#include <type_traits>

#include "runtime.h"

#define JT_KERNEL static
#define JT_DEVICE inline
#define JT_LAUNCH_BOUNDS(...)
#define JT_SHARED(T, name, count) \
  ::jaxtile::ptr<T> name = ::jaxtile::emu::shared_array_of<T>((count), #name, __LINE__)
#define JT_SHARED_AT(T, name, count, offset)                                         \
  ::jaxtile::ptr<T> name =                                                           \
      ::jaxtile::emu::shared_view_of<T>((count), (offset), #name, __LINE__)

namespace jaxtile {
namespace emu {

// An index that remembers the source line of the subscript it came from.
struct Site {
  int64_t v;
  uint32_t line;
  template <class I, class = std::enable_if_t<std::is_integral_v<I>>>
  Site(I i, uint32_t l = __builtin_LINE()) : v(static_cast<int64_t>(i)), line(l) {}
};

template <class T>
T* offset_(T* p, int64_t n) {
  // Integer arithmetic: an out-of-bounds pointer must be representable until it is reported.
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) +
                              static_cast<uintptr_t>(n * static_cast<int64_t>(sizeof(T))));
}

// An lvalue of device memory: reading or writing it is a checked access.
template <class T>
class Ref {
 public:
  using V = std::remove_const_t<T>;
  Ref(T* a, const Region* r, uint32_t line) : a_(a), r_(r), line_(line) {}
  operator V() const {
    V v{};
    if (aligned() && access(r_, a_, sizeof(T), kRead, line_)) {
      // Only writable global memory (outputs) can hold data other blocks wrote.
      if constexpr (!std::is_const_v<T>) {
        if (g_checks && r_->space == kGlobal) global_read(r_, a_, sizeof(T), line_);
      }
      memcpy(&v, a_, sizeof(T));
    }
    return v;
  }
  template <class U>
  const Ref& operator=(const U& u) const {
    static_assert(!std::is_const_v<T>, "jaxtile: store through a pointer to const");
    const V v = static_cast<V>(u);
    if (aligned() && access(r_, a_, sizeof(T), kWrite, line_)) {
      if (g_checks && r_->space == kGlobal) global_write(a_, sizeof(T));
      memcpy(const_cast<V*>(a_), &v, sizeof(T));
    }
    return *this;
  }
  const Ref& operator=(const Ref& o) const { return *this = static_cast<V>(o); }
  template <class U>
  const Ref& operator+=(const U& u) const {
    return *this = static_cast<V>(static_cast<V>(*this) + u);
  }
  template <class U>
  const Ref& operator-=(const U& u) const {
    return *this = static_cast<V>(static_cast<V>(*this) - u);
  }
  template <class U>
  const Ref& operator*=(const U& u) const {
    return *this = static_cast<V>(static_cast<V>(*this) * u);
  }
  template <class U>
  const Ref& operator/=(const U& u) const {
    return *this = static_cast<V>(static_cast<V>(*this) / u);
  }
  template <class U>
  const Ref& operator|=(const U& u) const {
    return *this = static_cast<V>(static_cast<V>(*this) | u);
  }
  template <class U>
  const Ref& operator&=(const U& u) const {
    return *this = static_cast<V>(static_cast<V>(*this) & u);
  }

 private:
  bool aligned() const {
    if (reinterpret_cast<uintptr_t>(a_) % alignof(T) == 0) return true;
    return access_misaligned(r_, a_, sizeof(T), kRead, line_);
  }

  T* a_;
  const Region* r_;
  uint32_t line_;
};

// A checked pointer: the address and the allocation it must stay inside.
template <class T>
class Ptr {
 public:
  Ptr() : p_(nullptr), r_(&kNullRegion) {}
  // A pointer made without an allocation (a null region) is checked as a null pointer: every
  // access through it is reported, none dereferenced.
  Ptr(T* p, const Region* r) : p_(p), r_(r != nullptr ? r : &kNullRegion) {}
  template <class U, class = std::enable_if_t<std::is_convertible_v<U*, T*>>>
  Ptr(const Ptr<U>& o) : p_(o.raw()), r_(o.region()) {}

  Ref<T> operator[](Site i) const { return Ref<T>(offset_(p_, i.v), r_, i.line); }
  Ref<T> operator*() const { return Ref<T>(p_, r_, 0); }
  Ptr operator+(int64_t n) const { return Ptr(offset_(p_, n), r_); }
  Ptr operator-(int64_t n) const { return Ptr(offset_(p_, -n), r_); }
  Ptr& operator+=(int64_t n) {
    p_ = offset_(p_, n);
    return *this;
  }
  Ptr& operator-=(int64_t n) {
    p_ = offset_(p_, -n);
    return *this;
  }
  int64_t operator-(const Ptr& o) const { return p_ - o.p_; }
  bool operator==(const Ptr& o) const { return p_ == o.p_; }
  bool operator!=(const Ptr& o) const { return p_ != o.p_; }
  bool operator<(const Ptr& o) const { return p_ < o.p_; }

  T* raw() const { return p_; }
  const Region* region() const { return r_; }

 private:
  T* p_;
  const Region* r_;
};

template <class T>
Ptr<T> shared_array_of(uint64_t count, const char* name, uint32_t line) {
  const Region* r = nullptr;
  void* p = shared_array(count * sizeof(T), name, &r, line);
  return Ptr<T>(static_cast<T*>(p), r);
}

template <class T>
Ptr<T> shared_view_of(uint64_t count, uint64_t offset, const char* name, uint32_t line) {
  const Region* r = nullptr;
  void* p = shared_view(offset, count * sizeof(T), name, &r, line);
  return Ptr<T>(static_cast<T*>(p), r);
}

template <class T>
uint32_t bits32_(T v) {
  static_assert(sizeof(T) == 4, "jaxtile shuffles move 4-byte values");
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
template <class T>
T from_bits32_(uint32_t u) {
  T v;
  memcpy(&v, &u, 4);
  return v;
}
template <class T>
T shuffle_(int kind, uint64_t mask, T v, int arg, uint32_t line) {
  const uint32_t in = bits32_(v);
  uint32_t out = in;
  collective(kind, mask, &in, &out, arg, line);
  return from_bits32_<T>(out);
}
template <int Count, bool Trans, class T>
void ldmatrix_(uint32_t* r, const Ptr<T>& p, uint32_t line) {
  static_assert(sizeof(T) == 2, "ldmatrix loads 16-bit elements");
  const LdmatrixIn in{reinterpret_cast<const char*>(p.raw()), p.region()};
  collective(kLdmatrix, 0xffffffffu, &in, r, Count | (Trans ? 16 : 0), line);
}
inline void mma_(int kind, float* d, const uint32_t* a, const uint32_t* b, const float* c,
                 uint32_t line) {
  const MmaIn in{a, b, c};
  collective(kind, 0xffffffffu, &in, d, 0, line);
}

// ---- 16-bit float conversions, rounding as the hardware's cvt.rn ----
inline uint16_t f32_to_f16_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fff;               // NaN: the canonical f16 NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00u;       // >= 65520 rounds to infinity
  if (ax >= 0x38800000u) {                            // normal f16 (>= 2^-14)
    const uint32_t e = ax - 0x38000000u;              // rebias the exponent 127 -> 15
    const uint32_t r = e + 0xfffu + ((e >> 13) & 1u); // round to nearest even on bit 13
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Subnormal f16 (kept, as cvt.rn.f16.f32 does): a multiple of 2^-24, rounded half to even
  // by nearbyintf in the default rounding mode; the scaling by 2^24 is exact.
  float a;
  memcpy(&a, &ax, 4);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(nearbyintf(a * 16777216.0f)));
}
inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    float f = static_cast<float>(man) * 5.9604644775390625e-08f;  // man * 2^-24, exact
    memcpy(&x, &f, 4);
    x |= sign;
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (man << 13);
  } else {
    x = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// float64 -> float16 / bfloat16, rounded once, in floating point (the GPUs narrow to float32
// rounding to odd instead): the value rounds to a multiple of its binade's spacing 2^q with
// nearbyint (ties to even, the default rounding mode; the scalings are exact), and the result,
// which float32 holds exactly, is then encoded by the float32 conversion without rounding.
struct F16Format {
  int mantissa_bits, min_exponent;  // min_exponent: of the smallest normal, 1 - bias
  double max_finite;
};
constexpr F16Format kF16{10, -14, 65504.0};
constexpr F16Format kBf16{7, -126, 0x1.fep127};

inline float round_f64(double x, const F16Format& f) {
  if (isnan(x) || isinf(x)) return static_cast<float>(x);
  int e = 0;
  frexp(fabs(x), &e);  // |x| = m 2^e with m in [0.5, 1)
  const int binade = e - 1 > f.min_exponent ? e - 1 : f.min_exponent;
  const int q = binade - f.mantissa_bits;
  const double v = ldexp(nearbyint(ldexp(fabs(x), -q)), q);
  return static_cast<float>(copysign(v > f.max_finite ? INFINITY : v, x));
}

// ---- 8-bit float conversions (float8_e4m3fn, float8_e5m2), written apart from the GPUs'
// integer ones (ffi/device/jaxtile/float8.h) so that each checks the other: here in
// floating point, from the value's binade. The spacing of the format's values around |x| is
// 2^q (q from frexp, never below the subnormals' spacing); the value rounds to a multiple
// of it with nearbyint (ties to even: the default rounding mode), and the scaling is exact.
// Computed in double, so that a float64 source is rounded once.
struct Fp8Format {
  int mantissa_bits, min_exponent;  // min_exponent: of the smallest normal, 1 - bias
  double max_finite;
  bool has_inf;                     // float8_e5m2; float8_e4m3fn overflows to NaN
};
constexpr Fp8Format kE4m3{3, -6, 448.0, false};
constexpr Fp8Format kE5m2{2, -14, 57344.0, true};

inline uint8_t fp8_bits(double x, const Fp8Format& f) {
  const uint8_t sign = signbit(x) ? 0x80 : 0;
  const uint8_t nan = f.has_inf ? 0x7e : 0x7f, overflow = f.has_inf ? 0x7c : 0x7f;
  if (isnan(x)) return sign | nan;
  const double a = fabs(x);
  if (isinf(a)) return sign | overflow;
  int e = 0;
  frexp(a, &e);  // a = m 2^e with m in [0.5, 1): its binade's smallest value is 2^(e - 1)
  const int binade = e - 1 > f.min_exponent ? e - 1 : f.min_exponent;
  const int q = binade - f.mantissa_bits;
  const double units = nearbyint(ldexp(a, -q));
  const double v = ldexp(units, q);
  if (v > f.max_finite) return sign | overflow;
  if (v == 0) return sign;
  // Encode v: its exponent field (0 for subnormals) and mantissa.
  frexp(v, &e);
  if (e - 1 < f.min_exponent) return sign | static_cast<uint8_t>(units);  // subnormal
  const int field = e - 1 - f.min_exponent + 1;
  const int mantissa = static_cast<int>(ldexp(v, f.mantissa_bits - (e - 1))) -
                       (1 << f.mantissa_bits);
  return sign | static_cast<uint8_t>(field << f.mantissa_bits | mantissa);
}

inline float fp8_value(uint8_t b, const Fp8Format& f) {
  const int m_bits = f.mantissa_bits;
  const int field = (b & 0x7f) >> m_bits, mantissa = b & ((1 << m_bits) - 1);
  const int top = 0x7f >> m_bits;  // the all-ones exponent field
  double v;
  if (f.has_inf && field == top) {
    v = mantissa == 0 ? INFINITY : NAN;
  } else if (!f.has_inf && (b & 0x7f) == 0x7f) {
    v = NAN;
  } else if (field == 0) {
    v = ldexp(mantissa, f.min_exponent - m_bits);
  } else {
    v = ldexp((1 << m_bits) + mantissa, field - 1 + f.min_exponent - m_bits);
  }
  return static_cast<float>(b & 0x80 ? -v : v);
}

}  // namespace emu

template <class T>
using ptr = emu::Ptr<T>;

template <class U, class T>
ptr<U> ptr_cast(const ptr<T>& p) {
  return ptr<U>(reinterpret_cast<U*>(p.raw()), p.region());
}

template <class T>
ptr<T> dynamic_shared() {
  const emu::Region* r = nullptr;
  void* p = emu::dynamic_shared(&r);
  return ptr<T>(static_cast<T*>(p), r);
}

inline idx3 thread_idx() { return emu::cur_thread_idx(); }
inline idx3 block_idx() { return emu::cur_block_idx(); }
inline idx3 block_dim() { return emu::cur_block_dim(); }
inline idx3 grid_dim() { return emu::cur_grid_dim(); }
inline unsigned lane_id() { return emu::cur_lane(); }
inline unsigned warp_id() { return emu::cur_warp(); }

// ---- barriers ----
inline void sync_threads(uint32_t line = __builtin_LINE()) { emu::barrier(0, 0, true, line); }
// A lane mask: 32 bits, or 64 for AMD's waves.
using lane_mask = std::remove_const_t<decltype(kFullMask)>;

inline void sync_warp(lane_mask mask = kFullMask, uint32_t line = __builtin_LINE()) {
  emu::collective(emu::kSyncWarp, mask, nullptr, nullptr, 0, line);
}

// ---- shuffles and votes ----
template <class T>
T shfl_xor(lane_mask mask, T v, int lane_mask_, uint32_t line = __builtin_LINE()) {
  return emu::shuffle_(emu::kShflXor, mask, v, lane_mask_, line);
}
template <class T>
T shfl_down(lane_mask mask, T v, int delta, uint32_t line = __builtin_LINE()) {
  return emu::shuffle_(emu::kShflDown, mask, v, delta, line);
}
template <class T>
T shfl_up(lane_mask mask, T v, int delta, uint32_t line = __builtin_LINE()) {
  return emu::shuffle_(emu::kShflUp, mask, v, delta, line);
}
template <class T>
T shfl_idx(lane_mask mask, T v, int src_lane, uint32_t line = __builtin_LINE()) {
  return emu::shuffle_(emu::kShflIdx, mask, v, src_lane, line);
}
inline bool vote_all(lane_mask mask, bool pred, uint32_t line = __builtin_LINE()) {
  return emu::shuffle_(emu::kVoteAll, mask, static_cast<uint32_t>(pred), 0, line) != 0;
}
inline bool vote_any(lane_mask mask, bool pred, uint32_t line = __builtin_LINE()) {
  return emu::shuffle_(emu::kVoteAny, mask, static_cast<uint32_t>(pred), 0, line) != 0;
}
inline lane_mask ballot(lane_mask mask, bool pred, uint32_t line = __builtin_LINE()) {
  const uint32_t in = pred;
  uint64_t out = 0;
  emu::collective(emu::kBallot, mask, &in, &out, 0, line);
  return static_cast<lane_mask>(out);
}

#if !defined(JAXTILE_WAVE64)
// ---- NVIDIA only: named barriers, ldmatrix, mma.sync (AMD has none of them) ----
inline void barrier_sync(unsigned id, unsigned nthreads, uint32_t line = __builtin_LINE()) {
  emu::barrier(id, nthreads, false, line);
}
inline void barrier_arrive(unsigned id, unsigned nthreads, uint32_t line = __builtin_LINE()) {
  emu::barrier_arrive(id, nthreads, line);
}

// ---- ldmatrix ----
template <class T>
void ldmatrix_x1(unsigned (&r)[1], ptr<T> p, uint32_t line = __builtin_LINE()) {
  emu::ldmatrix_<1, false>(r, p, line);
}
template <class T>
void ldmatrix_x2(unsigned (&r)[2], ptr<T> p, uint32_t line = __builtin_LINE()) {
  emu::ldmatrix_<2, false>(r, p, line);
}
template <class T>
void ldmatrix_x4(unsigned (&r)[4], ptr<T> p, uint32_t line = __builtin_LINE()) {
  emu::ldmatrix_<4, false>(r, p, line);
}
template <class T>
void ldmatrix_x1_trans(unsigned (&r)[1], ptr<T> p, uint32_t line = __builtin_LINE()) {
  emu::ldmatrix_<1, true>(r, p, line);
}
template <class T>
void ldmatrix_x2_trans(unsigned (&r)[2], ptr<T> p, uint32_t line = __builtin_LINE()) {
  emu::ldmatrix_<2, true>(r, p, line);
}
template <class T>
void ldmatrix_x4_trans(unsigned (&r)[4], ptr<T> p, uint32_t line = __builtin_LINE()) {
  emu::ldmatrix_<4, true>(r, p, line);
}

// ---- mma.sync ----
inline void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                             const float (&c)[4], uint32_t line = __builtin_LINE()) {
  emu::mma_(emu::kMmaF16, d, a, b, c, line);
}
inline void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                              const float (&c)[4], uint32_t line = __builtin_LINE()) {
  emu::mma_(emu::kMmaBf16, d, a, b, c, line);
}
inline void mma_m16n8k8_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                             const float (&c)[4], uint32_t line = __builtin_LINE()) {
  emu::mma_(emu::kMmaTf32, d, a, b, c, line);
}
#endif  // !JAXTILE_WAVE64

// ---- cp.async (in wave64 mode too: device_hip.h's copy happens at once, and code correct
// under the later landing modelled here is correct under that) ----
template <int Bytes, class T, class S>
void cp_async(ptr<T> dst, ptr<S> src, int src_bytes, uint32_t line = __builtin_LINE()) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
  emu::cp_async(dst.region(), const_cast<std::remove_const_t<T>*>(dst.raw()), src.region(),
                src.raw(), Bytes, src_bytes, line);
}
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int N>
void cp_async_wait(uint32_t line = __builtin_LINE()) {
  emu::cp_async_wait(N, line);
}

// ---- Hopper (sm_90a): mbarriers, TMA, wgmma, proxy fences, setmaxnreg ----
#define JT_HAS_WGMMA 1  // tile_gemm.h's wgmma gemm (the emulator runs every architecture)
template <class T>
unsigned smem_u32(ptr<T> p, uint32_t line = __builtin_LINE()) {
  return emu::smem_address(p.region(), p.raw(), line);
}
inline void mbarrier_init(ptr<uint64_t> bar, unsigned count, uint32_t line = __builtin_LINE()) {
  emu::mbarrier_init(bar.region(), bar.raw(), count, line);
}
inline void mbarrier_arrive(ptr<uint64_t> bar, uint32_t line = __builtin_LINE()) {
  emu::mbarrier_arrive(bar.region(), bar.raw(), false, 0, line);
}
inline void mbarrier_arrive_expect_tx(ptr<uint64_t> bar, unsigned bytes,
                                      uint32_t line = __builtin_LINE()) {
  emu::mbarrier_arrive(bar.region(), bar.raw(), true, bytes, line);
}
// The GPU's try_wait may give up after a time limit; the emulator's suspends the thread
// until the phase completes (a phase that never does is a deadlock, reported).
inline bool mbarrier_try_wait_parity(ptr<uint64_t> bar, unsigned parity,
                                     uint32_t line = __builtin_LINE()) {
  return emu::mbarrier_try_wait(bar.region(), bar.raw(), parity & 1u, line);
}
inline void mbarrier_wait_parity(ptr<uint64_t> bar, unsigned parity,
                                 uint32_t line = __builtin_LINE()) {
  while (!emu::mbarrier_try_wait(bar.region(), bar.raw(), parity & 1u, line)) {
  }
}
inline void fence_proxy_async(uint32_t = __builtin_LINE()) { emu::fence_proxy_async(); }
inline void fence_mbarrier_init(uint32_t = __builtin_LINE()) { emu::fence_mbarrier_init(); }

// A tensor map parameter: a checked pointer to the map the launch shim built for the launch.
#define JT_TENSOR_MAP(name) ::jaxtile::ptr<const ::jaxtile::tensor_map> name
inline ptr<const tensor_map> tensor_map_ref(ptr<const tensor_map> map) { return map; }

template <class T>
void tma_load_2d(ptr<T> dst, ptr<const tensor_map> map, ptr<uint64_t> bar, int c0, int c1,
                 uint32_t line = __builtin_LINE()) {
  const int32_t c[2] = {c0, c1};
  emu::tma_load(dst.region(), const_cast<std::remove_const_t<T>*>(dst.raw()), map.region(),
                map.raw(), bar.region(), bar.raw(), c, 2, line);
}
template <class T>
void tma_load_3d(ptr<T> dst, ptr<const tensor_map> map, ptr<uint64_t> bar, int c0, int c1,
                 int c2, uint32_t line = __builtin_LINE()) {
  const int32_t c[3] = {c0, c1, c2};
  emu::tma_load(dst.region(), const_cast<std::remove_const_t<T>*>(dst.raw()), map.region(),
                map.raw(), bar.region(), bar.raw(), c, 3, line);
}
template <class T>
void tma_load_4d(ptr<T> dst, ptr<const tensor_map> map, ptr<uint64_t> bar, int c0, int c1,
                 int c2, int c3, uint32_t line = __builtin_LINE()) {
  const int32_t c[4] = {c0, c1, c2, c3};
  emu::tma_load(dst.region(), const_cast<std::remove_const_t<T>*>(dst.raw()), map.region(),
                map.raw(), bar.region(), bar.raw(), c, 4, line);
}
template <class T>
void tma_load_5d(ptr<T> dst, ptr<const tensor_map> map, ptr<uint64_t> bar, int c0, int c1,
                 int c2, int c3, int c4, uint32_t line = __builtin_LINE()) {
  const int32_t c[5] = {c0, c1, c2, c3, c4};
  emu::tma_load(dst.region(), const_cast<std::remove_const_t<T>*>(dst.raw()), map.region(),
                map.raw(), bar.region(), bar.raw(), c, 5, line);
}
template <class T>
void tma_store_2d(ptr<const tensor_map> map, ptr<T> src, int c0, int c1,
                  uint32_t line = __builtin_LINE()) {
  const int32_t c[2] = {c0, c1};
  emu::tma_store(map.region(), map.raw(), src.region(), src.raw(), c, 2, line);
}
template <class T>
void tma_store_3d(ptr<const tensor_map> map, ptr<T> src, int c0, int c1, int c2,
                  uint32_t line = __builtin_LINE()) {
  const int32_t c[3] = {c0, c1, c2};
  emu::tma_store(map.region(), map.raw(), src.region(), src.raw(), c, 3, line);
}
inline void bulk_commit_group(uint32_t = __builtin_LINE()) { emu::bulk_commit(); }
template <int N>
void bulk_wait_group(uint32_t line = __builtin_LINE()) {
  emu::bulk_wait(N, line);
}
// The .read form: the model's stores land at the wait all the same (one of the outcomes the
// ISA allows: their global writes may complete any time before the kernel ends).
template <int N>
void bulk_wait_group_read(uint32_t line = __builtin_LINE()) {
  emu::bulk_wait(N, line);
}

// A warpgroup's m64nN f32 accumulator: N/2 registers per thread. Every access is checked:
// while a wgmma writing it is not retired by wgmma_wait_group it is reported, and one not
// followed by wgmma_fence before the next wgmma is reported there.
template <int N>
struct wgmma_acc {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma: N is a multiple of 8 in [8, 256]");
  float r[N / 2];
  uint32_t in_flight = 0;  // the line of a wgmma whose result is not yet retired (0: none)
  float& operator[](emu::Site i) {
    if (i.v < 0 || i.v >= N / 2) emu::wgmma_acc_out_of_range(i.v, N, i.line);
    emu::wgmma_acc_access(in_flight, i.line);
    return r[i.v];
  }
};
template <int N>
void wgmma_(wgmma_acc<N>& d, int type, uint64_t desc_a, const unsigned* a, uint64_t desc_b,
            int scale_d, bool ta, bool tb, uint32_t line) {
  const emu::WgmmaIn in{d.r, &d.in_flight, N, type, desc_a, desc_b, a, scale_d, ta, tb};
  emu::wgmma(&in, line);
}
template <int N, bool TA = false, bool TB = false>
void wgmma_f16(wgmma_acc<N>& d, uint64_t desc_a, uint64_t desc_b, int scale_d,
               uint32_t line = __builtin_LINE()) {
  wgmma_(d, emu::kWgmmaF16, desc_a, nullptr, desc_b, scale_d, TA, TB, line);
}
template <int N, bool TA = false, bool TB = false>
void wgmma_bf16(wgmma_acc<N>& d, uint64_t desc_a, uint64_t desc_b, int scale_d,
                uint32_t line = __builtin_LINE()) {
  wgmma_(d, emu::kWgmmaBf16, desc_a, nullptr, desc_b, scale_d, TA, TB, line);
}
template <int N>
void wgmma_tf32(wgmma_acc<N>& d, uint64_t desc_a, uint64_t desc_b, int scale_d,
                uint32_t line = __builtin_LINE()) {
  wgmma_(d, emu::kWgmmaTf32, desc_a, nullptr, desc_b, scale_d, false, false, line);
}
template <int N>
void wgmma_e4m3(wgmma_acc<N>& d, uint64_t desc_a, uint64_t desc_b, int scale_d,
                uint32_t line = __builtin_LINE()) {
  wgmma_(d, emu::kWgmmaE4m3, desc_a, nullptr, desc_b, scale_d, false, false, line);
}
template <int N>
void wgmma_e5m2(wgmma_acc<N>& d, uint64_t desc_a, uint64_t desc_b, int scale_d,
                uint32_t line = __builtin_LINE()) {
  wgmma_(d, emu::kWgmmaE5m2, desc_a, nullptr, desc_b, scale_d, false, false, line);
}
template <int N, bool TB = false>
void wgmma_f16_rs(wgmma_acc<N>& d, const unsigned (&a)[4], uint64_t desc_b, int scale_d,
                  uint32_t line = __builtin_LINE()) {
  wgmma_(d, emu::kWgmmaF16, 0, a, desc_b, scale_d, false, TB, line);
}
template <int N, bool TB = false>
void wgmma_bf16_rs(wgmma_acc<N>& d, const unsigned (&a)[4], uint64_t desc_b, int scale_d,
                   uint32_t line = __builtin_LINE()) {
  wgmma_(d, emu::kWgmmaBf16, 0, a, desc_b, scale_d, false, TB, line);
}
inline void wgmma_fence(uint32_t = __builtin_LINE()) { emu::wgmma_fence(); }
inline void wgmma_commit_group(uint32_t = __builtin_LINE()) { emu::wgmma_commit(); }
template <int N>
void wgmma_wait_group(uint32_t line = __builtin_LINE()) {
  emu::wgmma_wait(N, line);
}
template <int N>
void setmaxnreg_inc(uint32_t line = __builtin_LINE()) {
  emu::setmaxnreg(true, N, line);
}
template <int N>
void setmaxnreg_dec(uint32_t line = __builtin_LINE()) {
  emu::setmaxnreg(false, N, line);
}

// ---- a read another block may be racing with: a relaxed atomic load (ld.volatile) ----
template <class T>
T volatile_load(ptr<T> p, uint32_t line = __builtin_LINE()) {
  using V = std::remove_const_t<T>;
  V v{};
  if (emu::access(p.region(), p.raw(), sizeof(T), emu::kRead, line)) {
    __atomic_load(const_cast<V*>(p.raw()), &v, __ATOMIC_RELAXED);
    emu::flag_read(p.region(), false, line);
  }
  return v;
}

// ---- ordering between blocks: acquire loads, release stores, fences (gpu scope) ----
template <class T>
T load_acquire(ptr<T> p, uint32_t line = __builtin_LINE()) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "load_acquire reads 4 or 8 bytes");
  using V = std::remove_const_t<T>;
  V v{};
  if (emu::access(p.region(), p.raw(), sizeof(T), emu::kRead, line)) {
    __atomic_load(const_cast<V*>(p.raw()), &v, __ATOMIC_ACQUIRE);
    emu::flag_read(p.region(), true, line);
  }
  return v;
}
template <class T>
void store_release(ptr<T> p, T value, uint32_t line = __builtin_LINE()) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "store_release writes 4 or 8 bytes");
  if (emu::access(p.region(), p.raw(), sizeof(T), emu::kWrite, line)) {
    if (emu::g_checks && p.region()->space == emu::kGlobal) {
      emu::global_write(p.raw(), sizeof(T));
    }
    __atomic_store(p.raw(), &value, __ATOMIC_RELEASE);
  }
}
inline void fence(uint32_t = __builtin_LINE()) { emu::fence(); }

// ---- atomics ----
inline float atomic_add(ptr<float> p, float v, uint32_t line = __builtin_LINE()) {
  return emu::from_bits32_<float>(
      emu::atomic_rmw(p.region(), p.raw(), emu::kAddF32, emu::bits32_(v), line));
}
inline int atomic_add(ptr<int> p, int v, uint32_t line = __builtin_LINE()) {
  return static_cast<int>(
      emu::atomic_rmw(p.region(), p.raw(), emu::kAddI32, static_cast<uint32_t>(v), line));
}
inline unsigned atomic_add(ptr<unsigned> p, unsigned v, uint32_t line = __builtin_LINE()) {
  return emu::atomic_rmw(p.region(), p.raw(), emu::kAddU32, v, line);
}
inline int atomic_max(ptr<int> p, int v, uint32_t line = __builtin_LINE()) {
  return static_cast<int>(
      emu::atomic_rmw(p.region(), p.raw(), emu::kMaxI32, static_cast<uint32_t>(v), line));
}
inline int atomic_min(ptr<int> p, int v, uint32_t line = __builtin_LINE()) {
  return static_cast<int>(
      emu::atomic_rmw(p.region(), p.raw(), emu::kMinI32, static_cast<uint32_t>(v), line));
}
inline int atomic_exch(ptr<int> p, int v, uint32_t line = __builtin_LINE()) {
  return static_cast<int>(
      emu::atomic_rmw(p.region(), p.raw(), emu::kExchI32, static_cast<uint32_t>(v), line));
}
inline unsigned atomic_cas(ptr<unsigned> p, unsigned compare, unsigned v,
                           uint32_t line = __builtin_LINE()) {
  return static_cast<unsigned>(emu::atomic_cas(p.region(), p.raw(), 4, compare, v, line));
}
inline unsigned long long atomic_cas(ptr<unsigned long long> p, unsigned long long compare,
                                     unsigned long long v, uint32_t line = __builtin_LINE()) {
  return emu::atomic_cas(p.region(), p.raw(), 8, compare, v, line);
}

// ---- fast math ----
// ---- printing (jt.print): each call is written whole under stdout's lock (CUDA threads of
// other blocks run on other CPU threads) and flushed, as the CPU backend's lines are.
template <class... A>
void device_printf(const char* format, A... args) {
#if defined(JAXTILE_WAVE64)
  static_assert(sizeof...(A) < 0, "jaxtile: jt.print is not supported on AMD GPUs: printf "
                                  "needs the device library, which is not linked");
#endif
  flockfile(stdout);
  std::printf(format, args...);
  std::fflush(stdout);
  funlockfile(stdout);
}

inline float fast_exp2(float x) { return exp2f(x); }

// ---- 16-bit floats and tf32 ----
inline float to_float(half h) { return emu::f16_bits_to_f32(h.bits); }
inline float to_float(bf16 h) {
  const uint32_t x = static_cast<uint32_t>(h.bits) << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
inline half to_half(float f) { return half{emu::f32_to_f16_bits(f)}; }
inline bf16 to_bf16(float f) { return bf16{emu::f32_to_bf16_bits(f)}; }
inline half to_half(double x) {
  return half{emu::f32_to_f16_bits(emu::round_f64(x, emu::kF16))};
}
inline bf16 to_bf16(double x) {
  return bf16{emu::f32_to_bf16_bits(emu::round_f64(x, emu::kBf16))};
}
inline float to_float(fp8e4m3 h) { return emu::fp8_value(h.bits, emu::kE4m3); }
inline float to_float(fp8e5m2 h) { return emu::fp8_value(h.bits, emu::kE5m2); }
inline fp8e4m3 to_fp8e4m3(double x) { return fp8e4m3{emu::fp8_bits(x, emu::kE4m3)}; }
inline fp8e5m2 to_fp8e5m2(double x) { return fp8e5m2{emu::fp8_bits(x, emu::kE5m2)}; }
// cvt.rna.tf32.f32: round to nearest on the 19 kept bits, ties away from zero.
inline unsigned to_tf32(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) >= 0x7f800000u) return x;
  return (x + 0x1000u) & 0xffffe000u;
}
template <class T>
unsigned pack2(T lo, T hi) {
  return static_cast<unsigned>(lo.bits) | (static_cast<unsigned>(hi.bits) << 16);
}

}  // namespace jaxtile

// AMD's MFMA, buffer loads and s_waitcnt in wave64 mode.
#include "device_emu_wave64.h"
