// C[M, N] = A[M, K] * B[N, K]^T (f16 in, or bf16 with GEMM_BF16 defined; f32 out) the Hopper
// way: warp specialisation, TMA, mbarriers and wgmma (sm_90a).
//
// Warpgroup 0 is the producer: it gives registers up (setmaxnreg_dec) and one thread issues
// TMA loads of A and B k-tiles into a ring of STAGES stages, each guarded by a "full" barrier
// (one arrival, expecting the stage's bytes) and an "empty" one (every consumer thread
// arrives when it has finished with the stage). Warpgroups 1..CONSUMERS are the consumers:
// each takes 64 rows of the BM x BN block tile and runs wgmma on the 128-byte-swizzled tiles
// TMA wrote, then stores its accumulator through shared memory with a TMA store.
// Tensor maps (A: K x M box 64 x BM, B: K x N box 64 x BN, both 128-byte swizzled; C: N x M
// box BN x 64) come in global buffers. TMA fills out-of-bounds elements with zeros and clips
// the store, so no shape needs a mask (K and N only need 16-byte rows).
#include <jaxtile/device.h>

using jaxtile::ptr;
using jaxtile::tensor_map;
#if defined(GEMM_BF16)
using elem = jaxtile::bf16;
#define WGMMA jaxtile::wgmma_bf16
#else
using elem = jaxtile::half;
#define WGMMA jaxtile::wgmma_f16
#endif

constexpr int CONSUMERS = 2, STAGES = 2;
constexpr int BM = 64 * CONSUMERS, BN = 64, BK = 64;
constexpr int A_STAGE = BM * BK, B_STAGE = BN * BK;  // elements
constexpr unsigned STAGE_BYTES = (A_STAGE + B_STAGE) * 2;
constexpr int C_TILE = 64 * BN;                       // floats per consumer
// Dynamic shared memory: 1024 bytes of slack to align the swizzled tiles, then the stages,
// then the consumers' C tiles.
constexpr int SMEM_BYTES = 1024 + STAGES * (A_STAGE + B_STAGE) * 2 + CONSUMERS * C_TILE * 4;
static_assert(SMEM_BYTES <= 227 * 1024, "a block has at most 227 KiB of shared memory");

JT_KERNEL JT_LAUNCH_BOUNDS(128 * (CONSUMERS + 1), 1) void gemm_sm90a(
    ptr<const uint8_t> map_a, ptr<const uint8_t> map_b, ptr<const uint8_t> map_c,
    ptr<const elem> A, ptr<const elem> B, ptr<float> C, int M, int N, int K) {
  JT_SHARED(uint64_t, full, STAGES);
  JT_SHARED(uint64_t, empty, STAGES);
  // A 128-byte swizzle repeats every 1024 bytes: tiles start at multiples of that.
  const unsigned pad =
      (1024u - jaxtile::smem_u32(jaxtile::dynamic_shared<unsigned char>()) % 1024u) % 1024u;
  JT_SHARED_AT(elem, As, STAGES * A_STAGE, pad);
  JT_SHARED_AT(elem, Bs, STAGES * B_STAGE, pad + STAGES * A_STAGE * 2);
  JT_SHARED_AT(float, Cs, CONSUMERS * C_TILE, pad + STAGES * (A_STAGE + B_STAGE) * 2);
  const ptr<const tensor_map> ta = jaxtile::ptr_cast<const tensor_map>(map_a);
  const ptr<const tensor_map> tb = jaxtile::ptr_cast<const tensor_map>(map_b);
  const ptr<const tensor_map> tc = jaxtile::ptr_cast<const tensor_map>(map_c);
  const int tid = jaxtile::thread_idx().x, wg = tid / 128;
  const int m0 = jaxtile::block_idx().y * BM, n0 = jaxtile::block_idx().x * BN;
  const int ktiles = (K + BK - 1) / BK;

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      jaxtile::mbarrier_init(full + s, 1);
      jaxtile::mbarrier_init(empty + s, CONSUMERS * 128);
    }
    jaxtile::fence_mbarrier_init();
  }
  jaxtile::sync_threads();

  if (wg == 0) {
    jaxtile::setmaxnreg_dec<40>();
    if (tid == 0) {
      for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % STAGES;
        // The stage's previous use (kt / STAGES - 1) must be consumed.
        if (kt >= STAGES) {
          jaxtile::mbarrier_wait_parity(empty + s, (kt / STAGES - 1) & 1);  // MUTATE:phase
        }
        jaxtile::mbarrier_arrive_expect_tx(full + s, STAGE_BYTES);  // MUTATE:expect
        jaxtile::tma_load_2d(As + s * A_STAGE, ta, full + s, kt * BK, m0);
        jaxtile::tma_load_2d(Bs + s * B_STAGE, tb, full + s, kt * BK, n0);
      }
    }
    return;
  }

  jaxtile::setmaxnreg_inc<232>();  // MUTATE:inc
  const int c = wg - 1;
  jaxtile::wgmma_acc<BN> acc;
  #pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  for (int kt = 0; kt < ktiles; ++kt) {
    const int s = kt % STAGES;
    jaxtile::mbarrier_wait_parity(full + s, (kt / STAGES) & 1);
    jaxtile::wgmma_fence();
    #pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      // K-major, 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart; the
      // k16 step moves the start 32 bytes along the row (the leading offset is unused).
      const ptr<elem> a_tile = As + s * A_STAGE + c * 64 * BK + ks * 16;
      const uint64_t da = jaxtile::wgmma_desc(a_tile, 16, 1024, 128);  // MUTATE:swizzle
      const uint64_t db = jaxtile::wgmma_desc(Bs + s * B_STAGE + ks * 16, 16, 1024, 128);
      WGMMA<BN>(acc, da, db, 1);
    }
    jaxtile::wgmma_commit_group();
    jaxtile::wgmma_wait_group<0>();  // MUTATE:wait
    jaxtile::mbarrier_arrive(empty + s);  // MUTATE:release
  }

  // Epilogue: the fragment (row 16w + g + 8 * ((i >> 1) & 1), column 8 * (i >> 2) + 2q + (i & 1))
  // to this consumer's C tile, then one TMA store of it.
  const ptr<float> cs = Cs + c * C_TILE;
  const int t = tid % 128, w = t / 32, g = (t % 32) / 4, q = t % 4;
  #pragma unroll
  for (int i = 0; i < BN / 2; ++i) {
    const int row = 16 * w + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * q + (i & 1);
    cs[row * BN + col] = acc[i];
  }
  jaxtile::fence_proxy_async();  // MUTATE:fence
  jaxtile::barrier_sync(1 + c, 128);
  if (t == 0) {
    jaxtile::tma_store_2d(tc, cs, n0, m0 + c * 64);
    jaxtile::bulk_commit_group();
    jaxtile::bulk_wait_group<0>();
  }
}
