// The nvcc/NVRTC implementation of jaxtile's device header: inline PTX (sm_80 and later).
// Included only through device.h.
#pragma once

#define JT_KERNEL extern "C" __global__
#define JT_DEVICE __device__ __forceinline__
#define JT_LAUNCH_BOUNDS(n) __launch_bounds__(n)
#define JT_SHARED(T, name, count) __shared__ __align__(16) T name[count]

extern __shared__ __align__(16) unsigned char jaxtile_dynamic_smem[];
#define JT_SHARED_AT(T, name, count, offset) \
  T* name = reinterpret_cast<T*>(jaxtile_dynamic_smem + (offset))

namespace jaxtile {

template <class T>
using ptr = T*;

template <class U, class T>
JT_DEVICE U* ptr_cast(T* p) {
  return reinterpret_cast<U*>(p);
}

template <class T>
JT_DEVICE T* dynamic_shared() {
  return reinterpret_cast<T*>(jaxtile_dynamic_smem);
}

JT_DEVICE idx3 thread_idx() { return {threadIdx.x, threadIdx.y, threadIdx.z}; }
JT_DEVICE idx3 block_idx() { return {blockIdx.x, blockIdx.y, blockIdx.z}; }
JT_DEVICE idx3 block_dim() { return {blockDim.x, blockDim.y, blockDim.z}; }
JT_DEVICE idx3 grid_dim() { return {gridDim.x, gridDim.y, gridDim.z}; }
JT_DEVICE unsigned lane_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(r));
  return r;
}
JT_DEVICE unsigned warp_id() {
  return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) / 32;
}

// ---- barriers ----
JT_DEVICE void sync_threads() { asm volatile("bar.sync 0;" ::: "memory"); }
JT_DEVICE void barrier_sync(unsigned id, unsigned nthreads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}
JT_DEVICE void sync_warp(unsigned mask = kFullMask) {
  asm volatile("bar.warp.sync %0;" ::"r"(mask) : "memory");
}

// ---- warp shuffles and votes (4-byte values) ----
// A union rather than __builtin_memcpy, which NVRTC does not have.
template <class T>
JT_DEVICE unsigned as_b32_(T v) {
  static_assert(sizeof(T) == 4, "jaxtile shuffles move 4-byte values");
  union {
    T t;
    unsigned u;
  } x{v};
  return x.u;
}
template <class T>
JT_DEVICE T from_b32_(unsigned u) {
  union {
    unsigned u;
    T t;
  } x{u};
  return x.t;
}
template <class T>
JT_DEVICE T shfl_xor(unsigned mask, T v, int lane_mask) {
  unsigned r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, %3;"
               : "=r"(r)
               : "r"(as_b32_(v)), "r"(lane_mask), "r"(mask));
  return from_b32_<T>(r);
}
template <class T>
JT_DEVICE T shfl_down(unsigned mask, T v, int delta) {
  unsigned r;
  asm volatile("shfl.sync.down.b32 %0, %1, %2, 0x1f, %3;"
               : "=r"(r)
               : "r"(as_b32_(v)), "r"(delta), "r"(mask));
  return from_b32_<T>(r);
}
template <class T>
JT_DEVICE T shfl_up(unsigned mask, T v, int delta) {
  unsigned r;
  asm volatile("shfl.sync.up.b32 %0, %1, %2, 0x0, %3;"
               : "=r"(r)
               : "r"(as_b32_(v)), "r"(delta), "r"(mask));
  return from_b32_<T>(r);
}
template <class T>
JT_DEVICE T shfl_idx(unsigned mask, T v, int src_lane) {
  unsigned r;
  asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, %3;"
               : "=r"(r)
               : "r"(as_b32_(v)), "r"(src_lane), "r"(mask));
  return from_b32_<T>(r);
}
JT_DEVICE bool vote_all(unsigned mask, bool pred) {
  unsigned r;
  asm volatile(
      "{ .reg .pred p, q; setp.ne.u32 p, %1, 0; vote.sync.all.pred q, p, %2; selp.u32 %0, 1, 0, "
      "q; }"
      : "=r"(r)
      : "r"((unsigned)pred), "r"(mask));
  return r != 0;
}
JT_DEVICE bool vote_any(unsigned mask, bool pred) {
  unsigned r;
  asm volatile(
      "{ .reg .pred p, q; setp.ne.u32 p, %1, 0; vote.sync.any.pred q, p, %2; selp.u32 %0, 1, 0, "
      "q; }"
      : "=r"(r)
      : "r"((unsigned)pred), "r"(mask));
  return r != 0;
}
JT_DEVICE unsigned ballot(unsigned mask, bool pred) {
  unsigned r;
  asm volatile("{ .reg .pred p; setp.ne.u32 p, %1, 0; vote.sync.ballot.b32 %0, p, %2; }"
               : "=r"(r)
               : "r"((unsigned)pred), "r"(mask));
  return r;
}

// ---- ldmatrix: `p` is the row this lane supplies (16-byte aligned shared address) ----
template <class T>
JT_DEVICE unsigned smem_addr_(const T* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
template <class T>
JT_DEVICE void ldmatrix_x1(unsigned (&r)[1], const T* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
               : "=r"(r[0])
               : "r"(smem_addr_(p)));
}
template <class T>
JT_DEVICE void ldmatrix_x2(unsigned (&r)[2], const T* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr_(p)));
}
template <class T>
JT_DEVICE void ldmatrix_x4(unsigned (&r)[4], const T* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr_(p)));
}
template <class T>
JT_DEVICE void ldmatrix_x1_trans(unsigned (&r)[1], const T* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];"
               : "=r"(r[0])
               : "r"(smem_addr_(p)));
}
template <class T>
JT_DEVICE void ldmatrix_x2_trans(unsigned (&r)[2], const T* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr_(p)));
}
template <class T>
JT_DEVICE void ldmatrix_x4_trans(unsigned (&r)[4], const T* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr_(p)));
}

// ---- mma.sync ----
JT_DEVICE void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}
JT_DEVICE void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                 const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}
JT_DEVICE void mma_m16n8k8_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}

// ---- cp.async (global -> shared), zero-filling the bytes past src_bytes ----
template <int Bytes, class T, class S>
JT_DEVICE void cp_async(T* dst, const S* src, int src_bytes) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (Bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr_(dst)),
                 "l"(src), "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(smem_addr_(dst)),
                 "l"(src), "n"(Bytes), "r"(src_bytes)
                 : "memory");
  }
}
JT_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
JT_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- a read that is not cached in a register or L1 (ld.volatile) ----
template <int N>
struct bits_of_size_;
template <>
struct bits_of_size_<1> {
  using type = unsigned char;
};
template <>
struct bits_of_size_<2> {
  using type = unsigned short;
};
template <>
struct bits_of_size_<4> {
  using type = unsigned;
};
template <>
struct bits_of_size_<8> {
  using type = unsigned long long;
};
template <class T>
JT_DEVICE T volatile_load(const T* p) {
  using U = typename bits_of_size_<sizeof(T)>::type;
  union {
    U u;
    T t;
  } v{*reinterpret_cast<const volatile U*>(p)};
  return v.t;
}

// ---- ordering between blocks (gpu scope): flags one block publishes, another waits for ----
// A relaxed or volatile flag read orders nothing: data read after it may be older than the
// flag. ld.acquire orders this thread's later accesses after it; st.release orders this
// thread's earlier ones (and, being cumulative, those a barrier made it see) before it.
JT_DEVICE void fence() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
template <class T>
JT_DEVICE T load_acquire(const T* p) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "load_acquire reads 4 or 8 bytes");
  using U = typename bits_of_size_<sizeof(T)>::type;
  union {
    U u;
    T t;
  } v{0};
  if constexpr (sizeof(T) == 4) {
    asm volatile("ld.acquire.gpu.b32 %0, [%1];" : "=r"(v.u) : "l"(p) : "memory");
  } else {
    asm volatile("ld.acquire.gpu.b64 %0, [%1];" : "=l"(v.u) : "l"(p) : "memory");
  }
  return v.t;
}
template <class T>
JT_DEVICE void store_release(T* p, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "store_release writes 4 or 8 bytes");
  using U = typename bits_of_size_<sizeof(T)>::type;
  union {
    T t;
    U u;
  } v{value};
  if constexpr (sizeof(T) == 4) {
    asm volatile("st.release.gpu.b32 [%0], %1;" ::"l"(p), "r"(v.u) : "memory");
  } else {
    asm volatile("st.release.gpu.b64 [%0], %1;" ::"l"(p), "l"(v.u) : "memory");
  }
}

// ---- atomics (global or shared; return the old value) ----
JT_DEVICE float atomic_add(float* p, float v) { return atomicAdd(p, v); }
JT_DEVICE int atomic_add(int* p, int v) { return atomicAdd(p, v); }
JT_DEVICE unsigned atomic_add(unsigned* p, unsigned v) { return atomicAdd(p, v); }
JT_DEVICE int atomic_max(int* p, int v) { return atomicMax(p, v); }
JT_DEVICE int atomic_min(int* p, int v) { return atomicMin(p, v); }
JT_DEVICE int atomic_exch(int* p, int v) { return atomicExch(p, v); }
JT_DEVICE unsigned atomic_cas(unsigned* p, unsigned compare, unsigned v) {
  return atomicCAS(p, compare, v);
}
JT_DEVICE unsigned long long atomic_cas(unsigned long long* p, unsigned long long compare,
                                        unsigned long long v) {
  return atomicCAS(p, compare, v);
}

// ---- fast math ----
// ---- printing (jt.print): the GPU's printf, whose buffer the driver writes out when the
// kernel completes. NVRTC declares printf itself; nvcc through the CUDA runtime headers.
template <class... A>
JT_DEVICE void device_printf(const char* format, A... args) {
  printf(format, args...);
}

JT_DEVICE float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// ---- 16-bit floats and tf32 ----
JT_DEVICE float to_float(half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
JT_DEVICE float to_float(bf16 h) { return __uint_as_float(static_cast<unsigned>(h.bits) << 16); }
JT_DEVICE half to_half(float f) {
  half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
JT_DEVICE bf16 to_bf16(float f) {
  bf16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
JT_DEVICE unsigned to_tf32(float f) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
  return r;
}
template <class T>
JT_DEVICE unsigned pack2(T lo, T hi) {
  return static_cast<unsigned>(lo.bits) | (static_cast<unsigned>(hi.bits) << 16);
}

}  // namespace jaxtile
