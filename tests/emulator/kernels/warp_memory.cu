// Probes of warp collectives, named barriers, atomics, dynamic shared memory and thread
// coordinates, for the emulator's semantic tests.
#include <jaxtile/device.h>

using jaxtile::kFullMask;
using jaxtile::ptr;

// out[k * 64 + t] for 2 warps: shuffles with this lane's arg[t], then votes on x[t] > 0.
JT_KERNEL void warp_probe(ptr<const int> x, ptr<const int> arg, ptr<int> out) {
  const int t = jaxtile::thread_idx().x;
  const int v = x[t], a = arg[t];
  const bool p = v > 0;
  out[0 * 64 + t] = jaxtile::shfl_xor(kFullMask, v, a);
  out[1 * 64 + t] = jaxtile::shfl_down(kFullMask, v, a);
  out[2 * 64 + t] = jaxtile::shfl_up(kFullMask, v, a);
  out[3 * 64 + t] = jaxtile::shfl_idx(kFullMask, v, a);
  out[4 * 64 + t] = jaxtile::vote_all(kFullMask, p) ? 1 : 0;
  out[5 * 64 + t] = jaxtile::vote_any(kFullMask, p) ? 1 : 0;
  out[6 * 64 + t] = static_cast<int>(jaxtile::ballot(kFullMask, p));
  // Two half-warps shuffle independently with disjoint masks.
  const unsigned half = (t & 16) ? 0xffff0000u : 0x0000ffffu;
  out[7 * 64 + t] = jaxtile::shfl_xor(half, v, 1);
}

// 128 threads in two groups of 64, each synchronised by its own named barrier. Every thread
// writes buf[t], then reads the value of the thread 32 away (mode 0: same group) or 64 away
// (mode 1: the other group, whose writes no barrier orders: a race).
JT_KERNEL void named_groups(ptr<const float> x, ptr<const int> mode, ptr<float> y) {
  JT_SHARED(float, buf, 128);
  const int t = jaxtile::thread_idx().x;
  const int group = t / 64;
  buf[t] = x[t];
  jaxtile::barrier_sync(1 + group, 64);
  const int partner = mode[0] == 0 ? (t ^ 32) : (t ^ 64);
  y[t] = buf[partner];
}

// One warp exchanges neighbours' values through shared memory; with mode 1 a sync_warp orders
// the writes before the reads, with mode 0 nothing does (a race).
JT_KERNEL void warp_exchange(ptr<const float> x, ptr<const int> mode, ptr<float> y) {
  JT_SHARED(float, buf, 32);
  const int t = jaxtile::thread_idx().x;
  buf[t] = x[t];
  if (mode[0] != 0) jaxtile::sync_warp();
  y[t] = buf[t ^ 1];
}

// Global and shared atomics from every thread of every block.
JT_KERNEL void atomics(ptr<float> fsum, ptr<int> isum, ptr<int> imax, ptr<int> per_block) {
  JT_SHARED(int, count, 1);
  const int t = jaxtile::thread_idx().x;
  const int b = jaxtile::block_idx().x;
  if (t == 0) count[0] = 0;
  jaxtile::sync_threads();
  jaxtile::atomic_add(fsum, 0.5f);
  jaxtile::atomic_add(isum, t);
  jaxtile::atomic_max(imax, b * 1000 + t);
  jaxtile::atomic_add(count, 1);
  jaxtile::sync_threads();
  if (t == 0) per_block[b] = count[0];
}

// 3-d blocks and grids: every thread records its coordinates; dynamic shared memory passes
// each thread's linear id to its successor.
JT_KERNEL void coords(ptr<int> out, ptr<int> passed) {
  const jaxtile::idx3 ti = jaxtile::thread_idx(), bi = jaxtile::block_idx();
  const jaxtile::idx3 bd = jaxtile::block_dim(), gd = jaxtile::grid_dim();
  const int n = bd.x * bd.y * bd.z;
  const int t = ti.x + bd.x * (ti.y + bd.y * ti.z);
  const int b = bi.x + gd.x * (bi.y + gd.y * bi.z);
  const ptr<int> dyn = jaxtile::dynamic_shared<int>();
  dyn[t] = t;
  jaxtile::sync_threads();
  out[b * n + t] = ti.x + 10 * ti.y + 100 * ti.z + 1000 * bi.x + 10000 * bi.y + 100000 * bi.z;
  passed[b * n + t] = dyn[(t + 1) % n] + 1000 * static_cast<int>(jaxtile::warp_id()) +
                      100000 * static_cast<int>(jaxtile::lane_id());
}

// Four warps read what warp 0 wrote; warp 1 reads last. Warp 0 then overwrites it after a
// named barrier with warp 1 only: ordered after warp 1's reads but not after warps 2 and 3's.
JT_KERNEL void late_reader(ptr<const float> x, ptr<float> y) {
  JT_SHARED(float, buf, 32);
  const int t = jaxtile::thread_idx().x;
  const int lane = t & 31, warp = t >> 5;
  if (warp == 0) buf[lane] = x[lane];
  jaxtile::sync_threads();
  if (warp == 1) jaxtile::sync_warp();
  const float v = buf[lane];
  if (warp < 2) jaxtile::barrier_sync(1, 64);
  if (warp == 0) buf[lane] = v * 2.0f;
  y[t] = v;
}

// Copies x to y through shared memory with 16-byte vector accesses, swapping neighbouring
// threads' vectors; shift[0] = 1 misaligns every shared vector by 4 bytes.
JT_KERNEL void vectors(ptr<const float> x, ptr<const int> shift, ptr<float> y) {
  JT_SHARED(float, buf, 4 * 32 + 4);
  const int t = jaxtile::thread_idx().x;
  const jaxtile::f32x4 v = jaxtile::ptr_cast<const jaxtile::f32x4>(x)[t];
  const ptr<jaxtile::f32x4> tile = jaxtile::ptr_cast<jaxtile::f32x4>(buf + shift[0]);
  tile[t] = v;
  jaxtile::sync_threads();
  const jaxtile::f32x4 w = tile[t ^ 1];
  jaxtile::ptr_cast<jaxtile::f32x4>(y)[t] = w;
}
