// Named barriers split a block (PTX ISA, "bar, barrier": 16 barriers per CTA, ids 0..15; a
// thread count that is a multiple of the warp size, non-zero for bar.arrive; bar.arrive signals
// without waiting, bar.sync waits until the count has arrived).
//
// 256 threads: warps 0-3 (threads 0-127) are producers, warps 4-7 consumers. In each of ROUNDS
// rounds a producer writes its slot of `buf` and arrives on barrier 1 (count 256); consumers
// wait there, read the slot mirrored across the buffer, add the round, and meet on barrier 2
// (consumers only, count 128) before arriving on barrier 3 (count 256), on which the producers
// wait before overwriting `buf` in the next round (so the last round releases nothing).
#include <jaxtile/device.h>

using jaxtile::ptr;

constexpr int ROUNDS = 3;

JT_KERNEL JT_LAUNCH_BOUNDS(256) void named_barriers(ptr<const float> x, ptr<float> y) {
  JT_SHARED(float, buf, 128);
  JT_SHARED(float, total, 128);
  const unsigned tid = jaxtile::thread_idx().x;
  if (tid >= 128) total[tid - 128] = 0.0f;
  for (int r = 0; r < ROUNDS; ++r) {
    if (tid < 128) {
      if (r > 0) jaxtile::barrier_sync(3, 256);  // MUTATE:refill
      buf[tid] = x[r * 128 + tid];
      jaxtile::barrier_arrive(1, 256);  // MUTATE:arrive
    } else {
      const unsigned c = tid - 128;
      jaxtile::barrier_sync(1, 256);  // MUTATE:wait
      const bool early = false;  // MUTATE:early (release before reading buf)
      if (early && r + 1 < ROUNDS) jaxtile::barrier_arrive(3, 256);
      total[c] += buf[127 - c] + float(r);
      jaxtile::barrier_sync(2, 128);  // MUTATE:consumers
      y[r * 128 + c] = total[(c + 1) % 128];
      if (!early && r + 1 < ROUNDS) jaxtile::barrier_arrive(3, 256);  // MUTATE:release
    }
  }
}
