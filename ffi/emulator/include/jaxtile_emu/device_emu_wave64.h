// The emulator's wave64 additions (-DJAXTILE_WAVE64, the hip-emulator): what device_hip.h
// has and NVIDIA does not, as checked plain C++. Included only at the end of device_emu.h.
#pragma once

#if defined(JAXTILE_WAVE64)

namespace jaxtile {
namespace emu {

inline void mfma_(int kind, float* d, const uint32_t* a, const uint32_t* b, const float* c,
                  uint32_t line) {
  const MmaIn in{a, b, c};
  // Every lane of the wave takes part: a lane that does not arrive is a deadlock report.
  collective(kind, kFullMask, &in, d, 0, line);
}

}  // namespace emu

// ---- MFMA: D = A B + C for one wave, lane layouts as compiler/hip/mfma.py (warp_ops.cc). ----
inline void mfma_f32_32x32x8_f16(float (&d)[16], const unsigned (&a)[2], const unsigned (&b)[2],
                                 const float (&c)[16], uint32_t line = __builtin_LINE()) {
  emu::mfma_(emu::kMfma32x32x8F16, d, a, b, c, line);
}
inline void mfma_f32_16x16x16_f16(float (&d)[4], const unsigned (&a)[2], const unsigned (&b)[2],
                                  const float (&c)[4], uint32_t line = __builtin_LINE()) {
  emu::mfma_(emu::kMfma16x16x16F16, d, a, b, c, line);
}
inline void mfma_f32_32x32x8_bf16(float (&d)[16], const unsigned (&a)[2],
                                  const unsigned (&b)[2], const float (&c)[16],
                                  uint32_t line = __builtin_LINE()) {
  emu::mfma_(emu::kMfma32x32x8Bf16, d, a, b, c, line);
}
inline void mfma_f32_16x16x16_bf16(float (&d)[4], const unsigned (&a)[2],
                                   const unsigned (&b)[2], const float (&c)[4],
                                   uint32_t line = __builtin_LINE()) {
  emu::mfma_(emu::kMfma16x16x16Bf16, d, a, b, c, line);
}
// gfx942's xf32: float32 operands, two k per lane (their bits are what the collective reads).
inline void mfma_f32_32x32x4_xf32(float (&d)[16], const float (&a)[2], const float (&b)[2],
                                  const float (&c)[16], uint32_t line = __builtin_LINE()) {
  uint32_t ab[2][2];
  memcpy(ab[0], a, sizeof a);
  memcpy(ab[1], b, sizeof b);
  emu::mfma_(emu::kMfma32x32x4Xf32, d, ab[0], ab[1], c, line);
}
inline void mfma_f32_16x16x8_xf32(float (&d)[4], const float (&a)[2], const float (&b)[2],
                                  const float (&c)[4], uint32_t line = __builtin_LINE()) {
  uint32_t ab[2][2];
  memcpy(ab[0], a, sizeof a);
  memcpy(ab[1], b, sizeof b);
  emu::mfma_(emu::kMfma16x16x8Xf32, d, ab[0], ab[1], c, line);
}

// ---- buffer loads: a raw buffer of `bytes` bytes at `base`. A load wholly inside it is a
// checked read of the allocation (so a resource larger than its allocation is reported when
// read past the allocation); one wholly at or past `bytes` reads zero, as the hardware's range
// check does; one straddling the end is reported as out of bounds (and reads zero). ----
struct buffer_rsrc {
  const char* base;
  const emu::Region* region;
  uint32_t bytes;
};
template <class T>
buffer_rsrc buffer_resource(ptr<T> base, int bytes) {
  return {reinterpret_cast<const char*>(base.raw()), base.region(), static_cast<uint32_t>(bytes)};
}
template <class T>
T buffer_load(buffer_rsrc r, int byte_offset, uint32_t line = __builtin_LINE()) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16,
                "buffer_load reads 4, 8 or 16 bytes");
  // The offset is unsigned to the hardware: a negative one is far past the end.
  const uint64_t off = static_cast<uint32_t>(byte_offset);
  if (off >= r.bytes) return T{};
  const char* at = r.base + off;
  if (off + sizeof(T) > r.bytes) {
    emu::Region view = *r.region;
    view.base = const_cast<char*>(r.base);
    view.size = r.bytes;
    emu::access_out_of_bounds(&view, at, sizeof(T), emu::kRead, line);
    return T{};
  }
  return emu::Ref<const T>(reinterpret_cast<const T*>(at), r.region, line);
}

// ---- LDS-direct loads (device_hip.h's global_load_lds_dword): lane l's 4 bytes at its own
// `global_src` land at lds_base + 4 l when a wait_vmcnt retires the load. Until then a read
// (or write) of the slot by any lane is a hazard report; the slot's write is the lane's (races
// with accesses not ordered by the wait and a barrier are reported); an out-of-bounds slot or
// source is reported. The hardware takes the LDS base from the wave's first active lane
// (M0 is scalar): the base must be the same for every lane of the wave. ----
#define JT_HAS_LDS_DIRECT_LOAD 1
template <int Bytes, class T, class S>
void lds_direct_load(ptr<S> global_src, ptr<T> lds_base, uint32_t line = __builtin_LINE()) {
  static_assert(Bytes == 4, "lds_direct_load moves 4 bytes per lane (global_load_lds_dword)");
  char* slot = reinterpret_cast<char*>(const_cast<std::remove_const_t<T>*>(lds_base.raw())) +
               static_cast<size_t>(Bytes) * emu::cur_lane();
  emu::lds_direct_load(lds_base.region(), slot, global_src.region(), global_src.raw(), Bytes,
                       line);
}

// ---- LDS-direct loads through a buffer resource (device_hip.h's buffer_load_dword ... lds):
// as lds_direct_load, from `byte_offset` in the resource; an offset at or past its `bytes`
// (unsigned, as for buffer_load) lands zeros and reads nothing. ----
template <int Bytes, class T>
void lds_direct_buffer_load(buffer_rsrc r, int byte_offset, ptr<T> lds_base,
                            uint32_t line = __builtin_LINE()) {
  static_assert(Bytes == 4, "lds_direct_buffer_load moves 4 bytes per lane (buffer_load_dword)");
  char* slot = reinterpret_cast<char*>(const_cast<std::remove_const_t<T>*>(lds_base.raw())) +
               static_cast<size_t>(Bytes) * emu::cur_lane();
  const uint64_t off = static_cast<uint32_t>(byte_offset);
  const bool inside = off + Bytes <= r.bytes;
  if (off < r.bytes && !inside) {   // a dword straddling the end: not made by jaxtile
    emu::Region view = *r.region;
    view.base = const_cast<char*>(r.base);
    view.size = r.bytes;
    emu::access_out_of_bounds(&view, r.base + off, Bytes, emu::kRead, line);
    return;
  }
  emu::lds_direct_load(lds_base.region(), slot, r.region, inside ? r.base + off : r.base,
                       Bytes, line, inside ? Bytes : 0);
}

// ---- s_waitcnt: the emulator's other memory operations complete when issued; vmcnt retires
// LDS-direct loads (all but the lane's newest N) ----
template <int N>
void wait_vmcnt(uint32_t line = __builtin_LINE()) {
  static_assert(0 <= N && N < 64, "vmcnt is 0..63");
  emu::lds_vm_wait(N, line);
}
template <int N>
void wait_lgkmcnt() {
  static_assert(0 <= N && N < 16, "lgkmcnt is 0..15");
}

}  // namespace jaxtile

#endif  // JAXTILE_WAVE64
