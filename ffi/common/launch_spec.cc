#include "common/launch_spec.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace jaxtile {
namespace {

[[noreturn]] void bad(std::string_view text, const std::string& why) {
  throw std::invalid_argument("bad launch configuration '" + std::string(text) + "': " + why);
}

template <typename T>
T number(std::string_view whole, std::string_view v) {
  T n{};
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size()) {
    bad(whole, "'" + std::string(v) + "' is not a number of the right type");
  }
  return n;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  if (s.empty()) return parts;
  while (true) {
    const size_t at = s.find(sep);
    parts.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return parts;
    s.remove_prefix(at + 1);
  }
}

std::string_view field(std::string_view whole, std::string_view part, std::string_view name) {
  if (part.substr(0, name.size()) != name || part.substr(name.size(), 1) != "=") {
    bad(whole, "expected the field '" + std::string(name) + "'");
  }
  return part.substr(name.size() + 1);
}

std::array<unsigned, 3> dims(std::string_view whole, std::string_view v) {
  const auto parts = split(v, ',');
  if (parts.size() != 3) bad(whole, "grid and block need three extents");
  std::array<unsigned, 3> d{};
  for (int i = 0; i < 3; ++i) {
    d[i] = number<unsigned>(whole, parts[i]);
    if (d[i] == 0) bad(whole, "extents must be positive");
  }
  return d;
}

// `dim<i>_<j>`: buffer i, dimension j; false if `p` is not of that form.
bool dim_ref(std::string_view whole, std::string_view p, uint64_t* buffer, int32_t* dim) {
  if (p.substr(0, 3) != "dim") return false;
  const size_t us = p.find('_');
  if (us == std::string_view::npos) bad(whole, "bad dimension '" + std::string(p) + "'");
  *buffer = number<uint64_t>(whole, p.substr(3, us - 3));
  *dim = number<int32_t>(whole, p.substr(us + 1));
  return true;
}

// `tmap<i>:<elem bytes>:<dims>:<box>:<swizzle>` (launch_spec.h).
TensorMapDesc tensor_map(std::string_view whole, std::string_view p) {
  const auto parts = split(p.substr(4), ':');
  if (parts.size() != 5) bad(whole, "bad tensor map '" + std::string(p) + "'");
  TensorMapDesc d;
  d.buffer = number<uint64_t>(whole, parts[0]);
  d.elem_bytes = number<uint32_t>(whole, parts[1]);
  const auto extents = split(parts[2], 'x');
  const auto box = split(parts[3], 'x');
  d.swizzle = number<uint32_t>(whole, parts[4]);
  if (extents.empty() || extents.size() > 5 || box.size() != extents.size() ||
      (d.elem_bytes != 1 && d.elem_bytes != 2 && d.elem_bytes != 4 && d.elem_bytes != 8) ||
      (d.swizzle != 0 && d.swizzle != 32 && d.swizzle != 64 && d.swizzle != 128)) {
    bad(whole, "bad tensor map '" + std::string(p) + "'");
  }
  d.rank = static_cast<uint32_t>(extents.size());
  for (size_t i = 0; i < extents.size(); ++i) {
    d.dims[i] = number<uint64_t>(whole, extents[i]);
    d.box[i] = number<uint32_t>(whole, box[i]);
  }
  return d;
}

// A recursive-descent parser of compiler/sizes.py's grammar into postfix nodes.
class ExprParser {
 public:
  ExprParser(std::string_view whole, std::string_view text) : whole_(whole), s_(text) {}
  SizeExpr parse() {
    sum();
    if (i_ != s_.size()) fail();
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail() { bad(whole_, "bad size expression '" + std::string(s_) + "'"); }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void expect(char c) {
    if (peek() != c) fail();
    ++i_;
  }
  int64_t push(SizeExpr::Op op, int64_t a = 0, int64_t b = 0) {
    out_.nodes.push_back({op, a, b});
    return static_cast<int64_t>(out_.nodes.size()) - 1;
  }
  int64_t sum() {
    int64_t e = product();
    while (peek() == '+' || peek() == '-') {
      const bool add = s_[i_++] == '+';
      const int64_t r = product();
      e = push(add ? SizeExpr::kAdd : SizeExpr::kSub, e, r);
    }
    return e;
  }
  int64_t product() {
    int64_t e = atom();
    while (peek() == '*') {
      ++i_;
      const int64_t r = atom();
      e = push(SizeExpr::kMul, e, r);
    }
    return e;
  }
  int64_t atom() {
    const char c = peek();
    if (c == '-') {
      ++i_;
      const int64_t a = atom();
      return push(SizeExpr::kNeg, a);
    }
    if (c == '(') {
      ++i_;
      const int64_t e = sum();
      expect(')');
      return e;
    }
    size_t j = i_;
    while (j < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[j])) || s_[j] == '_')) {
      ++j;
    }
    const std::string_view word = s_.substr(i_, j - i_);
    if (word.empty()) fail();
    i_ = j;
    if (std::isdigit(static_cast<unsigned char>(word[0]))) {
      return push(SizeExpr::kInt, number<int64_t>(whole_, word));
    }
    uint64_t buffer = 0;
    int32_t dim = 0;
    if (peek() != '(' && dim_ref(whole_, word, &buffer, &dim)) {
      return push(SizeExpr::kDim, static_cast<int64_t>(buffer), dim);
    }
    static constexpr std::pair<std::string_view, SizeExpr::Op> kFunctions[] = {
        {"floordiv", SizeExpr::kFloorDiv}, {"mod", SizeExpr::kMod},
        {"max", SizeExpr::kMax}, {"min", SizeExpr::kMin}};
    for (const auto& [name, op] : kFunctions) {
      if (word != name) continue;
      expect('(');
      const int64_t a = sum();
      expect(',');
      const int64_t b = sum();
      expect(')');
      return push(op, a, b);
    }
    fail();
  }

  std::string_view whole_, s_;
  size_t i_ = 0;
  SizeExpr out_;
};

int64_t floordiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t dimension(const BufferDims* buffers, size_t n, uint64_t buffer, int64_t dim) {
  if (buffer >= n || buffers == nullptr || dim < 0 ||
      static_cast<size_t>(dim) >= buffers[buffer].rank) {
    throw std::invalid_argument("the launch reads dimension " + std::to_string(dim) +
                                " of buffer " + std::to_string(buffer) +
                                ", which the call does not have");
  }
  return buffers[buffer].dims[dim];
}

Param scalar(std::string_view whole, std::string_view p) {
  const size_t colon = p.find(':');
  const std::string_view type = p.substr(0, colon);
  const std::string_view v = colon == std::string_view::npos ? "" : p.substr(colon + 1);
  Param out{false, 0};
  if (type == "i32" || type == "i64") {
    out.value = static_cast<uint64_t>(number<int64_t>(whole, v));
  } else if (type == "u32" || type == "u64") {
    out.value = number<uint64_t>(whole, v);
  } else if (type == "f32" || type == "f64") {
    // strtod: from_chars for doubles is missing from older libstdc++.
    const std::string s(v);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size()) bad(whole, "'" + s + "' is not a float");
    if (type == "f32") {
      const float f = static_cast<float>(d);
      std::memcpy(&out.value, &f, sizeof f);
    } else {
      std::memcpy(&out.value, &d, sizeof d);
    }
  } else {
    bad(whole, "unknown parameter '" + std::string(p) + "'");
  }
  return out;
}

}  // namespace

int64_t SizeExpr::eval(const BufferDims* buffers, size_t num_buffers) const {
  // The values on the stack for the usual small expression: the CPU handler evaluates its
  // kernels' shape checks on every call.
  constexpr size_t kInline = 16;
  int64_t inline_values[kInline];
  std::vector<int64_t> heap;
  int64_t* v = inline_values;
  if (nodes.size() > kInline) {
    heap.resize(nodes.size());
    v = heap.data();
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const int64_t a = n.op >= kAdd ? v[n.a] : 0;
    const int64_t b = n.op >= kAdd && n.op != kNeg ? v[n.b] : 0;
    if ((n.op == kFloorDiv || n.op == kMod) && b == 0) {
      throw std::invalid_argument("a grid extent divides by a zero size");
    }
    switch (n.op) {
      case kInt: v[i] = n.a; break;
      case kDim: v[i] = dimension(buffers, num_buffers, static_cast<uint64_t>(n.a), n.b); break;
      case kAdd: v[i] = a + b; break;
      case kSub: v[i] = a - b; break;
      case kMul: v[i] = a * b; break;
      case kNeg: v[i] = -a; break;
      case kFloorDiv: v[i] = floordiv(a, b); break;
      case kMod: v[i] = a - floordiv(a, b) * b; break;
      case kMax: v[i] = std::max(a, b); break;
      case kMin: v[i] = std::min(a, b); break;
    }
  }
  return v[nodes.size() - 1];
}

std::array<unsigned, 3> resolve_grid(const LaunchSpec& spec, const BufferDims* dims,
                                     size_t num_buffers) {
  if (spec.grid_exprs.empty()) return spec.grid;
  std::array<unsigned, 3> grid{};
  for (int i = 0; i < 3; ++i) {
    const int64_t g = spec.grid_exprs[i].eval(dims, num_buffers);
    if (g < 0 || g > 2147483647) {
      throw std::invalid_argument("grid extent " + std::to_string(i) + " comes out as " +
                                  std::to_string(g) + " for these shapes");
    }
    grid[i] = static_cast<unsigned>(g);
  }
  return grid;
}

uint64_t param_value(const Param& p, void* const* buffers, const BufferDims* dims,
                     size_t num_buffers) {
  if (p.is_buffer) return reinterpret_cast<uint64_t>(buffers[p.value]);
  if (p.dim >= 0) return static_cast<uint64_t>(dimension(dims, num_buffers, p.value, p.dim));
  return p.value;
}

LaunchArgs::LaunchArgs(const LaunchSpec& spec, void* const* buffers, const BufferDims* dims,
                       size_t num_buffers, const TensorMapEncoder* encode) {
  const size_t n = spec.params.size();
  uint64_t* values = inline_values_;
  if (n > kInline) {
    heap_values_.resize(n);
    heap_pointers_.resize(n);
    values = heap_values_.data();
    pointers_ = heap_pointers_.data();
  }
  maps_.resize(spec.tensor_maps.size());
  for (size_t i = 0; i < n; ++i) {
    const Param& p = spec.params[i];
    if (p.map < 0) {
      values[i] = param_value(p, buffers, dims, num_buffers);
      pointers_[i] = &values[i];
      continue;
    }
    const TensorMapDesc& d = spec.tensor_maps[p.map];
    if (encode == nullptr) {
      throw std::invalid_argument("its TMA tensor map of buffer " + std::to_string(d.buffer) +
                                  " cannot be built by this backend");
    }
    if (std::string why = (*encode)(d, buffers[d.buffer], &maps_[p.map]); !why.empty()) {
      throw std::invalid_argument("building the TMA tensor map of buffer " +
                                  std::to_string(d.buffer) + " failed: " + why);
    }
    pointers_[i] = maps_[p.map].bytes;
  }
  grid_ = resolve_grid(spec, dims, num_buffers);
}

std::string misaligned(const LaunchSpec& spec, void* const* buffers) {
  for (const Param& p : spec.params) {
    if (!p.is_buffer) continue;
    const auto address = reinterpret_cast<uintptr_t>(buffers[p.value]);
    if (address % kBufferAlignment == 0) continue;
    char hex[32];
    std::snprintf(hex, sizeof hex, "%#llx", static_cast<unsigned long long>(address));
    return "buffer " + std::to_string(p.value) + " (operands, then results) is at address " +
           hex + ", which is not " + std::to_string(kBufferAlignment) + "-byte aligned: its " +
           "generated code reads and writes buffers in " + std::to_string(kBufferAlignment) +
           "-byte vectors; pass a buffer XLA allocated, not a view at an offset into one";
  }
  return "";
}

SizeExpr parse_size_expr(std::string_view text) { return ExprParser(text, text).parse(); }

LaunchSpec parse_launch(std::string_view text) {
  const auto parts = split(text, ';');
  if (parts.size() != 4) bad(text, "expected grid, block, smem and params");
  LaunchSpec spec;
  const std::string_view grid = field(text, parts[0], "grid");
  if (grid.find_first_not_of("0123456789,") == std::string_view::npos) {
    spec.grid = dims(text, grid);
  } else {
    // Top-level commas separate the extents; the functions' commas are inside parentheses.
    std::vector<std::string_view> extents;
    int depth = 0;
    size_t start = 0;
    for (size_t i = 0; i <= grid.size(); ++i) {
      if (i == grid.size() || (grid[i] == ',' && depth == 0)) {
        extents.push_back(grid.substr(start, i - start));
        start = i + 1;
      } else {
        depth += (grid[i] == '(') - (grid[i] == ')');
      }
    }
    if (extents.size() != 3) bad(text, "grid and block need three extents");
    spec.grid = {1, 1, 1};
    for (std::string_view e : extents) {
      spec.grid_exprs.push_back(ExprParser(text, e).parse());
      for (const SizeExpr::Node& n : spec.grid_exprs.back().nodes) {
        if (n.op == SizeExpr::kDim) {
          spec.buffers_needed = std::max<size_t>(spec.buffers_needed, n.a + 1);
        }
      }
    }
  }
  spec.block = dims(text, field(text, parts[1], "block"));
  spec.dynamic_smem = number<unsigned>(text, field(text, parts[2], "smem"));
  for (std::string_view p : split(field(text, parts[3], "params"), ',')) {
    uint64_t buffer = 0;
    int32_t dim = 0;
    if (dim_ref(text, p, &buffer, &dim)) {
      spec.params.push_back(Param{false, buffer, dim});
      spec.buffers_needed = std::max<size_t>(spec.buffers_needed, buffer + 1);
    } else if (p.substr(0, 4) == "tmap") {
      spec.params.push_back(Param{false, 0, -1, static_cast<int32_t>(spec.tensor_maps.size())});
      spec.tensor_maps.push_back(tensor_map(text, p));
      spec.buffers_needed = std::max<size_t>(spec.buffers_needed,
                                             spec.tensor_maps.back().buffer + 1);
    } else if (!p.empty() && p[0] == 'b') {
      const auto index = number<uint64_t>(text, p.substr(1));
      spec.params.push_back(Param{true, index});
      spec.buffers_needed = std::max<size_t>(spec.buffers_needed, index + 1);
    } else {
      spec.params.push_back(scalar(text, p));
    }
  }
  return spec;
}

std::string LaunchSpec::describe() const {
  auto d = [](const std::array<unsigned, 3>& a) {
    return std::to_string(a[0]) + "x" + std::to_string(a[1]) + "x" + std::to_string(a[2]);
  };
  return "grid " + (grid_exprs.empty() ? d(grid) : std::string("from the shapes")) + ", block " + d(block) + ", " + std::to_string(dynamic_smem) +
         " B dynamic shared memory";
}

}  // namespace jaxtile
