#include "common/base64.h"

#include <array>
#include <cstdint>

namespace jaxtile {
namespace {

constexpr int8_t kInvalid = -1;

constexpr std::array<int8_t, 256> make_table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = kInvalid;
  constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
  return t;
}

constexpr std::array<int8_t, 256> kTable = make_table();

}  // namespace

bool base64_decode(std::string_view text, std::string* out) {
  if (text.size() % 4 != 0) return false;
  size_t padding = 0;
  while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=') {
    ++padding;
  }
  out->clear();
  out->reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  const size_t digits = text.size() - padding;
  for (size_t i = 0; i < digits; ++i) {
    const int8_t v = kTable[static_cast<unsigned char>(text[i])];
    if (v == kInvalid) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    if (i % 4 == 3) {
      out->push_back(static_cast<char>(acc >> 16));
      out->push_back(static_cast<char>(acc >> 8));
      out->push_back(static_cast<char>(acc));
      acc = 0;
    }
  }
  // The last group holds 2 or 3 digits (1 or 2 bytes); bits past the data must be zero.
  if (padding == 2) {
    if ((acc & 0xf) != 0) return false;
    out->push_back(static_cast<char>(acc >> 4));
  } else if (padding == 1) {
    if ((acc & 0x3) != 0) return false;
    out->push_back(static_cast<char>(acc >> 10));
    out->push_back(static_cast<char>(acc >> 2));
  }
  return true;
}

}  // namespace jaxtile
