// A hand-written MFMA GEMM, C (M x N, float32) = A (M x K) B^T with A and B (N x K) float16,
// both k-contiguous: the kernel the resource figures (benchmarks/hip_report.py) are read
// from. A 128 x 128 tile per workgroup of 4 waves, each wave 64 x 64 as 2 x 2
// v_mfma_f32_32x32x8 accumulators; K in steps of 32 through LDS rows padded by 8 bytes (the
// conflict-free operand layout of compiler/hip/lds.py), global reads as buffer loads, so
// rows and columns past the matrix read zero. M, N multiples of 128 and K of 32 are not
// required for the loads; stores are masked.
#include <jaxtile/device.h>
using namespace jaxtile;

constexpr int kBM = 128, kBN = 128, kBK = 32;
constexpr int kRowBytes = kBK * 2 + 8;  // 32 halves and one lane read of padding

JT_KERNEL JT_LAUNCH_BOUNDS(256) void gemm_f16_mfma(ptr<const half> a, ptr<const half> bt,
                                                   ptr<float> c, int M, int N, int K) {
  JT_SHARED(unsigned char, lds_a, kBM * kRowBytes);
  JT_SHARED(unsigned char, lds_b, kBN * kRowBytes);
  const unsigned tid = thread_idx().x, lane = lane_id(), wave = tid / 64;
  const int m0 = static_cast<int>(block_idx().y) * kBM;
  const int n0 = static_cast<int>(block_idx().x) * kBN;
  const int wm = static_cast<int>(wave / 2) * 64, wn = static_cast<int>(wave % 2) * 64;
  const buffer_rsrc ra = buffer_resource(a, M * K * 2);
  const buffer_rsrc rb = buffer_resource(bt, N * K * 2);
  float acc[2][2][16] = {};
#pragma clang loop unroll(disable)
  for (int k0 = 0; k0 < K; k0 += kBK) {
    // Global -> LDS: 128 rows x 64 bytes per operand, 16 bytes per lane, two rounds.
    for (int round = 0; round < 2; ++round) {
      const int row = static_cast<int>(tid / 4) + 64 * round;
      const int col = static_cast<int>(tid % 4) * 8;
      const u32x4 va = buffer_load<u32x4>(ra, ((m0 + row) * K + k0 + col) * 2);
      const u32x4 vb = buffer_load<u32x4>(rb, ((n0 + row) * K + k0 + col) * 2);
      u32x2* da = ptr_cast<u32x2>(lds_a + row * kRowBytes + col * 2);
      u32x2* db = ptr_cast<u32x2>(lds_b + row * kRowBytes + col * 2);
      da[0] = {va.x, va.y};
      da[1] = {va.z, va.w};
      db[0] = {vb.x, vb.y};
      db[1] = {vb.z, vb.w};
    }
    sync_threads();
    for (int kk = 0; kk < kBK; kk += 8) {
      // Lane l holds A[row l % 32][k 4 (l / 32) .. + 3] and B^T's row likewise: one 8-byte
      // LDS read each.
      const int k_bytes = (kk + 4 * static_cast<int>(lane / 32)) * 2;
      unsigned fa[2][2], fb[2][2];
      for (int i = 0; i < 2; ++i) {
        const u32x2 va = *ptr_cast<u32x2>(
            lds_a + (wm + 32 * i + static_cast<int>(lane % 32)) * kRowBytes + k_bytes);
        const u32x2 vb = *ptr_cast<u32x2>(
            lds_b + (wn + 32 * i + static_cast<int>(lane % 32)) * kRowBytes + k_bytes);
        fa[i][0] = va.x;
        fa[i][1] = va.y;
        fb[i][0] = vb.x;
        fb[i][1] = vb.y;
      }
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) mfma_f32_32x32x8_f16(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    sync_threads();
  }
  // Accumulator register r of lane l is row 8 (r / 4) + 4 (l / 32) + r % 4, column l % 32.
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int r = 0; r < 16; ++r) {
        const int row = m0 + wm + 32 * i + 8 * (r / 4) + 4 * static_cast<int>(lane / 32) + r % 4;
        const int col = n0 + wn + 32 * j + static_cast<int>(lane % 32);
        if (row < M && col < N) c[row * N + col] = acc[i][j][r];
      }
}
