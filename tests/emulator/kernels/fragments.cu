// Probes of single warp-level operations and conversions, for the lane-by-lane tests.
#include <jaxtile/device.h>

using jaxtile::ptr;

// ldmatrix: `src` (64 rows of 8 16-bit values) is copied to shared memory; lane L supplies
// the address of row rows[L]; mode = {count, trans}. out[4 L + j] = register j of lane L.
JT_KERNEL void ldmatrix_probe(ptr<const uint16_t> src, ptr<const int> rows, ptr<const int> mode,
                              ptr<unsigned> out) {
  JT_SHARED(uint16_t, tile, 512);
  const int lane = jaxtile::lane_id();
  for (int i = lane; i < 512; i += 32) tile[i] = src[i];
  jaxtile::sync_threads();
  const ptr<uint16_t> row = tile + rows[lane] * 8;
  const int count = mode[0];
  const bool trans = mode[1] != 0;
  unsigned r[4] = {0u, 0u, 0u, 0u};
  if (count == 1) {
    unsigned x[1];
    if (trans) {
      jaxtile::ldmatrix_x1_trans(x, row);
    } else {
      jaxtile::ldmatrix_x1(x, row);
    }
    r[0] = x[0];
  } else if (count == 2) {
    unsigned x[2];
    if (trans) {
      jaxtile::ldmatrix_x2_trans(x, row);
    } else {
      jaxtile::ldmatrix_x2(x, row);
    }
    r[0] = x[0];
    r[1] = x[1];
  } else {
    if (trans) {
      jaxtile::ldmatrix_x4_trans(r, row);
    } else {
      jaxtile::ldmatrix_x4(r, row);
    }
  }
  for (int j = 0; j < 4; ++j) out[lane * 4 + j] = r[j];
}

// mma.sync: lane L's registers are a[4 L + i], b[2 L + i], c[4 L + i]; kind 0 = m16n8k16 f16,
// 1 = m16n8k16 bf16, 2 = m16n8k8 tf32. d[4 L + i] = register i of lane L's D.
JT_KERNEL void mma_probe(ptr<const unsigned> a, ptr<const unsigned> b, ptr<const float> c,
                         ptr<const int> kind, ptr<float> d) {
  const int lane = jaxtile::lane_id();
  unsigned ra[4], rb[2];
  float rc[4], rd[4];
  for (int i = 0; i < 4; ++i) ra[i] = a[lane * 4 + i];
  for (int i = 0; i < 2; ++i) rb[i] = b[lane * 2 + i];
  for (int i = 0; i < 4; ++i) rc[i] = c[lane * 4 + i];
  const int k = kind[0];
  if (k == 0) {
    jaxtile::mma_m16n8k16_f16(rd, ra, rb, rc);
  } else if (k == 1) {
    jaxtile::mma_m16n8k16_bf16(rd, ra, rb, rc);
  } else {
    jaxtile::mma_m16n8k8_tf32(rd, ra, rb, rc);
  }
  for (int i = 0; i < 4; ++i) d[lane * 4 + i] = rd[i];
}

// Conversions of x[i] (n values): to f16 and bf16 bits, to tf32 bits, and f16 back to f32.
JT_KERNEL void convert_probe(ptr<const float> x, ptr<uint16_t> h, ptr<uint16_t> bf,
                             ptr<unsigned> tf, ptr<float> back, int n) {
  const int i = jaxtile::block_idx().x * 128 + jaxtile::thread_idx().x;
  if (i >= n) return;
  const float v = x[i];
  const jaxtile::half hv = jaxtile::to_half(v);
  h[i] = hv.bits;
  bf[i] = jaxtile::to_bf16(v).bits;
  tf[i] = jaxtile::to_tf32(v);
  back[i] = jaxtile::to_float(hv);
}
