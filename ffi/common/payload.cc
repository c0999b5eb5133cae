#include "common/payload.h"

#include <charconv>
#include <utility>

#include "common/base64.h"
#include "common/sha256.h"

namespace jaxtile {

PayloadError payload_error(std::string_view key, const std::string& name,
                           const std::string& why) {
  const std::string kernel =
      name.empty() ? "an exported kernel" : "the exported kernel '" + name + "'";
  return PayloadError("jaxtile: cannot run " + kernel + " (key " +
                      std::string(key.substr(0, 16)) + "...): " + why);
}

namespace {

constexpr std::string_view kMagic = "jaxtile-kernel-payload";

// Reads a payload line by line, with errors that name the kernel being called.
class Reader {
 public:
  Reader(std::string_view key, std::string_view text) : key_(key), text_(text) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw payload_error(key_, name_, "its embedded payload " + why);
  }

  void set_name(std::string name) { name_ = std::move(name); }

  // The next line, without its newline; fails at the end of the text.
  std::string_view line(std::string_view what) {
    const size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) {
      fail("is malformed: it ends before its " + std::string(what));
    }
    std::string_view l = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return l;
  }

  // The value of the next line, which must read `<field>=<value>`.
  std::string_view field(std::string_view field) {
    std::string_view l = line(field);
    if (l.size() <= field.size() || l.substr(0, field.size()) != field ||
        l[field.size()] != '=') {
      fail("is malformed: expected the field '" + std::string(field) + "', found '" +
           std::string(l.substr(0, 40)) + "'");
    }
    return l.substr(field.size() + 1);
  }

  int64_t integer(std::string_view field_name) {
    std::string_view v = field(field_name);
    int64_t n = -1;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || n < 0) {
      fail("is malformed: field '" + std::string(field_name) + "' is not a count");
    }
    return n;
  }

  size_t position() const { return pos_; }
  std::string_view rest() const { return text_.substr(pos_); }

 private:
  std::string_view key_;
  std::string_view text_;
  size_t pos_ = 0;
  std::string name_;
};

std::vector<std::string> split_commas(std::string_view list) {
  std::vector<std::string> items;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    items.emplace_back(list.substr(0, comma));
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return items;
}

// Checks what every format shares: the magic line, the checksum over the header and the
// decoded artifact, the platform (a GPU payload's fourth line, `platform=<platform>`, in
// every format; `platform` is empty for a CPU payload, which has none) and the format
// number, which must not be above `newest`; leaves `r` after those lines.
std::string open_payload(Reader& r, std::string_view text, std::string_view platform,
                         int newest, int* format, std::string* version) {
  if (text.empty()) r.fail("is empty");
  const bool has_magic = text.substr(0, kMagic.size()) == kMagic &&
                         text.substr(kMagic.size(), 1) == "\n";
  if (!has_magic) {
    r.fail("is not a jaxtile kernel payload (bad header): the exported program was altered");
  }
  // Integrity first: a damaged field (the format digit included) must read as damage, not
  // as a payload from a newer jaxtile. In every format the header ends with the sha256
  // line, which covers every byte before it and the decoded artifact after it.
  const size_t sha_at = text.find("\nsha256=");
  if (sha_at == std::string_view::npos) r.fail("is malformed: it has no checksum line");
  const size_t header_size = sha_at + 1;
  const size_t sha_end = text.find('\n', header_size);
  if (sha_end == std::string_view::npos) r.fail("is malformed: it ends in its checksum line");
  const std::string_view expected_sha =
      text.substr(header_size + 7, sha_end - header_size - 7);
  // The kernel's name, unverified yet but worth showing in a message about damage.
  if (const size_t at = text.substr(0, sha_at).find("\nname="); at != std::string_view::npos) {
    const size_t begin = at + 6;
    r.set_name(std::string(text.substr(begin, text.find('\n', begin) - begin)));
  }
  std::string artifact;
  if (!base64_decode(text.substr(sha_end + 1), &artifact)) {
    r.fail("is corrupted: its library is not valid base64 (the exported program was altered)");
  }
  Sha256 sha;
  sha.update(text.substr(0, header_size));
  sha.update(artifact);
  if (sha.hex_digest() != expected_sha) {
    r.fail("is corrupted: checksum mismatch (the exported program was altered or damaged)");
  }
  r.line("header");
  const int64_t n = r.integer("format");
  *version = std::string(r.field("jaxtile"));
  // Before the format: another platform's payload is no newer payload of this one.
  if (!platform.empty() && r.field("platform") != platform) {
    r.fail("is not a " + std::string(platform == "cuda" ? "CUDA" : "ROCm") +
           " kernel's payload");
  }
  if (n > newest) {
    r.fail("was made by a newer jaxtile (jaxtile " + *version + ", payload format " +
           std::to_string(n) + "; this jaxtile reads formats up to " +
           std::to_string(newest) + "): upgrade jaxtile to run this exported program");
  }
  if (n < 1) r.fail("is malformed: format " + std::to_string(n) + " does not exist");
  *format = static_cast<int>(n);
  return artifact;
}

// The checks after the last field: nothing else before the checksum, the size, the key.
void close_payload(Reader& r, std::string_view text, std::string_view key,
                   const std::string& payload_key, size_t artifact_size, int64_t size) {
  if (r.position() != text.find("\nsha256=") + 1) {
    r.fail("is malformed: unexpected fields after 'size'");
  }
  if (static_cast<int64_t>(artifact_size) != size) {
    r.fail("is corrupted: its library has " + std::to_string(artifact_size) +
           " bytes where the header says " + std::to_string(size));
  }
  if (payload_key != key) {
    r.fail("belongs to another kernel (key " + payload_key.substr(0, 16) +
           "...): the exported program was altered");
  }
}

}  // namespace

Payload decode_payload(std::string_view key, std::string_view text) {
  Reader r(key, text);
  Payload p;
  p.library = open_payload(r, text, "", kPayloadFormat, &p.format, &p.jaxtile_version);
  p.key = std::string(r.field("key"));
  p.name = std::string(r.field("name"));
  r.set_name(p.name);
  p.symbol = std::string(r.field("symbol"));
  p.num_blocks = r.integer("num_blocks");
  p.alignment = r.integer("alignment");
  p.arch = std::string(r.field("arch"));
  p.isa = split_commas(r.field("isa"));
  if (p.format >= 2) {
    p.signature = std::string(r.field("signature"));
    if (p.signature.empty()) r.fail("is malformed: its kernel signature is empty");
  }
  const int64_t size = r.integer("size");
  close_payload(r, text, key, p.key, p.library.size(), size);
  if (p.num_blocks < 1 || p.alignment < 1 || (p.alignment & (p.alignment - 1)) != 0) {
    r.fail("is malformed: num_blocks must be positive and alignment a power of two");
  }
  return p;
}

CudaPayload decode_cuda_payload(std::string_view key, std::string_view text) {
  Reader r(key, text);
  CudaPayload p;
  p.cubin = open_payload(r, text, "cuda", kCudaPayloadFormat, &p.format, &p.jaxtile_version);
  p.key = std::string(r.field("key"));
  p.name = std::string(r.field("name"));
  r.set_name(p.name);
  p.symbol = std::string(r.field("symbol"));
  p.arch = std::string(r.field("arch"));
  p.launch = std::string(r.field("launch"));
  const int64_t ptx_size = r.integer("ptx_size");
  const int64_t size = r.integer("size");
  close_payload(r, text, key, p.key, p.cubin.size(), size);
  if (ptx_size > size) r.fail("is malformed: its PTX is larger than the whole artifact");
  p.ptx = p.cubin.substr(static_cast<size_t>(size - ptx_size));
  p.cubin.resize(static_cast<size_t>(size - ptx_size));
  return p;
}

HipPayload decode_hip_payload(std::string_view key, std::string_view text) {
  Reader r(key, text);
  HipPayload p;
  std::string artifact = open_payload(r, text, "rocm", kHipPayloadFormat, &p.format,
                                      &p.jaxtile_version);
  if (p.format < kHipPayloadFormat) {
    r.fail("was made by an older jaxtile (jaxtile " + p.jaxtile_version + ", ROCm payload " +
           "format " + std::to_string(p.format) + ", one code object) in a format this " +
           "jaxtile no longer reads (it reads format " + std::to_string(kHipPayloadFormat) +
           ": a code object per architecture): export the program again with this jaxtile");
  }
  p.key = std::string(r.field("key"));
  p.name = std::string(r.field("name"));
  r.set_name(p.name);
  const int64_t count = r.integer("code_objects");
  if (count < 1) r.fail("is malformed: it has no code object");
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    HipCodeObject& c = p.code_objects.emplace_back();
    c.arch = std::string(r.field("arch"));
    c.symbol = std::string(r.field("symbol"));
    c.launch = std::string(r.field("launch"));
    sizes.push_back(r.integer("size"));
    // Bounded one by one, so that the sum close_payload compares cannot overflow.
    if (sizes.back() > static_cast<int64_t>(artifact.size())) {
      r.fail("is corrupted: its " + c.arch + " code object is larger than the whole artifact");
    }
    total += sizes.back();
  }
  close_payload(r, text, key, p.key, artifact.size(), total);
  size_t at = 0;
  for (size_t i = 0; i < p.code_objects.size(); ++i) {
    p.code_objects[i].code_object = artifact.substr(at, static_cast<size_t>(sizes[i]));
    at += static_cast<size_t>(sizes[i]);
  }
  return p;
}

const HipCodeObject* HipPayload::for_arch(std::string_view arch) const {
  for (const HipCodeObject& c : code_objects) {
    if (c.arch == arch) return &c;
  }
  return nullptr;
}

std::string HipPayload::archs() const {
  std::string list;
  for (const HipCodeObject& c : code_objects) list += (list.empty() ? "" : ", ") + c.arch;
  return list;
}

}  // namespace jaxtile
