// jaxtile's device header: the only way generated device code touches architecture features.
//
// Device code written against this header is compiled three ways from the same text:
//   - by nvcc or NVRTC, where every operation is inline PTX (device_ptx.h);
//   - by g++ for the SIMT emulator (-DJAXTILE_EMULATOR), where every operation is plain C++
//     that runs the CUDA threads as fibers on the CPU and checks what they do
//     (ffi/emulator/include/jaxtile_emu/device_emu.h);
//   - by clang -x hip for AMD GPUs (gfx90a, gfx942), where every operation is a clang
//     __builtin_amdgcn_* builtin or plain C++ (device_hip.h; wave64, so kWarpSize is 64).
// Outside this header, device code contains no `asm`, no `__shfl*`, no `__syncthreads`, no
// CUDA builtin variables and no intrinsics: tests/compiler/gpu/test_device_rule.py enforces it.
//
// The contract (both implementations provide exactly this, in namespace jaxtile):
//   JT_KERNEL, JT_DEVICE, JT_LAUNCH_BOUNDS(n[, min_blocks])   kernel / device-function
//                                                  declarations (min_blocks 1 lets ptxas know
//                                                  the count setmaxnreg starts from)
//   JT_SHARED(T, name, count)                      a per-block shared array; `name` is a ptr<T>
//   JT_SHARED_AT(T, name, count, offset)           a named view of `count` T at byte `offset`
//                                                  of the dynamic shared buffer (views may
//                                                  overlap: buffers reusing bytes)
//   ptr<T>                                         a pointer (T* on the GPU; a checked pointer
//                                                  carrying its allocation in the emulator)
//   ptr_cast<U>(p), dynamic_shared<T>()            reinterpretation; the dynamic shared buffer
//   thread_idx() block_idx() block_dim() grid_dim() lane_id() warp_id()
//   sync_threads()                 bar.sync 0
//   barrier_sync(id, n)            bar.sync id, n            (named barrier, n % 32 == 0)
//   barrier_arrive(id, n)          bar.arrive id, n          (counts toward the named barrier's
//                                  n without waiting for it; n % 32 == 0, n > 0)
//   sync_warp(mask)                bar.warp.sync mask
//   shfl_{xor,down,up,idx}(mask, v, x)   shfl.sync.{bfly,down,up,idx}.b32  (4-byte values)
//   vote_all / vote_any / ballot   vote.sync.{all,any,ballot}
//   ldmatrix_x{1,2,4}[_trans](r, p)       ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16
//   mma_m16n8k16_f16 / _bf16(d, a, b, c)  mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{..}.f32
//   mma_m16n8k8_tf32(d, a, b, c)          mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
//   cp_async<B>(dst, src, src_bytes)      cp.async.ca (B = 4, 8) / cp.async.cg (B = 16), zero-fill
//   cp_async_commit()              cp.async.commit_group
//   cp_async_wait<N>()             cp.async.wait_group N
//   Hopper, sm_90 on (wgmma and setmaxnreg sm_90a only; the async proxy; see
//   docs/emulator.md "Hopper"):
//   smem_u32(p)                    cvta.to.shared: the shared-window address of p
//   mbarrier_init(bar, count)      mbarrier.init.shared::cta.b64 (bar: ptr<uint64_t> in shared)
//   mbarrier_arrive(bar)           mbarrier.arrive.shared::cta.b64
//   mbarrier_arrive_expect_tx(bar, bytes)  mbarrier.arrive.expect_tx.shared::cta.b64
//   mbarrier_try_wait_parity(bar, parity)  mbarrier.try_wait.parity.shared::cta.b64: true once
//                                  the phase of that parity completed; mbarrier_wait_parity
//                                  loops on it
//   fence_proxy_async()            fence.proxy.async.shared::cta (generic-proxy shared writes
//                                  before it become visible to TMA and wgmma)
//   fence_mbarrier_init()          fence.mbarrier_init.release.cluster
//   tensor_map                     128 opaque bytes (a CUtensorMap on the GPU), read by TMA
//                                  through a ptr<const tensor_map> to global memory
//   JT_TENSOR_MAP(name)            a kernel parameter holding a tensor map (on the GPU a
//                                  const __grid_constant__ tensor_map); tensor_map_ref(name)
//                                  is what tma_* take for it
//   tma_load_{2d,3d}(dst, map, bar, c0, c1[, c2])
//                                  cp.async.bulk.tensor.{2,3}d.shared::cluster.global.tile
//                                  .mbarrier::complete_tx::bytes (coordinates innermost first;
//                                  out-of-bounds elements read as zero)
//   tma_store_{2d,3d}(map, src, c0, c1[, c2])
//                                  cp.async.bulk.tensor.{2,3}d.global.shared::cta.tile.bulk_group
//   bulk_commit_group() / bulk_wait_group<N>()   cp.async.bulk.commit_group / .wait_group N
//   bulk_wait_group_read<N>()      cp.async.bulk.wait_group.read N (the source reads only)
//   wgmma_desc(p, lbo, sbo, swizzle)   a shared-memory matrix descriptor (64 bits)
//   wgmma_acc<N>                   the m64nN f32 accumulator fragment (N/2 floats per thread)
//   wgmma_{f16,bf16}<N, TA, TB>(d, desc_a, desc_b, scale_d)
//                                  wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16} (A and B
//                                  from shared memory; TA / TB true: that operand is MN-major,
//                                  the imm-trans-a / imm-trans-b immediates)
//   wgmma_{f16,bf16}_rs<N, TB>(d, a, desc_b, scale_d)   the same with A from 4 registers
//   wgmma_{e4m3,e5m2}<N>(d, desc_a, desc_b, scale_d)   wgmma...m64nNk32.f32.{e4m3,e5m2} (K-major
//                                  8-bit float operands)
//   wgmma_tf32<N>(d, desc_a, desc_b, scale_d)   wgmma...m64nNk8.f32.tf32.tf32 (K-major f32
//                                  words, read as tf32: the low 13 mantissa bits ignored)
//   wgmma_fence() / wgmma_commit_group() / wgmma_wait_group<N>()
//                                  wgmma.fence / .commit_group / .wait_group N (.sync.aligned)
//   setmaxnreg_inc<N>() / setmaxnreg_dec<N>()   setmaxnreg.{inc,dec}.sync.aligned.u32 N
//   atomic_add / atomic_max / atomic_min / atomic_exch   atom.{add,max,min,exch} (32-bit int;
//                                                  add on float)
//   atomic_cas(p, compare, v)      atom.cas.b32 / .b64 (unsigned, unsigned long long)
//   volatile_load(p)               ld.volatile (1-8 bytes): memory another block may change
//                                  (relaxed: orders no other access)
//   load_acquire(p)                ld.acquire.gpu (4, 8 bytes): later accesses stay after it
//   store_release(p, v)            st.release.gpu (4, 8 bytes): earlier accesses stay before it
//   fence()                        fence.acq_rel.gpu
//   atomic_max / atomic_min on float and double, atomic_add on double, and all three on
//   int64_t: compare-and-swap loops with XLA's semantics (atomics.h, plain C++)
//   device_printf(format, args...) printf (the GPU's printf buffer, written out when the
//                                  kernel completes); the emulator writes each call whole
//                                  under stdout's lock and flushes
//   fast_exp2(x)                   ex2.approx.ftz.f32
//   f32x2, f32x4, u32x2, u32x4                     8/16-byte vectors: ld/st.{v2,v4}
//   xla_max, xla_min, xla_div, xla_rem, xla_f2i, round_f16, round_bf16, ...  (xla_math.h:
//                                                  XLA's per-element rules, plain C++)
//   half, bf16, to_float, to_half, to_bf16, to_tf32, pack2   cvt.rn.f16.f32, cvt.rn.bf16.f32,
//                                                  cvt.rna.tf32.f32, and packing two 16-bit values
//                                                  into one .b32 register (first in the low half);
//                                                  to_half / to_bf16 of a double round once
//                                                  (cvt.rn.f16.f64; bf16: through float32
//                                                  rounded to odd)
//   fp8e4m3, fp8e5m2, to_float, to_fp8e4m3, to_fp8e5m2   float8_e4m3fn / float8_e5m2 as
//                                                  ml_dtypes and XLA convert them (from float
//                                                  or double, rounded once; float8.h)
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC has no C library headers; these are the fixed-width types device code uses.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

namespace jaxtile {

#if defined(__HIPCC__) || defined(JAXTILE_WAVE64)
// AMD's waves have 64 lanes (device_hip.h; JAXTILE_WAVE64: the emulator's wave64 mode).
constexpr unsigned long long kFullMask = ~0ull;
constexpr int kWarpSize = 64;
#else
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;
#endif

struct idx3 {
  unsigned x, y, z;
};

// Vector types for 8- and 16-byte memory accesses (ld/st.v2, .v4): reading or writing one
// through `ptr_cast<f32x4>(p)[i]` is one access, which must be aligned to its size.
struct alignas(8) f32x2 {
  float x, y;
};
struct alignas(16) f32x4 {
  float x, y, z, w;
};
struct alignas(8) u32x2 {
  unsigned x, y;
};
struct alignas(16) u32x4 {
  unsigned x, y, z, w;
};

// 16-bit float types as raw bits: the same layout everywhere, no vendor header needed (NVRTC
// has none), and conversions go through the header's rounding.
struct half {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};
// 8-bit floats (float8_e4m3fn, float8_e5m2) the same way.
struct fp8e4m3 {
  uint8_t bits;
};
struct fp8e5m2 {
  uint8_t bits;
};

// A TMA tensor map: a CUtensorMap on the GPU (built on the host), the emulator's own
// description in the emulator (jaxtile::emu::TensorMap). Either way 128 bytes, 64-aligned.
struct alignas(64) tensor_map {
  unsigned char bytes[128];
};

}  // namespace jaxtile

#if defined(JAXTILE_EMULATOR)
#include <jaxtile_emu/device_emu.h>
#elif defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include "device_ptx.h"
#elif defined(__HIPCC__)
#include "device_hip.h"
#else
#error "jaxtile: compile device code with nvcc/NVRTC, or with -DJAXTILE_EMULATOR for the emulator"
#endif

namespace jaxtile {
// A wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13
// the start address, 16-29 the leading-dimension byte offset, 32-45 the stride-dimension
// byte offset (each in 16-byte units), 49-51 the base offset (0 here: swizzled tiles start
// at a multiple of the pattern's period), 62-63 the swizzle (0 none, 1 128-byte, 2 64-byte,
// 3 32-byte).
template <class P>
JT_DEVICE uint64_t wgmma_desc(P smem, unsigned lbo_bytes, unsigned sbo_bytes,
                              int swizzle_bytes) {
  const uint64_t mode = swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2
                        : swizzle_bytes == 32 ? 3 : 0;
  return static_cast<uint64_t>((smem_u32(smem) & 0x3ffffu) >> 4) |
         static_cast<uint64_t>((lbo_bytes >> 4) & 0x3fffu) << 16 |
         static_cast<uint64_t>((sbo_bytes >> 4) & 0x3fffu) << 32 | mode << 62;
}
}  // namespace jaxtile

// XLA's per-element semantics (min/max with NaN, integer division, saturating casts...).
#include "xla_math.h"
// Atomic updates built on compare-and-swap.
#include "atomics.h"
