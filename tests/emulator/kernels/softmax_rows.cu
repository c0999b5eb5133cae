// y[r, :] = softmax(x[r, :]) for a rows x n f32 matrix: one warp per row, 4 warps per block,
// row max and row sum reduced with butterfly shuffles.
#include <jaxtile/device.h>
#include <math.h>

using jaxtile::ptr;

JT_KERNEL JT_LAUNCH_BOUNDS(128) void softmax_rows(ptr<const float> x, ptr<float> y, int rows,
                                                  int n) {
  const int lane = jaxtile::lane_id();
  const int row = jaxtile::block_idx().x * 4 + jaxtile::warp_id();
  if (row >= rows) return;  // uniform per warp
  const ptr<const float> xr = x + int64_t(row) * n;
  float m = -INFINITY;
  for (int c = lane; c < n; c += 32) m = fmaxf(m, xr[c]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, jaxtile::shfl_xor(jaxtile::kFullMask, m, o));  // MUTATE:mask
  float s = 0.0f;
  for (int c = lane; c < n; c += 32) s += expf(xr[c] - m);
  for (int o = 16; o > 0; o >>= 1) s += jaxtile::shfl_xor(jaxtile::kFullMask, s, o);
  const float inv = 1.0f / s;
  for (int c = lane; c < n; c += 32) y[int64_t(row) * n + c] = expf(xr[c] - m) * inv;  // MUTATE:oob
}
