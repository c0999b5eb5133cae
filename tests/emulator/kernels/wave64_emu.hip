// Hand-written wave64 kernels run in the emulator's wave64 mode (tests/emulator/test_hip_emulator.py)
// and compiled for gfx942 by clang from the same text. Lines marked MUTATE:<tag> are edited by
// the mutation tests.
#include <jaxtile/device.h>
using namespace jaxtile;

// One sum per 64-element row, by one wave: xor butterflies over all 64 lanes.
JT_KERNEL JT_LAUNCH_BOUNDS(128) void wave_sums(ptr<const float> x, ptr<float> out) {
  const unsigned wave = block_idx().x * (block_dim().x / kWarpSize) + warp_id();
  const float own = x[wave * kWarpSize + lane_id()];
  float v = own;
  for (int m = kWarpSize / 2; m >= 1; m /= 2) v += shfl_xor(kFullMask, v, m);  // MUTATE:mask
  // shfl_down by 63 brings lane 63's value to lane 0 (the others keep their own); shfl_idx
  // then gives it to every lane.
  const float last = shfl_idx(kFullMask, shfl_down(kFullMask, own, 63), 0);
  if (lane_id() == 0) out[wave] = v;
  if (lane_id() == 1) out[4 + wave] = last;
}

// The 64-bit ballot of x > 0 over one wave, as two 32-bit halves, and its vote_any / vote_all.
JT_KERNEL JT_LAUNCH_BOUNDS(64) void wave_ballot(ptr<const float> x, ptr<unsigned> out) {
  const bool p = x[lane_id()] > 0.0f;
  const unsigned long long bits = ballot(kFullMask, p);
  const bool any = vote_any(kFullMask, p), all = vote_all(kFullMask, p);
  if (lane_id() == 63) {
    out[0] = static_cast<unsigned>(bits);
    out[1] = static_cast<unsigned>(bits >> 32);
    out[2] = any;
    out[3] = all;
  }
}

// D = A B + C with one MFMA: each lane's operand and accumulator registers in, D's out.
JT_KERNEL JT_LAUNCH_BOUNDS(64) void mfma_16x16x16_f16(ptr<const unsigned> ab, ptr<const float> c,
                                                      ptr<float> d) {
  const unsigned l = lane_id();
  const unsigned a[2] = {ab[2 * l], ab[2 * l + 1]};
  const unsigned b[2] = {ab[128 + 2 * l], ab[129 + 2 * l]};
  float acc[4];
  for (int r = 0; r < 4; ++r) acc[r] = c[4 * l + r];
  mfma_f32_16x16x16_f16(acc, a, b, acc);
  for (int r = 0; r < 4; ++r) d[4 * l + r] = acc[r];
}
JT_KERNEL JT_LAUNCH_BOUNDS(64) void mfma_32x32x8_bf16(ptr<const unsigned> ab, ptr<const float> c,
                                                      ptr<float> d) {
  const unsigned l = lane_id();
  const unsigned a[2] = {ab[2 * l], ab[2 * l + 1]};
  const unsigned b[2] = {ab[128 + 2 * l], ab[129 + 2 * l]};
  float acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = c[16 * l + r];
  mfma_f32_32x32x8_bf16(acc, a, b, acc);
  for (int r = 0; r < 16; ++r) d[16 * l + r] = acc[r];
}
// gfx942's xf32: each lane's two float32 A and B operands (their bits in ab).
JT_KERNEL JT_LAUNCH_BOUNDS(64) void mfma_16x16x8_xf32(ptr<const unsigned> ab, ptr<const float> c,
                                                      ptr<float> d) {
  const unsigned l = lane_id();
  const float a[2] = {__builtin_bit_cast(float, unsigned(ab[2 * l])),
                      __builtin_bit_cast(float, unsigned(ab[2 * l + 1]))};
  const float b[2] = {__builtin_bit_cast(float, unsigned(ab[128 + 2 * l])),
                      __builtin_bit_cast(float, unsigned(ab[129 + 2 * l]))};
  float acc[4];
  for (int r = 0; r < 4; ++r) acc[r] = c[4 * l + r];
  mfma_f32_16x16x8_xf32(acc, a, b, acc);
  for (int r = 0; r < 4; ++r) d[4 * l + r] = acc[r];
}
JT_KERNEL JT_LAUNCH_BOUNDS(64) void mfma_32x32x4_xf32(ptr<const unsigned> ab, ptr<const float> c,
                                                      ptr<float> d) {
  const unsigned l = lane_id();
  const float a[2] = {__builtin_bit_cast(float, unsigned(ab[2 * l])),
                      __builtin_bit_cast(float, unsigned(ab[2 * l + 1]))};
  const float b[2] = {__builtin_bit_cast(float, unsigned(ab[128 + 2 * l])),
                      __builtin_bit_cast(float, unsigned(ab[129 + 2 * l]))};
  float acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = c[16 * l + r];
  mfma_f32_32x32x4_xf32(acc, a, b, acc);
  for (int r = 0; r < 16; ++r) d[16 * l + r] = acc[r];
}

// Two waves exchange data through LDS: out[t] = x[127 - t].
JT_KERNEL JT_LAUNCH_BOUNDS(128) void lds_reverse(ptr<const float> x, ptr<float> out) {
  JT_SHARED(float, s, 128);
  const unsigned t = thread_idx().x;
  s[t] = x[t];  // MUTATE:write
  sync_threads();  // MUTATE:barrier
  out[t] = s[127 - t];  // MUTATE:index
}

// Per lane, a 4-byte LDS read of word (lane * stride) % 256 and a 16-byte read of vector
// (lane * stride) % 64 (the bank model).
JT_KERNEL JT_LAUNCH_BOUNDS(64) void lds_stride(ptr<const float> x, ptr<float> out, int stride) {
  JT_SHARED(float, s, 1024);
  const unsigned l = lane_id();
  for (int i = 0; i < 16; ++i) s[16 * l + i] = x[16 * l + i];
  sync_threads();
  const unsigned w = (l * stride) % 256u;
  const float one = s[w];
  const f32x4 four = ptr_cast<f32x4>(s)[(l * stride) % 64u];
  out[l] = one + four.x + four.y + four.z + four.w;
}

// A raw buffer load past the end reads zero.
JT_KERNEL JT_LAUNCH_BOUNDS(64) void buffer_tail(ptr<const float> x, ptr<float> out, int n) {
  const buffer_rsrc r = buffer_resource(x, n * 4);
  out[lane_id()] = buffer_load<float>(r, static_cast<int>(lane_id()) * 4);  // MUTATE:buffer
  wait_vmcnt<0>();
}

// LDS-direct loads (gfx942's global_load_lds_dword): each wave of the block fills its 64
// slots of the LDS tile straight from global memory, waits for them (vmcnt), and after the
// barrier every lane reads a slot another wave filled: out[i] = 2 x[base + 255 - t] where
// both indices are below n (the other outputs are left as they were).
JT_KERNEL JT_LAUNCH_BOUNDS(256) void lds_direct(ptr<const float> x, ptr<float> out, int n) {
  JT_SHARED(float, tile, 256);
  const unsigned t = thread_idx().x;
  const int base = static_cast<int>(block_idx().x) * 256, i = base + static_cast<int>(t);
  if (i < n) lds_direct_load<4>(x + i, tile + warp_id() * kWarpSize);  // MUTATE:lds_slot
  wait_vmcnt<0>();  // MUTATE:lds_wait
  sync_threads();
  const int j = base + 255 - static_cast<int>(t);
  if (i < n && j < n) out[i] = 2.0f * tile[255 - t];
}

// The same through a buffer resource of the n floats: lanes past n load no guard, zeros land.
JT_KERNEL JT_LAUNCH_BOUNDS(256) void lds_direct_buffer(ptr<const float> x, ptr<float> out, int n) {
  JT_SHARED(float, tile, 256);
  const unsigned t = thread_idx().x;
  const int i = static_cast<int>(block_idx().x) * 256 + static_cast<int>(t);
  const buffer_rsrc r = buffer_resource(x, n * 4);  // MUTATE:lds_rsrc
  lds_direct_buffer_load<4>(r, i * 4, tile + warp_id() * kWarpSize);
  wait_vmcnt<0>();
  sync_threads();
  if (i < n) out[i] = tile[255 - t];
}
