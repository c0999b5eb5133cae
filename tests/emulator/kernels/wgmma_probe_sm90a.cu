// One warpgroup runs one m64n64k16 wgmma on shared-memory operands the host laid out byte for
// byte (`image`), with the descriptor fields the host chose, and writes every thread's
// accumulator registers and the descriptors out as they are: the layouts are then checked
// against an independent model on the host (tests/emulator/test_hopper_primitives.py).
// params: lbo_a, sbo_a, lbo_b, sbo_b, swizzle bytes, byte offset of A in the image, of B,
// register A (0/1), bf16 (0/1), accumulate onto t * 64 + i (0/1).
#include <jaxtile/device.h>

using jaxtile::ptr;
using jaxtile::u32x4;

constexpr int IMAGE_BYTES = 16384;

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
  jaxtile::fence_proxy_async();
  jaxtile::sync_threads();
  const ptr<unsigned char> bytes = jaxtile::ptr_cast<unsigned char>(img);
  const uint64_t da = jaxtile::wgmma_desc(bytes + params[5], params[0], params[1], params[4]);
  const uint64_t db = jaxtile::wgmma_desc(bytes + params[6], params[2], params[3], params[4]);
  if (t == 0) {
    descs[0] = da;
    descs[1] = db;
  }
  const int accumulate = params[9];
  jaxtile::wgmma_acc<64> acc;
  for (int i = 0; i < 32; ++i) acc[i] = accumulate ? static_cast<float>(t * 64 + i) : 0.0f;
  unsigned a[4];
  for (int j = 0; j < 4; ++j) a[j] = a_regs[t * 4 + j];
  jaxtile::wgmma_fence();
  if (params[7] && params[8]) {
    jaxtile::wgmma_bf16_rs<64>(acc, a, db, accumulate);
  } else if (params[7]) {
    jaxtile::wgmma_f16_rs<64>(acc, a, db, accumulate);
  } else if (params[8]) {
    jaxtile::wgmma_bf16<64>(acc, da, db, accumulate);
  } else {
    jaxtile::wgmma_f16<64>(acc, da, db, accumulate);
  }
  jaxtile::wgmma_commit_group();
  jaxtile::wgmma_wait_group<0>();
  for (int i = 0; i < 32; ++i) out[t * 32 + i] = acc[i];
}
