// Every group of the device header's HIP implementation, for the assembly checks of
// tests/compiler/hip/test_hip_device.py: ids, barriers, LDS (static and dynamic), shuffles, votes,
// atomics, vector loads, ordering, buffer loads, s_waitcnt and conversions; and the math
// functions (hip_math.h) next to them.
#include <jaxtile/device.h>
using namespace jaxtile;

JT_KERNEL JT_LAUNCH_BOUNDS(256) void groups(ptr<float> x, ptr<float> out, ptr<int> counts,
                                           ptr<double> sums, ptr<int64_t> wide,
                                           ptr<unsigned> flag, int n) {
  JT_SHARED(float, tile, 256);
  JT_SHARED_AT(float, scratch, 256, 0);
  const idx3 t = thread_idx(), b = block_idx(), bd = block_dim(), g = grid_dim();
  const unsigned i = b.x * bd.x + t.x;
  const buffer_rsrc r = buffer_resource(x, n * 4);
  // Out-of-range offsets read zero: no mask for the last block.
  float v = buffer_load<float>(r, static_cast<int>(i * 4));
  const f32x2 pair = buffer_load<f32x2>(r, static_cast<int>(i * 8));
  const f32x4 quad = buffer_load<f32x4>(r, static_cast<int>(i * 16));
  wait_vmcnt<0>();
  const f32x4 direct = ptr_cast<f32x4>(x)[t.x];
  v += pair.x + pair.y + quad.x + quad.w + direct.x + direct.y + direct.z + direct.w;
  // cp_async: a whole 16-byte copy, or the part before the end of x and zeros.
  if (t.x < 64)
    cp_async<16>(scratch + 4 * t.x, x + 4 * i, (n - 4 * static_cast<int>(i)) * 4);
  cp_async_commit();
  cp_async_wait<0>();
  tile[t.x] = v;
  scratch[t.x] = v * 2.0f;
  sync_threads();
  v += tile[(t.x + 1) % 256] + scratch[(t.x + 3) % 256];
  wait_lgkmcnt<0>();
  sync_warp();
  // Shuffles: constant xor 1 and 2 (DPP), any lane (ds_bpermute), down, up.
  v += shfl_xor(kFullMask, v, 1);
  v += shfl_xor(kFullMask, v, 2);
  v += shfl_xor(kFullMask, v, static_cast<int>(g.x & 63u));
  v += shfl_down(kFullMask, v, 16) + shfl_up(kFullMask, v, 8) + shfl_idx(kFullMask, v, 5);
  const unsigned long long bits = ballot(kFullMask, v > 0.0f);
  if (vote_any(kFullMask, v > 1.0f) && !vote_all(kFullMask, v > 2.0f)) v += 1.0f;
  v += static_cast<float>(__builtin_popcountll(bits)) + lane_id() + warp_id();
  // Atomics: native, and the compare-and-swap loops of atomics.h.
  atomic_add(counts, 1);
  atomic_max(counts + 1, static_cast<int>(v));
  atomic_min(counts + 2, static_cast<int>(v));
  atomic_exch(counts + 3, static_cast<int>(i));
  atomic_add(out + n, v);
  atomic_max(out + n + 1, v);
  atomic_add(sums, static_cast<double>(v));
  atomic_add(wide, static_cast<int64_t>(i));
  // Ordering between blocks: publish with release, observe with acquire.
  if (t.x == 0) {
    fence();
    store_release(flag, 1u);
  }
  while (load_acquire(flag) == 0u) {
  }
  v += static_cast<float>(volatile_load(flag));
  // 16-bit floats, xf32 rounding and fast exp2.
  const half h = to_half(v);
  const bf16 hb = to_bf16(v);
  v = to_float(h) + to_float(hb) + __builtin_bit_cast(float, to_tf32(v)) + fast_exp2(v) +
      static_cast<float>(pack2(h, h) & 1u);
  if (i < static_cast<unsigned>(n)) out[i] = v;
}

JT_KERNEL void math(ptr<float> x, ptr<double> y) {
  const unsigned i = thread_idx().x;
  x[i] = expf(x[i]) + logf(x[i]) + sinf(x[i]) + powf(x[i], 0.5f) + erfcf(x[i]) +
         atan2f(x[i], 2.0f) + fmodf(x[i], 3.0f) + xla_logistic(x[i]);
  y[i] = exp(y[i]) + log1p(y[i]) + tanh(y[i]) + acosh(y[i]) + pow(y[i], 3.5);
}
