// SHA-256 (FIPS 180-4), for verifying kernel libraries embedded in exported programs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace jaxtile {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view data);
  // Lowercase hex of the digest, as Python's hashlib.sha256().hexdigest(). Call once.
  std::string hex_digest();

 private:
  void compress(const unsigned char* block);

  uint32_t state_[8];
  unsigned char buffer_[64];
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes hashed so far
};

}  // namespace jaxtile
