// The nvcc/NVRTC implementation of jaxtile's device header: inline PTX (sm_80 and later).
// Included only through device.h.
#pragma once

#define JT_KERNEL extern "C" __global__
#define JT_DEVICE __device__ __forceinline__
#define JT_LAUNCH_BOUNDS(...) __launch_bounds__(__VA_ARGS__)
#define JT_SHARED(T, name, count) __shared__ __align__(16) T name[count]

// 1024-byte aligned: wgmma's swizzled operand tiles are placed at multiples of 1024 bytes from
// here, and the swizzle pattern is a function of the absolute shared address.
extern __shared__ __align__(1024) unsigned char jaxtile_dynamic_smem[];
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
JT_DEVICE void barrier_arrive(unsigned id, unsigned nthreads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
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

// ---- shared-window addresses ----
template <class T>
JT_DEVICE unsigned smem_u32(const T* p) {
  return smem_addr_(p);
}

// ---- Hopper (sm_90 on): mbarriers, TMA; (sm_90a only) wgmma, setmaxnreg ----
// For device code of the architectures that have them (and nvcc's host pass, which parses but
// does not assemble them): a kernel using them compiled for another architecture fails to
// compile, naming them.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

JT_DEVICE void mbarrier_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr_(bar)), "r"(count)
               : "memory");
}
JT_DEVICE void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr_(bar)) : "memory");
}
JT_DEVICE void mbarrier_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr_(bar)),
               "r"(bytes)
               : "memory");
}
JT_DEVICE bool mbarrier_try_wait_parity(uint64_t* bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, "
      "p; }"
      : "=r"(done)
      : "r"(smem_addr_(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
JT_DEVICE void mbarrier_wait_parity(uint64_t* bar, unsigned parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}
JT_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
JT_DEVICE void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// ---- TMA ----
// A tensor map parameter: a CUtensorMap the handler builds, passed by value in the kernel's
// parameter space (TMA reads it there through its generic address).
#define JT_TENSOR_MAP(name) const __grid_constant__ ::jaxtile::tensor_map name
JT_DEVICE const tensor_map* tensor_map_ref(const tensor_map& map) { return &map; }
template <class T>
JT_DEVICE void tma_load_2d(T* dst, const tensor_map* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3}], [%4];" ::"r"(smem_addr_(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_addr_(bar))
      : "memory");
}
template <class T>
JT_DEVICE void tma_load_3d(T* dst, const tensor_map* map, uint64_t* bar, int c0, int c1,
                           int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4}], [%5];" ::"r"(smem_addr_(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr_(bar))
      : "memory");
}
template <class T>
JT_DEVICE void tma_load_4d(T* dst, const tensor_map* map, uint64_t* bar, int c0, int c1,
                           int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4, %5}], [%6];" ::"r"(smem_addr_(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr_(bar))
      : "memory");
}
template <class T>
JT_DEVICE void tma_load_5d(T* dst, const tensor_map* map, uint64_t* bar, int c0, int c1,
                           int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4, %5, %6}], [%7];" ::"r"(smem_addr_(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_addr_(bar))
      : "memory");
}
template <class T>
JT_DEVICE void tma_store_2d(const tensor_map* map, const T* src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
          map),
      "r"(c0), "r"(c1), "r"(smem_addr_(src))
      : "memory");
}
template <class T>
JT_DEVICE void tma_store_3d(const tensor_map* map, const T* src, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];" ::
          "l"(map),
      "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr_(src))
      : "memory");
}
JT_DEVICE void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N>
JT_DEVICE void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}
// Only the groups' source reads: their shared memory may be written again (PTX ISA,
// cp.async.bulk.wait_group's .read), their global writes may still be in flight.
template <int N>
JT_DEVICE void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

#endif  // sm_90 on

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
#define JT_HAS_WGMMA 1

// ---- wgmma ----
// m64n64k16: 32 accumulator registers per thread.
#define JT_WGMMA_D64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
  "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define JT_WGMMA_OUT64(d) \
  "+f"(d.r[0]), "+f"(d.r[1]), "+f"(d.r[2]), "+f"(d.r[3]), "+f"(d.r[4]), "+f"(d.r[5]), \
  "+f"(d.r[6]), "+f"(d.r[7]), "+f"(d.r[8]), "+f"(d.r[9]), "+f"(d.r[10]), \
  "+f"(d.r[11]), "+f"(d.r[12]), "+f"(d.r[13]), "+f"(d.r[14]), "+f"(d.r[15]), \
  "+f"(d.r[16]), "+f"(d.r[17]), "+f"(d.r[18]), "+f"(d.r[19]), "+f"(d.r[20]), \
  "+f"(d.r[21]), "+f"(d.r[22]), "+f"(d.r[23]), "+f"(d.r[24]), "+f"(d.r[25]), \
  "+f"(d.r[26]), "+f"(d.r[27]), "+f"(d.r[28]), "+f"(d.r[29]), "+f"(d.r[30]), \
  "+f"(d.r[31])

// m64n128k16: 64 accumulator registers per thread.
#define JT_WGMMA_D128 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
  "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, " \
  "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
  "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define JT_WGMMA_OUT128(d) \
  "+f"(d.r[0]), "+f"(d.r[1]), "+f"(d.r[2]), "+f"(d.r[3]), "+f"(d.r[4]), "+f"(d.r[5]), \
  "+f"(d.r[6]), "+f"(d.r[7]), "+f"(d.r[8]), "+f"(d.r[9]), "+f"(d.r[10]), \
  "+f"(d.r[11]), "+f"(d.r[12]), "+f"(d.r[13]), "+f"(d.r[14]), "+f"(d.r[15]), \
  "+f"(d.r[16]), "+f"(d.r[17]), "+f"(d.r[18]), "+f"(d.r[19]), "+f"(d.r[20]), \
  "+f"(d.r[21]), "+f"(d.r[22]), "+f"(d.r[23]), "+f"(d.r[24]), "+f"(d.r[25]), \
  "+f"(d.r[26]), "+f"(d.r[27]), "+f"(d.r[28]), "+f"(d.r[29]), "+f"(d.r[30]), \
  "+f"(d.r[31]), "+f"(d.r[32]), "+f"(d.r[33]), "+f"(d.r[34]), "+f"(d.r[35]), \
  "+f"(d.r[36]), "+f"(d.r[37]), "+f"(d.r[38]), "+f"(d.r[39]), "+f"(d.r[40]), \
  "+f"(d.r[41]), "+f"(d.r[42]), "+f"(d.r[43]), "+f"(d.r[44]), "+f"(d.r[45]), \
  "+f"(d.r[46]), "+f"(d.r[47]), "+f"(d.r[48]), "+f"(d.r[49]), "+f"(d.r[50]), \
  "+f"(d.r[51]), "+f"(d.r[52]), "+f"(d.r[53]), "+f"(d.r[54]), "+f"(d.r[55]), \
  "+f"(d.r[56]), "+f"(d.r[57]), "+f"(d.r[58]), "+f"(d.r[59]), "+f"(d.r[60]), \
  "+f"(d.r[61]), "+f"(d.r[62]), "+f"(d.r[63])

// m64n256k16: 128 accumulator registers per thread.
#define JT_WGMMA_D256 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
  "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, " \
  "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
  "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, " \
  "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, " \
  "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, " \
  "%124, %125, %126, %127"
#define JT_WGMMA_OUT256(d) \
  "+f"(d.r[0]), "+f"(d.r[1]), "+f"(d.r[2]), "+f"(d.r[3]), "+f"(d.r[4]), "+f"(d.r[5]), \
  "+f"(d.r[6]), "+f"(d.r[7]), "+f"(d.r[8]), "+f"(d.r[9]), "+f"(d.r[10]), \
  "+f"(d.r[11]), "+f"(d.r[12]), "+f"(d.r[13]), "+f"(d.r[14]), "+f"(d.r[15]), \
  "+f"(d.r[16]), "+f"(d.r[17]), "+f"(d.r[18]), "+f"(d.r[19]), "+f"(d.r[20]), \
  "+f"(d.r[21]), "+f"(d.r[22]), "+f"(d.r[23]), "+f"(d.r[24]), "+f"(d.r[25]), \
  "+f"(d.r[26]), "+f"(d.r[27]), "+f"(d.r[28]), "+f"(d.r[29]), "+f"(d.r[30]), \
  "+f"(d.r[31]), "+f"(d.r[32]), "+f"(d.r[33]), "+f"(d.r[34]), "+f"(d.r[35]), \
  "+f"(d.r[36]), "+f"(d.r[37]), "+f"(d.r[38]), "+f"(d.r[39]), "+f"(d.r[40]), \
  "+f"(d.r[41]), "+f"(d.r[42]), "+f"(d.r[43]), "+f"(d.r[44]), "+f"(d.r[45]), \
  "+f"(d.r[46]), "+f"(d.r[47]), "+f"(d.r[48]), "+f"(d.r[49]), "+f"(d.r[50]), \
  "+f"(d.r[51]), "+f"(d.r[52]), "+f"(d.r[53]), "+f"(d.r[54]), "+f"(d.r[55]), \
  "+f"(d.r[56]), "+f"(d.r[57]), "+f"(d.r[58]), "+f"(d.r[59]), "+f"(d.r[60]), \
  "+f"(d.r[61]), "+f"(d.r[62]), "+f"(d.r[63]), "+f"(d.r[64]), "+f"(d.r[65]), \
  "+f"(d.r[66]), "+f"(d.r[67]), "+f"(d.r[68]), "+f"(d.r[69]), "+f"(d.r[70]), \
  "+f"(d.r[71]), "+f"(d.r[72]), "+f"(d.r[73]), "+f"(d.r[74]), "+f"(d.r[75]), \
  "+f"(d.r[76]), "+f"(d.r[77]), "+f"(d.r[78]), "+f"(d.r[79]), "+f"(d.r[80]), \
  "+f"(d.r[81]), "+f"(d.r[82]), "+f"(d.r[83]), "+f"(d.r[84]), "+f"(d.r[85]), \
  "+f"(d.r[86]), "+f"(d.r[87]), "+f"(d.r[88]), "+f"(d.r[89]), "+f"(d.r[90]), \
  "+f"(d.r[91]), "+f"(d.r[92]), "+f"(d.r[93]), "+f"(d.r[94]), "+f"(d.r[95]), \
  "+f"(d.r[96]), "+f"(d.r[97]), "+f"(d.r[98]), "+f"(d.r[99]), "+f"(d.r[100]), \
  "+f"(d.r[101]), "+f"(d.r[102]), "+f"(d.r[103]), "+f"(d.r[104]), "+f"(d.r[105]), \
  "+f"(d.r[106]), "+f"(d.r[107]), "+f"(d.r[108]), "+f"(d.r[109]), "+f"(d.r[110]), \
  "+f"(d.r[111]), "+f"(d.r[112]), "+f"(d.r[113]), "+f"(d.r[114]), "+f"(d.r[115]), \
  "+f"(d.r[116]), "+f"(d.r[117]), "+f"(d.r[118]), "+f"(d.r[119]), "+f"(d.r[120]), \
  "+f"(d.r[121]), "+f"(d.r[122]), "+f"(d.r[123]), "+f"(d.r[124]), "+f"(d.r[125]), \
  "+f"(d.r[126]), "+f"(d.r[127])

template <int N>
struct wgmma_acc {
  static_assert(N == 64 || N == 128 || N == 256, "wgmma: N is 64, 128 or 256 on the GPU");
  float r[N / 2];
  JT_DEVICE float& operator[](int i) { return r[i]; }
};

// D (+)= A * B with A and B in shared memory (scales +1); the predicate scale_d != 0 keeps D.
// The immediates imm-trans-a / imm-trans-b (TA, TB) say an operand is MN-major ("transposed":
// M or N contiguous in its rows, the canonical MN-major layout) rather than K-major.
#define JT_WGMMA_SS_ASM(N, T, IA, IB, IS, ITA, ITB)                                           \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %" IS ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " {" JT_WGMMA_D##N   \
               "}, %" IA ", %" IB ", p, 1, 1, %" ITA ", %" ITB "; }"                          \
               : JT_WGMMA_OUT##N(d)                                                           \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(int(TA)), "n"(int(TB))           \
               : "memory")
// The same with A from registers (its fragment as mma.m16n8k16's A, per warp of 16 rows);
// only B has a transpose immediate.
#define JT_WGMMA_RS_ASM(N, T, A0, A1, A2, A3, IB, IS, ITB)                                  \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %" IS ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " {" JT_WGMMA_D##N   \
               "}, {%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" IB ", p, 1, 1, %" ITB "; }"        \
               : JT_WGMMA_OUT##N(d)                                                           \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d),       \
                 "n"(int(TB))                                                                 \
               : "memory")
#define JT_WGMMA_SS_FN(name, T)                                                               \
  template <int N, bool TA = false, bool TB = false>                                          \
  JT_DEVICE void name(wgmma_acc<N>& d, uint64_t desc_a, uint64_t desc_b, int scale_d) {       \
    if constexpr (N == 64) {                                                                  \
      JT_WGMMA_SS_ASM(64, T, "32", "33", "34", "35", "36");                                  \
    } else if constexpr (N == 128) {                                                          \
      JT_WGMMA_SS_ASM(128, T, "64", "65", "66", "67", "68");                                 \
    } else {                                                                                  \
      JT_WGMMA_SS_ASM(256, T, "128", "129", "130", "131", "132");                            \
    }                                                                                         \
  }
#define JT_WGMMA_RS_FN(name, T)                                                               \
  template <int N, bool TB = false>                                                           \
  JT_DEVICE void name(wgmma_acc<N>& d, const unsigned (&a)[4], uint64_t desc_b, int scale_d) { \
    if constexpr (N == 64) {                                                                  \
      JT_WGMMA_RS_ASM(64, T, "32", "33", "34", "35", "36", "37", "38");                      \
    } else if constexpr (N == 128) {                                                          \
      JT_WGMMA_RS_ASM(128, T, "64", "65", "66", "67", "68", "69", "70");                     \
    } else {                                                                                  \
      JT_WGMMA_RS_ASM(256, T, "128", "129", "130", "131", "132", "133", "134");              \
    }                                                                                         \
  }
// tf32 (m64nNk8): both operands K-major (no transpose immediates), f32 words in shared memory
// of which the tensor core reads the tf32 bits.
#define JT_WGMMA_TF32_ASM(N, IA, IB, IS)                                                       \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %" IS ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 {" JT_WGMMA_D##N      \
               "}, %" IA ", %" IB ", p, 1, 1; }"                                              \
               : JT_WGMMA_OUT##N(d)                                                           \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d)                                       \
               : "memory")
template <int N>
JT_DEVICE void wgmma_tf32(wgmma_acc<N>& d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (N == 64) {
    JT_WGMMA_TF32_ASM(64, "32", "33", "34");
  } else if constexpr (N == 128) {
    JT_WGMMA_TF32_ASM(128, "64", "65", "66");
  } else {
    JT_WGMMA_TF32_ASM(256, "128", "129", "130");
  }
}
// FP8 (m64nNk32, e4m3 or e5m2): both operands K-major, as for tf32.
#define JT_WGMMA_FP8_ASM(N, T, IA, IB, IS)                                                     \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %" IS ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." T "." T " {" JT_WGMMA_D##N   \
               "}, %" IA ", %" IB ", p, 1, 1; }"                                              \
               : JT_WGMMA_OUT##N(d)                                                           \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d)                                       \
               : "memory")
#define JT_WGMMA_FP8_FN(name, T)                                                              \
  template <int N>                                                                            \
  JT_DEVICE void name(wgmma_acc<N>& d, uint64_t desc_a, uint64_t desc_b, int scale_d) {       \
    if constexpr (N == 64) {                                                                  \
      JT_WGMMA_FP8_ASM(64, T, "32", "33", "34");                                              \
    } else if constexpr (N == 128) {                                                          \
      JT_WGMMA_FP8_ASM(128, T, "64", "65", "66");                                             \
    } else {                                                                                  \
      JT_WGMMA_FP8_ASM(256, T, "128", "129", "130");                                          \
    }                                                                                         \
  }
JT_WGMMA_FP8_FN(wgmma_e4m3, "e4m3")
JT_WGMMA_FP8_FN(wgmma_e5m2, "e5m2")
JT_WGMMA_SS_FN(wgmma_f16, "f16")
JT_WGMMA_SS_FN(wgmma_bf16, "bf16")
JT_WGMMA_RS_FN(wgmma_f16_rs, "f16")
JT_WGMMA_RS_FN(wgmma_bf16_rs, "bf16")

JT_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
JT_DEVICE void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
JT_DEVICE void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// ---- register reallocation between warpgroups ----
template <int N>
JT_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
JT_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

#endif  // sm_90a

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
// float64 -> float16 in one rounding (through float32 a value halfway between two float16s
// after the first rounding but not before would round wrongly). bf16 from double is after
// float8.h below: cvt.rn.bf16.f64 needs sm_90.
JT_DEVICE half to_half(double d) {
  half h;
  asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.bits) : "d"(d));
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

// 8-bit floats: the same integer conversions on every GPU.
#include "float8.h"

namespace jaxtile {
// float64 -> bfloat16 rounded once: narrowed to float32 rounding to odd first, so the
// rounding to 8 bits is the one a direct rounding makes (24 >= 8 + 2 bits).
JT_DEVICE bf16 to_bf16(double d) { return to_bf16(f8_::narrow_to_odd(d)); }
}  // namespace jaxtile
