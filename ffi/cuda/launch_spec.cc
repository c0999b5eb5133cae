#include "cuda/launch_spec.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace jaxtile::cuda {
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

LaunchSpec parse_launch(std::string_view text) {
  const auto parts = split(text, ';');
  if (parts.size() != 4) bad(text, "expected grid, block, smem and params");
  LaunchSpec spec;
  spec.grid = dims(text, field(text, parts[0], "grid"));
  spec.block = dims(text, field(text, parts[1], "block"));
  spec.dynamic_smem = number<unsigned>(text, field(text, parts[2], "smem"));
  for (std::string_view p : split(field(text, parts[3], "params"), ',')) {
    if (!p.empty() && p[0] == 'b') {
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
  return "grid " + d(grid) + ", block " + d(block) + ", " + std::to_string(dynamic_smem) +
         " B dynamic shared memory";
}

}  // namespace jaxtile::cuda
