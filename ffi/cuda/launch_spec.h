// A cubin's launch configuration, parsed from the text compiler/cuda/launch.py writes:
//
//   grid=4,4,1;block=128,1,1;smem=49152;params=b0,b1,b2,i32:512,f32:0.5
//
// Parameters are the kernel's in order: `b<i>` is the device address of XLA buffer i
// (operands, then results); `<type>:<value>` a scalar constant (i32 i64 u32 u64 f32 f64).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace jaxtile::cuda {

struct Param {
  bool is_buffer;
  // For a buffer, its index; for a scalar, its bytes (little-endian, low bytes first: the
  // driver copies as many as the kernel's parameter has).
  uint64_t value;
};

struct LaunchSpec {
  std::array<unsigned, 3> grid;
  std::array<unsigned, 3> block;
  unsigned dynamic_smem = 0;
  std::vector<Param> params;
  size_t buffers_needed = 0;  // 1 + the largest buffer index used

  std::string describe() const;  // "grid 4x4x1, block 128x1x1, 49152 B dynamic smem"
};

// Throws std::invalid_argument saying what is wrong with `text`.
LaunchSpec parse_launch(std::string_view text);

}  // namespace jaxtile::cuda
