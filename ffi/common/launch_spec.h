// A GPU kernel's launch configuration (a CUDA cubin's or a HIP code object's: both module
// APIs launch with the same grid, block, shared bytes and parameter array), parsed from the
// text compiler/gpu/launch.py writes:
//
//   grid=4,4,1;block=128,1,1;smem=49152;params=b0,b1,b2,i32:512,f32:0.5
//
// Parameters are the kernel's in order: `b<i>` is the device address of XLA buffer i
// (operands, then results); `<type>:<value>` a scalar constant (i32 i64 u32 u64 f32 f64);
// `dim<i>_<j>` dimension j of buffer i (an int: a dynamic size);
// `tmap<i>:<elem bytes>:<dims>:<box>:<swizzle>` a TMA tensor map (128 bytes, passed by value)
// of buffer i, row-major with `dims` elements and copied in boxes of `box` elements (both
// innermost first, `x`-separated: `72x100`), swizzled by 0, 32, 64 or 128 bytes. A grid extent is a number or
// a size expression over such dimensions (compiler/sizes.py's grammar: + - *, floordiv, mod,
// max, min, rounding towards negative infinity), e.g. `grid=floordiv(dim0_0+7,8),1,1`: the
// kernel has dynamic sizes and the handler computes both from the shapes XLA passes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace jaxtile {

struct Param {
  bool is_buffer;
  // For a buffer, its index; for a scalar, its bytes (little-endian, low bytes first: the
  // driver copies as many as the kernel's parameter has); for a dimension, the buffer's index.
  uint64_t value;
  int32_t dim = -1;  // >= 0: the parameter is dimension `dim` of buffer `value`
  int32_t map = -1;  // >= 0: the parameter is LaunchSpec::tensor_maps[map]
};

// A TMA tensor map parameter: what the vendor's encoder needs besides the buffer's address.
struct TensorMapDesc {
  uint64_t buffer;
  uint32_t elem_bytes;             // 1, 2, 4 or 8
  uint32_t rank;                   // 1..5
  std::array<uint64_t, 5> dims{};  // elements, innermost first
  std::array<uint32_t, 5> box{};   // elements, innermost first
  uint32_t swizzle = 0;            // bytes: 0, 32, 64 or 128
};

// The 128 bytes of a built tensor map (a CUtensorMap), 64-byte aligned as the encoder needs.
struct alignas(64) TensorMapBytes {
  unsigned char bytes[128];
};

// Builds the tensor map `d` of a buffer at `address` into `out`; returns "" or what failed.
using TensorMapEncoder =
    std::function<std::string(const TensorMapDesc& d, void* address, TensorMapBytes* out)>;

// The dimensions of one XLA buffer.
// Trivial (no member initialisers), so that the handlers' inline arrays of these, set before
// they are read, are not zeroed on every call.
struct BufferDims {
  const int64_t* dims;
  size_t rank;
};

// A size expression over buffer dimensions, as a tree in postfix order (the root last).
struct SizeExpr {
  enum Op : uint8_t { kInt, kDim, kAdd, kSub, kMul, kNeg, kFloorDiv, kMod, kMax, kMin };
  struct Node {
    Op op;
    int64_t a = 0, b = 0;  // kInt: a = value; kDim: a = buffer, b = dimension; else children
  };
  std::vector<Node> nodes;  // never empty
  // Throws std::invalid_argument for a dimension the buffers lack or a division by zero.
  int64_t eval(const BufferDims* buffers, size_t num_buffers) const;
};

// One size expression over buffer dimensions (`dim<i>_<j>`), as a grid extent is written;
// throws std::invalid_argument naming `text` if it is not one.
SizeExpr parse_size_expr(std::string_view text);

struct LaunchSpec {
  std::array<unsigned, 3> grid;
  std::array<unsigned, 3> block;
  unsigned dynamic_smem = 0;
  std::vector<Param> params;
  size_t buffers_needed = 0;  // 1 + the largest buffer index used
  // A grid with dynamic sizes: its three extents (then `grid` holds 1s); else empty.
  std::vector<SizeExpr> grid_exprs;
  std::vector<TensorMapDesc> tensor_maps;  // the `tmap` parameters'

  std::string describe() const;  // "grid 4x4x1, block 128x1x1, 49152 B dynamic smem"
};

// Throws std::invalid_argument saying what is wrong with `text`.
LaunchSpec parse_launch(std::string_view text);

// The grid and the parameters' values (buffer addresses, scalars' bytes, dimensions) of a
// launch with these buffers; throws std::invalid_argument when a dimension the launch reads
// is missing or an extent comes out below 0 or above 2^31 - 1. An extent of 0 (an empty
// batch) is a grid of no blocks, which the caller must not launch: CUDA refuses it.
std::array<unsigned, 3> resolve_grid(const LaunchSpec& spec, const BufferDims* dims,
                                     size_t num_buffers);
uint64_t param_value(const Param& p, void* const* buffers, const BufferDims* dims,
                     size_t num_buffers);

// The grid and the parameter array of one launch with these buffers, as cuLaunchKernel and
// hipModuleLaunchKernel read it (a pointer to each parameter's bytes); held on the stack for
// the usual few parameters. Not copyable: the pointers point into the object itself.
class LaunchArgs {
 public:
  // Throws std::invalid_argument as resolve_grid and param_value do, and when a tensor map
  // cannot be built (`encode` says why; null: the backend builds none).
  LaunchArgs(const LaunchSpec& spec, void* const* buffers, const BufferDims* dims,
             size_t num_buffers, const TensorMapEncoder* encode = nullptr);
  LaunchArgs(const LaunchArgs&) = delete;
  LaunchArgs& operator=(const LaunchArgs&) = delete;

  const std::array<unsigned, 3>& grid() const { return grid_; }
  // A grid of no blocks (an empty batch): nothing to launch, and both APIs refuse it.
  bool empty() const { return grid_[0] == 0 || grid_[1] == 0 || grid_[2] == 0; }
  void** pointers() { return pointers_; }

 private:
  static constexpr size_t kInline = 32;
  std::array<unsigned, 3> grid_{};
  uint64_t inline_values_[kInline];
  void* inline_pointers_[kInline];
  std::vector<uint64_t> heap_values_;
  std::vector<void*> heap_pointers_;
  std::vector<TensorMapBytes> maps_;  // sized once: the pointers point into it
  void** pointers_ = inline_pointers_;
};

// The byte alignment the generated GPU code assumes of every buffer it accesses (it reads
// and writes them 16 bytes at a time where the layout allows: compiler/cuda/compile.py's
// ALIGNMENT); rows whose length is only known at launch are accessed by element.
constexpr uintptr_t kBufferAlignment = 16;

// "" if every buffer `spec` passes starts on a multiple of kBufferAlignment bytes, else what
// is wrong, for a message that names the kernel first: a misaligned vector access faults.
std::string misaligned(const LaunchSpec& spec, void* const* buffers);

}  // namespace jaxtile
