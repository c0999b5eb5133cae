// y[b] = sum of x[128 b : 128 b + 128]: a shared-memory tree reduction over one block.
#include <jaxtile/device.h>

using jaxtile::ptr;

JT_KERNEL JT_LAUNCH_BOUNDS(128) void block_sum(ptr<const float> x, ptr<float> y) {
  JT_SHARED(float, buf, 128);
  const int t = jaxtile::thread_idx().x;
  buf[t] = x[jaxtile::block_idx().x * 128 + t];
  jaxtile::sync_threads();
  for (int s = 64; s > 0; s >>= 1) {
    if (t < s) buf[t] += buf[t + s];
    jaxtile::sync_threads();  // MUTATE:deadlock
  }
  if (t == 0) y[jaxtile::block_idx().x] = buf[0];
}
