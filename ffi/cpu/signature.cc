#include "cpu/signature.h"

#include <charconv>
#include <stdexcept>
#include <utility>

namespace jaxtile {
namespace {

namespace ffi = xla::ffi;

[[noreturn]] void bad(std::string_view text, const std::string& why) {
  throw std::invalid_argument("bad kernel signature '" + std::string(text) + "': " + why);
}

// numpy's names of the element types jaxtile's CPU kernels take.
bool dtype_of(std::string_view name, ffi::DataType* out) {
  static constexpr std::pair<std::string_view, ffi::DataType> kTypes[] = {
      {"bool", ffi::DataType::PRED},          {"int8", ffi::DataType::S8},
      {"int16", ffi::DataType::S16},          {"int32", ffi::DataType::S32},
      {"int64", ffi::DataType::S64},          {"uint8", ffi::DataType::U8},
      {"uint16", ffi::DataType::U16},         {"uint32", ffi::DataType::U32},
      {"uint64", ffi::DataType::U64},         {"float16", ffi::DataType::F16},
      {"float32", ffi::DataType::F32},        {"float64", ffi::DataType::F64},
      {"bfloat16", ffi::DataType::BF16},      {"float8_e4m3fn", ffi::DataType::F8E4M3FN},
      {"float8_e5m2", ffi::DataType::F8E5M2}, {"complex64", ffi::DataType::C64},
      {"complex128", ffi::DataType::C128}};
  for (const auto& [n, t] : kTypes) {
    if (n == name) {
      *out = t;
      return true;
    }
  }
  return false;
}

std::string_view dtype_name(ffi::DataType t) {
  static constexpr std::pair<ffi::DataType, std::string_view> kNames[] = {
      {ffi::DataType::PRED, "bool"},     {ffi::DataType::S8, "int8"},
      {ffi::DataType::S16, "int16"},     {ffi::DataType::S32, "int32"},
      {ffi::DataType::S64, "int64"},     {ffi::DataType::U8, "uint8"},
      {ffi::DataType::U16, "uint16"},    {ffi::DataType::U32, "uint32"},
      {ffi::DataType::U64, "uint64"},    {ffi::DataType::F16, "float16"},
      {ffi::DataType::F32, "float32"},   {ffi::DataType::F64, "float64"},
      {ffi::DataType::BF16, "bfloat16"}, {ffi::DataType::F8E4M3FN, "float8_e4m3fn"},
      {ffi::DataType::F8E5M2, "float8_e5m2"}, {ffi::DataType::C64, "complex64"},
      {ffi::DataType::C128, "complex128"}};
  for (const auto& [t2, n] : kNames) {
    if (t2 == t) return n;
  }
  return "an unsupported type";
}

// Splits at `sep` outside parentheses (a size expression's functions hold commas).
std::vector<std::string_view> split_top(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || (s[i] == sep && depth == 0)) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    } else {
      depth += (s[i] == '(') - (s[i] == ')');
    }
  }
  return parts;
}

std::string shape_text(std::string_view dtype, const int64_t* dims, size_t rank) {
  std::string out(dtype);
  out += '[';
  for (size_t d = 0; d < rank; ++d) out += (d ? "," : "") + std::to_string(dims[d]);
  return out + ']';
}

// The shape buffer `i` must have, as far as the call's other buffers say: fixed sizes, a
// dynamic size as `?` (any), an expression's value (or `?` if it cannot be evaluated).
std::string expected_text(const Signature& s, size_t i, const BufferDims* dims, size_t n) {
  const Signature::Buffer& b = s.buffers[i];
  std::string out = std::string(dtype_name(b.dtype)) + '[';
  for (size_t d = 0; d < b.rank; ++d) {
    const Signature::Dim& dim = s.dims[b.first_dim + d];
    out += d ? "," : "";
    if (dim.kind == Signature::Dim::kFixed) {
      out += std::to_string(dim.value);
    } else if (dim.kind == Signature::Dim::kDynamic) {
      out += '?';
    } else {
      try {
        out += std::to_string(s.exprs[dim.value].eval(dims, n));
      } catch (const std::exception&) {
        out += '?';
      }
    }
  }
  return out + ']';
}

[[gnu::cold, gnu::noinline]] std::string wrong_count(const Signature& s, size_t num_buffers) {
  return "called with " + std::to_string(num_buffers) + " buffers (operands and results) "
         "but compiled for " + std::to_string(s.buffers.size());
}

std::string mismatch(const Signature& s, size_t i, const ffi::DataType* types,
                     const BufferDims* dims, size_t n, const std::string& why) {
  return "argument '" + s.names[i] + "' (buffer #" + std::to_string(i) + ") is " +
         shape_text(dtype_name(types[i]), dims[i].dims, dims[i].rank) +
         " but the kernel was compiled for " + expected_text(s, i, dims, n) + ": " + why;
}

// Which of buffer_fits's conditions buffer `i` fails. Out of line and cold, as are the other
// messages: the checks run on every call, and their code is kept to a few cache lines.
[[gnu::cold, gnu::noinline]] std::string misfit(const Signature& s, size_t i,
                                                const ffi::DataType* types,
                                                const BufferDims* dims, size_t n) {
  const Signature::Buffer& b = s.buffers[i];
  if (types[i] != b.dtype) return mismatch(s, i, types, dims, n, "the element type differs");
  if (dims[i].rank != b.rank) return mismatch(s, i, types, dims, n, "the rank differs");
  for (size_t d = 0; d < b.rank; ++d) {
    const Signature::Dim& dim = s.dims[b.first_dim + d];
    const int64_t got = dims[i].dims[d];
    if (dim.kind == Signature::Dim::kFixed && got != dim.value) {
      return mismatch(s, i, types, dims, n, "dimension " + std::to_string(d) + " differs");
    }
    if (dim.kind != Signature::Dim::kFixed && got > kMaxDynamicSize) {
      return mismatch(s, i, types, dims, n,
                      "dimension " + std::to_string(d) +
                          " exceeds 2^31-1, the largest dynamic size a kernel takes");
    }
  }
  // The conditions above are buffer_fits's; were they ever to drift apart, the call is still
  // refused.
  return mismatch(s, i, types, dims, n, "it does not fit");
}

[[gnu::cold, gnu::noinline]] std::string disagrees(const Signature& s, size_t i,
                                                   const ffi::DataType* types,
                                                   const BufferDims* dims, size_t n, size_t d) {
  return mismatch(s, i, types, dims, n,
                  "dimension " + std::to_string(d) +
                      " does not agree with the sizes of the other buffers");
}

}  // namespace

Signature parse_signature(std::string_view text) {
  Signature s;
  const auto entries = split_top(text, ';');
  for (std::string_view entry : entries) {
    const size_t colon = entry.find(':');
    const size_t open = entry.find('[');
    if (colon == std::string_view::npos || open == std::string_view::npos || open < colon ||
        entry.empty() || entry.back() != ']') {
      bad(text, "expected <name>:<dtype>[<dims>], found '" + std::string(entry) + "'");
    }
    Signature::Buffer b;
    const std::string_view dtype = entry.substr(colon + 1, open - colon - 1);
    if (!dtype_of(dtype, &b.dtype)) {
      bad(text, "element type '" + std::string(dtype) + "' is not one jaxtile passes to kernels");
    }
    b.first_dim = s.dims.size();
    const std::string_view inside = entry.substr(open + 1, entry.size() - open - 2);
    const auto dims = inside.empty() ? std::vector<std::string_view>{} : split_top(inside, ',');
    b.rank = static_cast<uint32_t>(dims.size());
    for (std::string_view d : dims) {
      int64_t value = 0;
      auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), value);
      if (d == "?") {
        s.dims.push_back({Signature::Dim::kDynamic, 0});
      } else if (ec == std::errc() && end == d.data() + d.size() && value >= 0) {
        s.dims.push_back({Signature::Dim::kFixed, value});
      } else {
        try {
          s.exprs.push_back(parse_size_expr(d));
        } catch (const std::invalid_argument& e) {
          bad(text, e.what());
        }
        s.dims.push_back({Signature::Dim::kExpr, static_cast<int64_t>(s.exprs.size() - 1)});
      }
    }
    s.buffers.push_back(b);
    s.names.emplace_back(entry.substr(0, colon));
  }
  // An expression reads dimensions of the call's buffers: each must exist in the signature,
  // which the call's ranks are checked against first.
  for (const SizeExpr& e : s.exprs) {
    for (const SizeExpr::Node& node : e.nodes) {
      if (node.op != SizeExpr::kDim) continue;
      if (static_cast<size_t>(node.a) >= s.buffers.size() || node.b < 0 ||
          static_cast<size_t>(node.b) >= s.buffers[node.a].rank) {
        bad(text, "an expression reads dimension " + std::to_string(node.b) + " of buffer " +
                      std::to_string(node.a) + ", which the signature does not have");
      }
    }
  }
  return s;
}

std::string check_call(const Signature& s, const ffi::DataType* types, const BufferDims* dims,
                       size_t num_buffers) {
  if (num_buffers != s.buffers.size()) return wrong_count(s, num_buffers);
  // Element types, ranks and fixed sizes first: the expressions read the ranks' dimensions.
  for (size_t i = 0; i < num_buffers; ++i) {
    if (!buffer_fits(s, i, types[i], dims[i].dims, dims[i].rank)) {
      return misfit(s, i, types, dims, num_buffers);
    }
  }
  if (s.exprs.empty()) return {};
  for (size_t i = 0; i < num_buffers; ++i) {
    const Signature::Buffer& b = s.buffers[i];
    for (size_t d = 0; d < b.rank; ++d) {
      const Signature::Dim& dim = s.dims[b.first_dim + d];
      if (dim.kind != Signature::Dim::kExpr) continue;
      int64_t want = 0;
      try {
        want = s.exprs[dim.value].eval(dims, num_buffers);
      } catch (const std::invalid_argument&) {
        want = -1;  // a division by a zero size: no shape fits
      }
      if (dims[i].dims[d] != want) return disagrees(s, i, types, dims, num_buffers, d);
    }
  }
  return {};
}

}  // namespace jaxtile
