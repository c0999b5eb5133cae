// The buffers a CPU kernel was compiled for, which the handler checks before every call: the
// kernels are built without TVM's entry assertions (compiler/cpu/tir_emit.py's `build`), so
// this is what stands between a mismatched call and out-of-bounds memory accesses.
//
// Its text (compiler/cpu/lower.py's `entry_signature` writes it; the build cache's record
// and an export's payload carry it) has one entry per buffer, operands then results:
//
//   x:float32[?,128];y:float32[dim0_0,128];out:float32[dim0_0,mod(dim0_0,4)]
//
// a name (for messages), numpy's name of the element type, and the dimensions: a number; `?`,
// a dynamic size the kernel takes from this dimension; or a size expression over the other
// buffers' dimensions (`dim<i>_<j>`, launch_spec.h's grammar), which this one must equal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "common/launch_spec.h"
#include "xla/ffi/api/ffi.h"

namespace jaxtile {

struct Signature {
  // What every call reads is kept apart from the names messages need, so that checking a
  // call touches few cache lines: between two calls of a small kernel the rest of the process
  // evicts them, and each miss costs about what the check computes.
  struct Buffer {
    xla::ffi::DataType dtype;
    uint32_t rank;
    size_t first_dim;  // its dimensions are dims[first_dim, first_dim + rank)
  };
  struct Dim {
    enum Kind : uint8_t { kFixed, kDynamic, kExpr };
    Kind kind;
    int64_t value;  // kFixed: the size; kExpr: the index in `exprs`
  };
  std::vector<Buffer> buffers;
  std::vector<Dim> dims;
  std::vector<SizeExpr> exprs;
  std::vector<std::string> names;  // per buffer
};

// Throws std::invalid_argument saying what is wrong with `text`.
Signature parse_signature(std::string_view text);

// The kernel computes its dynamic sizes in int32 (compiler/cpu/lower.py's size variables).
inline constexpr int64_t kMaxDynamicSize = std::numeric_limits<int32_t>::max();

// Whether buffer `i` of a call has the element type, the rank and the fixed sizes `s` says,
// and its dynamic sizes fit int32: what the handler checks while it packs the buffers. The
// size expressions (`s.exprs`) need all buffers and are check_call's.
inline bool buffer_fits(const Signature& s, size_t i, xla::ffi::DataType type,
                        const int64_t* dims, size_t rank) {
  const Signature::Buffer& b = s.buffers[i];
  if (type != b.dtype || rank != b.rank) return false;
  const Signature::Dim* want = s.dims.data() + b.first_dim;
  for (size_t d = 0; d < rank; ++d) {
    if (want[d].kind == Signature::Dim::kFixed ? dims[d] != want[d].value
                                               : dims[d] > kMaxDynamicSize) {
      return false;
    }
  }
  return true;
}

// "" if buffers of these element types and dimensions (`num_buffers` of each) fit `s`, else
// which one does not and how, for a message that names the kernel first. Allocates nothing
// unless it fails.
std::string check_call(const Signature& s, const xla::ffi::DataType* types,
                       const BufferDims* dims, size_t num_buffers);

}  // namespace jaxtile
