// One TMA tensor load (3-D; a 2-D tensor is one with a last extent of 1) of the box at
// (c0, c1, c2) into shared memory, completing on an mbarrier, then the tile's bytes out as
// they lie in shared memory (swizzle included), and a TMA store of the tile through
// `map_back` (the same box and swizzle over `back`) at the same coordinates: checked against
// an independent model on the host (tests/emulator/test_hopper_primitives.py).
// args: c0, c1, c2, the box's bytes.
#include <jaxtile/device.h>

using jaxtile::ptr;
using jaxtile::u32x4;

constexpr int TILE_BYTES = 16384;

JT_KERNEL JT_LAUNCH_BOUNDS(128) void tma_probe(ptr<const uint8_t> map, ptr<const int> args,
                                               ptr<const uint16_t> src, ptr<unsigned> out_words,
                                               ptr<const uint8_t> map_back, ptr<uint16_t> back) {
  const ptr<u32x4> out = jaxtile::ptr_cast<u32x4>(out_words);
  JT_SHARED(uint64_t, bar, 1);
  const unsigned pad =
      (1024u - jaxtile::smem_u32(jaxtile::dynamic_shared<unsigned char>()) % 1024u) % 1024u;
  JT_SHARED_AT(u32x4, tile, TILE_BYTES / 16, pad);
  const int t = jaxtile::thread_idx().x;
  if (t == 0) {
    jaxtile::mbarrier_init(bar, 1);
    jaxtile::fence_mbarrier_init();
  }
  jaxtile::sync_threads();
  if (t == 0) {
    jaxtile::mbarrier_arrive_expect_tx(bar, args[3]);
    jaxtile::tma_load_3d(tile, jaxtile::ptr_cast<const jaxtile::tensor_map>(map), bar, args[0],
                         args[1], args[2]);
  }
  jaxtile::mbarrier_wait_parity(bar, 0);
  for (int i = t; i < args[3] / 16; i += 128) out[i] = tile[i];
  // TMA wrote the tile (async proxy): the store reads it with no proxy fence needed.
  if (t == 0) {
    jaxtile::tma_store_3d(jaxtile::ptr_cast<const jaxtile::tensor_map>(map_back), tile, args[0],
                          args[1], args[2]);
    jaxtile::bulk_commit_group();
    jaxtile::bulk_wait_group<0>();
  }
}
