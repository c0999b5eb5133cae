// Tensor-core GEMM: C[M, N] (f32) = A[M, K] (f16, row-major) @ B[K, N] (f16, row-major).
//
// 128x128x32 block tiles, 128 threads as a 2x2 grid of warps owning 64x64 each; ldmatrix
// feeds mma.sync m16n8k16 (A as is, B K-major through .trans); a 3-stage cp.async pipeline
// with the schedule in docs/ptx_facts.md. Shared tiles are XOR-swizzled so that both the
// 16-byte cp.async stores and the ldmatrix rows are free of bank conflicts. M is arbitrary;
// N and K must be multiples of 8 (16-byte aligned rows for cp.async).
#include <jaxtile/device.h>

using jaxtile::half;
using jaxtile::ptr;

constexpr int BM = 128, BN = 128, BK = 32, STAGES = 3, THREADS = 128;
constexpr int A_TILE = BM * BK;  // halves per stage
constexpr int B_TILE = BK * BN;

// A rows are 64 bytes (4 chunks of 16 B): chunk' = chunk ^ ((row / 2) % 4).
JT_DEVICE int a_offset(int row, int chunk) { return row * BK + ((chunk ^ ((row >> 1) & 3)) << 3); }
// B rows are 256 bytes (16 chunks): chunk' = chunk ^ (row % 8).
JT_DEVICE int b_offset(int row, int chunk) { return row * BN + ((chunk ^ (row & 7)) << 3); }

// Copies the k-tile starting at k0 into one stage; masked chunks are zero-filled from a
// clamped (valid) source address.
JT_DEVICE void load_tile(ptr<half> as, ptr<half> bs, ptr<const half> A, ptr<const half> B, int M,
                         int N, int K, int m0, int n0, int k0, int tid) {
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = tid + i * THREADS;
    const int row = c >> 2, chunk = c & 3;
    const int gm = m0 + row, gk = k0 + chunk * 8;
    const int a_bytes = (gm < M && gk < K) ? 16 : 0;
    const ptr<const half> a_src = a_bytes > 0 ? A + (int64_t(gm) * K + gk) : A;
    jaxtile::cp_async<16>(as + a_offset(row, chunk), a_src, a_bytes);

    const int krow = c >> 4, nchunk = c & 15;
    const int gkb = k0 + krow, gn = n0 + nchunk * 8;
    const int b_bytes = (gkb < K && gn < N) ? 16 : 0;
    const ptr<const half> b_src = b_bytes > 0 ? B + (int64_t(gkb) * N + gn) : B;
    jaxtile::cp_async<16>(bs + b_offset(krow, nchunk), b_src, b_bytes);
  }
}

JT_KERNEL JT_LAUNCH_BOUNDS(128) void gemm_f16(ptr<const half> A, ptr<const half> B,
                                              ptr<float> C, int M, int N, int K) {
  JT_SHARED(half, As, STAGES * A_TILE);
  JT_SHARED(half, Bs, STAGES * B_TILE);
  const int tid = jaxtile::thread_idx().x;
  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp & 1, wn = warp >> 1;
  const int m0 = jaxtile::block_idx().y * BM, n0 = jaxtile::block_idx().x * BN;
  const int ktiles = (K + BK - 1) / BK;

  float acc[4][8][4];
  #pragma unroll
  for (int mt = 0; mt < 4; ++mt)
    #pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      #pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

  #pragma unroll

  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_tile(As + s * A_TILE, Bs + s * B_TILE, A, B, M, N, K, m0, n0, s * BK, tid);
    jaxtile::cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    jaxtile::cp_async_wait<STAGES - 2>();  // MUTATE:wait
    jaxtile::sync_threads();               // MUTATE:barrier
    const int next = kt + STAGES - 1;
    if (next < ktiles) {
      const int st = next % STAGES;
      load_tile(As + st * A_TILE, Bs + st * B_TILE, A, B, M, N, K, m0, n0, next * BK, tid);
    }
    jaxtile::cp_async_commit();            // MUTATE:refilled
    const ptr<half> as = As + (kt % STAGES) * A_TILE;
    const ptr<half> bs = Bs + (kt % STAGES) * B_TILE;
    #pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      const int j = lane >> 3, r = lane & 7;
      unsigned a[4][4], b[8][2];
      #pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        // Matrices: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
        const int row = wm * 64 + mt * 16 + (j & 1) * 8 + r;
        jaxtile::ldmatrix_x4(a[mt], as + a_offset(row, ks * 2 + (j >> 1)));
      }
      #pragma unroll
      for (int p = 0; p < 4; ++p) {
        // Matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
        const int krow = ks * 16 + (j & 1) * 8 + r;
        const int nchunk = (wn * 64 + p * 16 + (j >> 1) * 8) >> 3;
        unsigned t4[4];
        jaxtile::ldmatrix_x4_trans(t4, bs + b_offset(krow, nchunk));
        b[2 * p][0] = t4[0];
        b[2 * p][1] = t4[1];
        b[2 * p + 1][0] = t4[2];
        b[2 * p + 1][1] = t4[3];
      }
      #pragma unroll
      for (int mt = 0; mt < 4; ++mt)
        #pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          jaxtile::mma_m16n8k16_f16(acc[mt][nt], a[mt], b[nt], acc[mt][nt]);
    }
  }

  const int g = lane >> 2, t = lane & 3;
  #pragma unroll
  for (int mt = 0; mt < 4; ++mt)
    #pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      #pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = m0 + wm * 64 + mt * 16 + g + (i >> 1) * 8;
        const int col = n0 + wn * 64 + nt * 8 + 2 * t + (i & 1);
        if (row < M && col < N) C[int64_t(row) * N + col] = acc[mt][nt][i];
      }
}
