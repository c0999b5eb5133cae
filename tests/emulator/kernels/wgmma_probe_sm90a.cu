// One warpgroup runs one m64nNk16 wgmma (N = 64, 128, 256) on shared-memory operands the host
// laid out byte for byte (`image`), with the descriptor fields the host chose, and writes every
// thread's accumulator registers and the descriptors out as they are: the layouts are then
// checked against an independent model on the host (tests/emulator/test_hopper_primitives.py).
// params: lbo_a, sbo_a, lbo_b, sbo_b, swizzle bytes, byte offset of A in the image, of B,
// register A (0/1), bf16 (0/1), accumulate onto t * N + i (0/1), N, B MN-major (0/1: the
// imm-trans-b bit; f16 shared A only).
#include <jaxtile/device.h>

using jaxtile::ptr;
using jaxtile::u32x4;

constexpr int IMAGE_BYTES = 16384;

template <int N>
JT_DEVICE void run_probe(ptr<const unsigned> a_regs, ptr<const int> params, ptr<float> out,
                         uint64_t da, uint64_t db, int t) {
  const int accumulate = params[9];
  jaxtile::wgmma_acc<N> acc;
  for (int i = 0; i < N / 2; ++i) acc[i] = accumulate ? static_cast<float>(t * N + i) : 0.0f;
  unsigned a[4];
  for (int j = 0; j < 4; ++j) a[j] = a_regs[t * 4 + j];
  jaxtile::wgmma_fence();
  if (params[11]) {
    jaxtile::wgmma_f16<N, false, true>(acc, da, db, accumulate);
  } else if (params[7] && params[8]) {
    jaxtile::wgmma_bf16_rs<N>(acc, a, db, accumulate);
  } else if (params[7]) {
    jaxtile::wgmma_f16_rs<N>(acc, a, db, accumulate);
  } else if (params[8]) {
    jaxtile::wgmma_bf16<N>(acc, da, db, accumulate);
  } else {
    jaxtile::wgmma_f16<N>(acc, da, db, accumulate);
  }
  jaxtile::wgmma_commit_group();
  jaxtile::wgmma_wait_group<0>();
  for (int i = 0; i < N / 2; ++i) out[t * (N / 2) + i] = acc[i];
}

JT_KERNEL JT_LAUNCH_BOUNDS(128) void wgmma_probe(ptr<const unsigned> image_words,
                                                 ptr<const unsigned> a_regs, ptr<const int> params,
                                                 ptr<float> out, ptr<uint64_t> descs) {
  const ptr<const u32x4> image = jaxtile::ptr_cast<const u32x4>(image_words);
  // Swizzle patterns repeat every 1024 bytes of the shared window: start the image there.
  const unsigned pad =
      (1024u - jaxtile::smem_u32(jaxtile::dynamic_shared<unsigned char>()) % 1024u) % 1024u;
  JT_SHARED_AT(u32x4, img, IMAGE_BYTES / 16, pad);
  const int t = jaxtile::thread_idx().x;
  for (int i = t; i < IMAGE_BYTES / 16; i += 128) img[i] = image[i];
  jaxtile::fence_proxy_async();  // MUTATE:fence
  jaxtile::sync_threads();
  const ptr<unsigned char> bytes = jaxtile::ptr_cast<unsigned char>(img);
  const uint64_t da = jaxtile::wgmma_desc(bytes + params[5], params[0], params[1], params[4]);
  const uint64_t db = jaxtile::wgmma_desc(bytes + params[6], params[2], params[3], params[4]);
  if (t == 0) {
    descs[0] = da;
    descs[1] = db;
  }
  if (params[10] == 256) {
    run_probe<256>(a_regs, params, out, da, db, t);
  } else if (params[10] == 128) {
    run_probe<128>(a_regs, params, out, da, db, t);
  } else {
    run_probe<64>(a_regs, params, out, da, db, t);
  }
}
