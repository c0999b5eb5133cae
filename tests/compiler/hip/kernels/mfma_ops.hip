// Each MFMA wrapper of the device header once, for tests/compiler/hip/test_hip_device.py.
#include <jaxtile/device.h>
using namespace jaxtile;

JT_KERNEL JT_LAUNCH_BOUNDS(64) void mfma_ops(ptr<const unsigned> ab, ptr<const float> abf,
                                            ptr<float> out) {
  const unsigned l = lane_id();
  const unsigned a[2] = {ab[2 * l], ab[2 * l + 1]};
  const unsigned b[2] = {ab[128 + 2 * l], ab[129 + 2 * l]};
  float big[16] = {}, small[4] = {};
  mfma_f32_32x32x8_f16(big, a, b, big);
  mfma_f32_32x32x8_bf16(big, a, b, big);
  mfma_f32_16x16x16_f16(small, a, b, small);
  mfma_f32_16x16x16_bf16(small, a, b, small);
#if defined(__gfx942__)
  const float af[2] = {abf[2 * l], abf[2 * l + 1]};
  const float bf[2] = {abf[128 + 2 * l], abf[129 + 2 * l]};
  mfma_f32_32x32x4_xf32(big, af, bf, big);
  mfma_f32_16x16x8_xf32(small, af, bf, small);
#endif
  for (int r = 0; r < 16; ++r) out[16 * l + r] = big[r];
  for (int r = 0; r < 4; ++r) out[1024 + 4 * l + r] = small[r];
}
