// The clang/HIP implementation of jaxtile's device header, for AMD CDNA GPUs (gfx90a, gfx942).
// Included only through device.h.
//
// It stands on its own: HIP text is compiled with `clang -x hip --cuda-device-only -nogpuinc
// -nogpulib`, so there are no HIP headers (no __global__, threadIdx, __shfl) and no device
// library (no ocml: expf, sinf...). Everything is clang's __builtin_amdgcn_* builtins, its
// __hip_atomic_* builtins and plain C++; the math functions are hip_math.h's.
//
// Where the concept differs from CUDA's (AMD's "AMD Instinct MI300 / MI200 Instruction Set
// Architecture" reference guides):
//   - a wave has 64 lanes: lane masks are 64-bit (kFullMask is all 64 lanes), ballot returns
//     64 bits, shuffles address lanes 0..63;
//   - there is one workgroup barrier (s_barrier): no named barriers, so no barrier_sync;
//   - there is no ldmatrix or mma.sync: operands go LDS -> VGPRs with ds_read and the matrix
//     cores are the MFMA instructions below;
//   - there is no asynchronous global -> LDS copy like cp.async: cp_async copies at once (a
//     load and an LDS store, zero-filling past src_bytes), so cp_async_commit and
//     cp_async_wait have nothing to wait for; pipelined loops stay correct, without overlap;
//   - there is no device_printf: AMD's printf (buffered or hostcall) allocates in the
//     runtime's printf buffer through the device library (__printf_alloc in ockl), which
//     -nogpulib leaves out; a kernel using jt.print is a compile error saying so.
//
// What AMD has and this header adds (namespace jaxtile):
//   mfma_f32_32x32x8_f16 / _bf16, mfma_f32_16x16x16_f16 / _bf16 (gfx90a, gfx942) and
//   mfma_f32_32x32x4_xf32, mfma_f32_16x16x8_xf32 (gfx942)    D = A B + C on the matrix cores;
//                                      lane layouts in compiler/hip/mfma.py
//   buffer_resource(p, bytes), buffer_load<T>(r, offset)     raw buffer loads: an offset at
//                                      or past `bytes` reads zero
//   wait_vmcnt<N>(), wait_lgkmcnt<N>()                       s_waitcnt: at most N vector
//                                      memory / LDS-scalar memory operations still in flight
//   lds_direct_load<4>(src, lds_base) (gfx942: JT_HAS_LDS_DIRECT_LOAD)  global -> LDS without
//                                      VGPRs: lane l's 4 bytes land at lds_base + 4 l
//   lds_direct_buffer_load<4>(r, offset, lds_base)          the same through a buffer
//                                      resource (gfx90a and gfx942): past `bytes`, zeros land
#pragma once

#define JT_KERNEL extern "C" __attribute__((global))
#define JT_DEVICE __attribute__((device)) __attribute__((always_inline)) inline
// HIP's launch bounds: the workgroup size the kernel is compiled for (registers are budgeted
// so that a workgroup of n lanes fits).
#define JT_LAUNCH_BOUNDS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#define JT_SHARED(T, name, count) \
  __attribute__((shared)) __attribute__((aligned(16))) T name[count]

// The dynamic LDS buffer (the launch's dynamic shared size): an extern LDS array of unknown
// size starts where the static LDS ends.
extern __attribute__((shared)) __attribute__((aligned(16))) unsigned char jaxtile_dynamic_smem[];
#define JT_SHARED_AT(T, name, count, offset) \
  T* name = reinterpret_cast<T*>(jaxtile_dynamic_smem + (offset))

// The C math functions generated code calls (expf, sinf, ...: no device library here) and the
// float rounding of the conversions below.
#include "hip_math.h"

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

// ---- ids: the workgroup size and grid come from the dispatch packet (grid_size counts
// work-items, so the grid in blocks is its quotient by the workgroup size) ----
JT_DEVICE idx3 thread_idx() {
  return {__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
          __builtin_amdgcn_workitem_id_z()};
}
JT_DEVICE idx3 block_idx() {
  return {__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
          __builtin_amdgcn_workgroup_id_z()};
}
JT_DEVICE idx3 block_dim() {
  return {__builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(),
          __builtin_amdgcn_workgroup_size_z()};
}
JT_DEVICE idx3 grid_dim() {
  const idx3 b = block_dim();
  return {__builtin_amdgcn_grid_size_x() / b.x, __builtin_amdgcn_grid_size_y() / b.y,
          __builtin_amdgcn_grid_size_z() / b.z};
}
JT_DEVICE unsigned lane_id() {
  return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
}
JT_DEVICE unsigned warp_id() {
  const idx3 t = thread_idx(), b = block_dim();
  return (t.x + b.x * (t.y + b.y * t.z)) / kWarpSize;
}

// ---- barriers: s_barrier between workgroup-scope release and acquire fences, so LDS and
// global writes before it are seen by every lane of the workgroup after it ----
JT_DEVICE void sync_threads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
// A wave runs its lanes in lock step; what the lanes wrote must still be waited for
// (s_waitcnt) before another lane reads it.
JT_DEVICE void sync_warp(unsigned long long = kFullMask) {
  __builtin_amdgcn_fence(__ATOMIC_ACQ_REL, "wavefront");
  __builtin_amdgcn_wave_barrier();
}

// ---- shuffles (4-byte values) over the 64 lanes, through ds_bpermute_b32 (any lane) or,
// for xor 1 and 2 with a constant lane mask, DPP quad permutes (no LDS hardware). A source
// lane outside the wave (down / up past the edge) gives the lane its own value, as CUDA's
// clamp does. The mask is not needed: the wave runs in lock step. ----
template <class T>
JT_DEVICE int as_b32_(T v) {
  static_assert(sizeof(T) == 4, "jaxtile shuffles move 4-byte values");
  return __builtin_bit_cast(int, v);
}
template <class T>
JT_DEVICE T from_b32_(int u) {
  return __builtin_bit_cast(T, u);
}
JT_DEVICE int bpermute_(unsigned src_lane, int v) {
  return __builtin_amdgcn_ds_bpermute(static_cast<int>(src_lane << 2), v);
}
template <class T>
JT_DEVICE T shfl_idx(unsigned long long, T v, int src_lane) {
  return from_b32_<T>(bpermute_(static_cast<unsigned>(src_lane) & 63u, as_b32_(v)));
}
template <class T>
JT_DEVICE T shfl_xor(unsigned long long, T v, int lane_mask) {
  // quad_perm selectors: [1,0,3,2] = 0xB1 and [2,3,0,1] = 0x4E.
  if (__builtin_constant_p(lane_mask) && lane_mask == 1)
    return from_b32_<T>(__builtin_amdgcn_mov_dpp(as_b32_(v), 0xB1, 0xF, 0xF, false));
  if (__builtin_constant_p(lane_mask) && lane_mask == 2)
    return from_b32_<T>(__builtin_amdgcn_mov_dpp(as_b32_(v), 0x4E, 0xF, 0xF, false));
  return from_b32_<T>(bpermute_((lane_id() ^ static_cast<unsigned>(lane_mask)) & 63u,
                                as_b32_(v)));
}
template <class T>
JT_DEVICE T shfl_down(unsigned long long, T v, int delta) {
  const unsigned src = lane_id() + static_cast<unsigned>(delta);
  return from_b32_<T>(bpermute_(src < 64u ? src : lane_id(), as_b32_(v)));
}
template <class T>
JT_DEVICE T shfl_up(unsigned long long, T v, int delta) {
  const int src = static_cast<int>(lane_id()) - delta;
  return from_b32_<T>(bpermute_(src >= 0 ? static_cast<unsigned>(src) : lane_id(), as_b32_(v)));
}

// ---- votes over the 64 lanes: `mask` names the lanes taking part (of those active) ----
JT_DEVICE unsigned long long ballot(unsigned long long mask, bool pred) {
  return __builtin_amdgcn_ballot_w64(pred) & mask;
}
JT_DEVICE bool vote_any(unsigned long long mask, bool pred) { return ballot(mask, pred) != 0; }
JT_DEVICE bool vote_all(unsigned long long mask, bool pred) {
  return ballot(mask, pred) == (__builtin_amdgcn_read_exec() & mask);
}

// ---- cp_async: the copy done at once (see the top of this file) ----
template <int Bytes>
struct copy_unit_;
template <>
struct copy_unit_<4> {
  using type = unsigned;
};
template <>
struct copy_unit_<8> {
  using type = u32x2;
};
template <>
struct copy_unit_<16> {
  using type = u32x4;
};
template <int Bytes, class T, class S>
JT_DEVICE void cp_async(T* dst, const S* src, int src_bytes) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp_async copies 4, 8 or 16 bytes");
  using V = typename copy_unit_<Bytes>::type;
  if (src_bytes >= Bytes) {
    *reinterpret_cast<V*>(dst) = *reinterpret_cast<const V*>(src);
    return;
  }
  // A partial copy: the first src_bytes bytes, zeros after them (none read past them).
  unsigned char bytes[Bytes];
  for (int i = 0; i < Bytes; ++i)
    bytes[i] = i < src_bytes ? reinterpret_cast<const unsigned char*>(src)[i] : 0;
  *reinterpret_cast<V*>(dst) = __builtin_bit_cast(V, bytes);
}
JT_DEVICE void cp_async_commit() {}
template <int N>
JT_DEVICE void cp_async_wait() {}

// ---- a read another block may change, not kept in a register (relaxed) ----
template <class T>
JT_DEVICE T volatile_load(const T* p) {
  return *reinterpret_cast<const volatile T*>(p);
}

// ---- ordering between blocks (agent scope = the whole GPU) ----
template <int N>
struct bits_of_size_;
template <>
struct bits_of_size_<4> {
  using type = unsigned;
};
template <>
struct bits_of_size_<8> {
  using type = unsigned long long;
};
JT_DEVICE void fence() { __builtin_amdgcn_fence(__ATOMIC_ACQ_REL, "agent"); }
template <class T>
JT_DEVICE T load_acquire(const T* p) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "load_acquire reads 4 or 8 bytes");
  using U = typename bits_of_size_<sizeof(T)>::type;
  const U u = __hip_atomic_load(reinterpret_cast<const U*>(p), __ATOMIC_ACQUIRE,
                                __HIP_MEMORY_SCOPE_AGENT);
  return __builtin_bit_cast(T, u);
}
template <class T>
JT_DEVICE void store_release(T* p, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "store_release writes 4 or 8 bytes");
  using U = typename bits_of_size_<sizeof(T)>::type;
  __hip_atomic_store(reinterpret_cast<U*>(p), __builtin_bit_cast(U, value), __ATOMIC_RELEASE,
                     __HIP_MEMORY_SCOPE_AGENT);
}

// ---- atomics (global or LDS; return the old value), relaxed, agent scope ----
#define JT_ATOMIC_(name, builtin, T)                                                  \
  JT_DEVICE T name(T* p, T v) {                                                      \
    return builtin(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);                \
  }
JT_ATOMIC_(atomic_add, __hip_atomic_fetch_add, float)
JT_ATOMIC_(atomic_add, __hip_atomic_fetch_add, int)
JT_ATOMIC_(atomic_add, __hip_atomic_fetch_add, unsigned)
JT_ATOMIC_(atomic_max, __hip_atomic_fetch_max, int)
JT_ATOMIC_(atomic_min, __hip_atomic_fetch_min, int)
JT_ATOMIC_(atomic_exch, __hip_atomic_exchange, int)
#undef JT_ATOMIC_
template <class U>
JT_DEVICE U atomic_cas_(U* p, U compare, U v) {
  __hip_atomic_compare_exchange_strong(p, &compare, v, __ATOMIC_RELAXED, __ATOMIC_RELAXED,
                                       __HIP_MEMORY_SCOPE_AGENT);
  return compare;  // the value seen: `compare` itself when the swap happened
}
JT_DEVICE unsigned atomic_cas(unsigned* p, unsigned compare, unsigned v) {
  return atomic_cas_(p, compare, v);
}
JT_DEVICE unsigned long long atomic_cas(unsigned long long* p, unsigned long long compare,
                                        unsigned long long v) {
  return atomic_cas_(p, compare, v);
}

// ---- printing (jt.print): not available (see the top of this file) ----
template <class... A>
JT_DEVICE void device_printf(const char*, A...) {
  static_assert(sizeof...(A) < 0, "jaxtile: jt.print is not supported on AMD GPUs: printf "
                                  "needs the device library, which is not linked");
}

// ---- 16-bit floats and xf32 ----
JT_DEVICE float to_float(half h) { return static_cast<float>(__builtin_bit_cast(_Float16, h.bits)); }
JT_DEVICE float to_float(bf16 h) {
  return __builtin_bit_cast(float, static_cast<unsigned>(h.bits) << 16);
}
JT_DEVICE half to_half(float f) {  // v_cvt_f16_f32: round to nearest even
  return {__builtin_bit_cast(uint16_t, static_cast<_Float16>(f))};
}
// gfx90a/gfx942 have no float -> bf16 instruction: integer rounding (hip_math.h).
JT_DEVICE bf16 to_bf16(float f) { return {math_::bf16_rne_bits(f)}; }
// CUDA's cvt.rna.tf32.f32 (hip_math.h). The xf32 MFMA instructions take float32 registers
// as they are.
JT_DEVICE unsigned to_tf32(float f) { return math_::tf32_rna_bits(f); }
template <class T>
JT_DEVICE unsigned pack2(T lo, T hi) {
  return static_cast<unsigned>(lo.bits) | (static_cast<unsigned>(hi.bits) << 16);
}

// v_exp_f32: 2^x to about 1 ulp, flushing denormal results.
JT_DEVICE float fast_exp2(float x) { return __builtin_amdgcn_exp2f(x); }

// ---- MFMA: D = A B + C for one wave. A and B are each lane's packed operands (two 32-bit
// registers of 2 x 16-bit values, first in the low half; two float32 for xf32), C and D its
// accumulator registers; which matrix entries they hold is compiler/hip/mfma.py's layout ----
typedef _Float16 mfma_f16x4_ __attribute__((ext_vector_type(4)));
typedef short mfma_i16x4_ __attribute__((ext_vector_type(4)));
typedef float mfma_f32x2_ __attribute__((ext_vector_type(2)));
typedef float mfma_f32x4_ __attribute__((ext_vector_type(4)));
typedef float mfma_f32x16_ __attribute__((ext_vector_type(16)));

template <class V, int N>
JT_DEVICE V mfma_vec_(const float (&c)[N]) {
  static_assert(sizeof(V) == sizeof(c), "accumulator size");
  return __builtin_bit_cast(V, c);
}
template <class V, int N>
JT_DEVICE void mfma_store_(float (&d)[N], V v) {
  for (int i = 0; i < N; ++i) d[i] = v[i];
}
template <class V>
JT_DEVICE V mfma_operand_(const unsigned (&r)[2]) {
  return __builtin_bit_cast(V, r);
}

JT_DEVICE void mfma_f32_32x32x8_f16(float (&d)[16], const unsigned (&a)[2],
                                    const unsigned (&b)[2], const float (&c)[16]) {
  mfma_store_(d, __builtin_amdgcn_mfma_f32_32x32x8f16(
                     mfma_operand_<mfma_f16x4_>(a), mfma_operand_<mfma_f16x4_>(b),
                     mfma_vec_<mfma_f32x16_>(c), 0, 0, 0));
}
JT_DEVICE void mfma_f32_16x16x16_f16(float (&d)[4], const unsigned (&a)[2],
                                     const unsigned (&b)[2], const float (&c)[4]) {
  mfma_store_(d, __builtin_amdgcn_mfma_f32_16x16x16f16(
                     mfma_operand_<mfma_f16x4_>(a), mfma_operand_<mfma_f16x4_>(b),
                     mfma_vec_<mfma_f32x4_>(c), 0, 0, 0));
}
// bf16: the "_1k" instructions (4 values per lane, as for f16); gfx942 names them without _1k.
JT_DEVICE void mfma_f32_32x32x8_bf16(float (&d)[16], const unsigned (&a)[2],
                                     const unsigned (&b)[2], const float (&c)[16]) {
  mfma_store_(d, __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(
                     mfma_operand_<mfma_i16x4_>(a), mfma_operand_<mfma_i16x4_>(b),
                     mfma_vec_<mfma_f32x16_>(c), 0, 0, 0));
}
JT_DEVICE void mfma_f32_16x16x16_bf16(float (&d)[4], const unsigned (&a)[2],
                                      const unsigned (&b)[2], const float (&c)[4]) {
  mfma_store_(d, __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(
                     mfma_operand_<mfma_i16x4_>(a), mfma_operand_<mfma_i16x4_>(b),
                     mfma_vec_<mfma_f32x4_>(c), 0, 0, 0));
}
// xf32 exists on gfx94x only; declared for every target so that tile_gemm.h's templates name
// them, defined where the instructions exist (a gfx90a kernel using one fails to link; the
// planner gives float32 no MFMA there, from HipCaps).
JT_DEVICE void mfma_f32_32x32x4_xf32(float (&d)[16], const float (&a)[2], const float (&b)[2],
                                     const float (&c)[16]);
JT_DEVICE void mfma_f32_16x16x8_xf32(float (&d)[4], const float (&a)[2], const float (&b)[2],
                                     const float (&c)[4]);
#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
JT_DEVICE void mfma_f32_32x32x4_xf32(float (&d)[16], const float (&a)[2], const float (&b)[2],
                                     const float (&c)[16]) {
  mfma_store_(d, __builtin_amdgcn_mfma_f32_32x32x4_xf32(
                     __builtin_bit_cast(mfma_f32x2_, a), __builtin_bit_cast(mfma_f32x2_, b),
                     mfma_vec_<mfma_f32x16_>(c), 0, 0, 0));
}
JT_DEVICE void mfma_f32_16x16x8_xf32(float (&d)[4], const float (&a)[2], const float (&b)[2],
                                     const float (&c)[4]) {
  mfma_store_(d, __builtin_amdgcn_mfma_f32_16x16x8_xf32(
                     __builtin_bit_cast(mfma_f32x2_, a), __builtin_bit_cast(mfma_f32x2_, b),
                     mfma_vec_<mfma_f32x4_>(c), 0, 0, 0));
}
#endif

// ---- buffer loads: a raw buffer (stride 0) of `bytes` bytes at `base`; a load at an offset
// at or past `bytes` returns zero (the range check of the buffer instructions), so the last
// partial tile of an array needs no mask. Word 3 of the descriptor is DATA_FORMAT = 4
// (32-bit, bits 18:15), which gfx9's range check needs to be non-zero: 0x00020000, the
// value AMD's Composable Kernel uses for gfx90a and gfx94x (CK_BUFFER_RESOURCE_3RD_DWORD). ----
using buffer_rsrc = __amdgpu_buffer_rsrc_t;
template <class T>
JT_DEVICE buffer_rsrc buffer_resource(const T* base, int bytes) {
  return __builtin_amdgcn_make_buffer_rsrc(const_cast<T*>(base), static_cast<short>(0), bytes,
                                           0x00020000);
}
template <class T>
JT_DEVICE T buffer_load(buffer_rsrc r, int byte_offset) {
  if constexpr (sizeof(T) == 4) {
    return __builtin_bit_cast(T, __builtin_amdgcn_raw_buffer_load_b32(r, byte_offset, 0, 0));
  } else if constexpr (sizeof(T) == 8) {
    return __builtin_bit_cast(T, __builtin_amdgcn_raw_buffer_load_b64(r, byte_offset, 0, 0));
  } else {
    static_assert(sizeof(T) == 16, "buffer_load reads 4, 8 or 16 bytes");
    return __builtin_bit_cast(T, __builtin_amdgcn_raw_buffer_load_b128(r, byte_offset, 0, 0));
  }
}

// ---- s_waitcnt (gfx9 encoding: vmcnt in bits 3:0 and 15:14, expcnt 6:4, lgkmcnt 11:8; the
// counters not waited for are at their maximum) ----
template <int N>
JT_DEVICE void wait_vmcnt() {
  static_assert(0 <= N && N < 64, "vmcnt is 0..63");
  __builtin_amdgcn_s_waitcnt((N & 0xF) | ((N >> 4) << 14) | (0x7 << 4) | (0xF << 8));
}
template <int N>
JT_DEVICE void wait_lgkmcnt() {
  static_assert(0 <= N && N < 16, "lgkmcnt is 0..15");
  __builtin_amdgcn_s_waitcnt(0xF | (0x3 << 14) | (0x7 << 4) | (N << 8));
}


// ---- LDS-direct loads: global_load_lds_dword (AMD "MI300 Instruction Set Architecture"
// (CDNA3), the global instructions' LDS-load form). Each active lane reads 4 bytes at its own
// global address; the data goes to LDS, not to a VGPR, at M0's wave-uniform LDS address plus
// 4 x the lane's id in the wave. Like every vector memory load it counts in vmcnt until its
// data is in LDS: s_waitcnt vmcnt(0) (wait_vmcnt<0>) before this wave reads the slots, and
// that wait and then a barrier before another wave does (clang's own waitcnt insertion puts
// vmcnt(0) before the issuing wave's LDS reads, after the barrier, which leaves the other
// waves' reads unordered). The LDS base must be the same in every lane (M0 takes the first
// active lane's). clang-19's
// __builtin_amdgcn_global_load_lds(global src, LDS dst, size, offset, aux) needs the
// gfx940-insts feature (gfx940..942); it sets M0 from dst. Sizes 1 and 2 (ubyte/ushort) exist
// too and 12/16 only on gfx950 (and newer clang): only the dword form is offered here.
// gfx90a (CDNA2) has the same DMA only as buffer_load_dword ... lds, for which clang-19 has
// no builtin, so there the function is a compile error naming the target. ----
#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define JT_HAS_LDS_DIRECT_LOAD 1
#endif
template <int Bytes, class T, class S>
JT_DEVICE void lds_direct_load(const S* global_src, T* lds_base) {
  static_assert(Bytes == 4, "lds_direct_load moves 4 bytes per lane (global_load_lds_dword)");
#if defined(JT_HAS_LDS_DIRECT_LOAD)
  using global_void = __attribute__((address_space(1))) void*;
  using lds_void = __attribute__((address_space(3))) void*;
  __builtin_amdgcn_global_load_lds((global_void)const_cast<S*>(global_src), (lds_void)lds_base, 4,
                                   0, 0);
#else
  static_assert(sizeof(T) == 0,
                "lds_direct_load needs global_load_lds_dword (gfx940, gfx941, gfx942); this "
                "target (e.g. gfx90a) has no LDS-direct load clang-19 can emit");
#endif
}

// ---- LDS-direct loads through a buffer resource (`buffer_load_dword ... offen lds`, every
// GFX9 target, gfx90a included): lane l's 4 bytes at `byte_offset` in the buffer land at
// lds_base + 4 l, and, as for buffer_load, an offset at or past the resource's `bytes` lands
// zeros. clang-19 has no builtin for it, but the LLVM intrinsic
// (llvm.amdgcn.raw.ptr.buffer.load.lds: resource, LDS base, size, voffset, soffset, offset,
// aux) can be called by its name; the backend puts the wave-uniform LDS base in M0 as for
// global_load_lds_dword. The same wait and barrier rules as lds_direct_load apply. ----
extern "C" __attribute__((device)) void jaxtile_raw_buffer_load_lds(
    buffer_rsrc r, __attribute__((address_space(3))) void* lds, int size, int voffset,
    int soffset, int offset, int aux) __asm("llvm.amdgcn.raw.ptr.buffer.load.lds");
template <int Bytes, class T>
JT_DEVICE void lds_direct_buffer_load(buffer_rsrc r, int byte_offset, T* lds_base) {
  static_assert(Bytes == 4, "lds_direct_buffer_load moves 4 bytes per lane (buffer_load_dword)");
  using lds_void = __attribute__((address_space(3))) void*;
  jaxtile_raw_buffer_load_lds(r, (lds_void)lds_base, 4, byte_offset, 0, 0, 0);
}

}  // namespace jaxtile

// 8-bit floats: the same integer conversions on every GPU.
#include "float8.h"

namespace jaxtile {
// float64 -> float16 / bfloat16 rounded once: narrowed to float32 rounding to odd first, so
// the rounding to 11 or 8 bits is the one a direct rounding makes (24 >= 11 + 2 bits).
JT_DEVICE half to_half(double d) { return to_half(f8_::narrow_to_odd(d)); }
JT_DEVICE bf16 to_bf16(double d) { return to_bf16(f8_::narrow_to_odd(d)); }
}  // namespace jaxtile
