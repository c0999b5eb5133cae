// Findings of the checks, counters, and the C functions that hand them to Python.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "block.h"

namespace jaxtile {
namespace emu {

thread_local uint64_t t_counters[kNumCounters] = {};
thread_local uint64_t t_accesses __attribute__((tls_model("initial-exec"))) = 0;

namespace {

// Beyond this many distinct findings, new ones are only counted.
constexpr size_t kMaxFindings = 64;

struct Finding {
  Severity severity;
  std::string message;
  uint64_t count;
};

struct BankStat {
  uint64_t instructions = 0, wavefronts = 0, ideal = 0;
};

struct Sink {
  std::mutex mu;
  std::vector<Finding> findings;
  std::map<std::string, size_t> index;
  uint64_t dropped = 0;
  std::map<uint32_t, BankStat> banks;
  uint64_t counters[kNumCounters + 1] = {};
};

Sink& sink() {
  static Sink* s = new Sink();  // never destroyed: kernels may run during process exit
  return *s;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += '"';
}

}  // namespace

thread_local std::string* t_first_error_ptr = nullptr;
std::string& first_error() {
  if (t_first_error_ptr == nullptr) t_first_error_ptr = new std::string();
  return *t_first_error_ptr;
}

void report(Severity sev, const std::string& key, const std::string& message) {
  if (sev == kError && first_error().empty()) first_error() = message;
  Sink& s = sink();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.index.find(key);
  if (it != s.index.end()) {
    ++s.findings[it->second].count;
    return;
  }
  if (s.findings.size() >= kMaxFindings) {
    ++s.dropped;
    return;
  }
  s.index.emplace(key, s.findings.size());
  s.findings.push_back({sev, message, 1});
}

void record_banks(uint32_t line, uint64_t wavefronts, uint64_t ideal) {
  Sink& s = sink();
  std::lock_guard<std::mutex> lock(s.mu);
  BankStat& b = s.banks[line];
  ++b.instructions;
  b.wavefronts += wavefronts;
  b.ideal += ideal;
}

void flush_counters() {
  Sink& s = sink();
  std::lock_guard<std::mutex> lock(s.mu);
  for (int i = 0; i < kNumCounters; ++i) {
    s.counters[i] += t_counters[i];
    t_counters[i] = 0;
  }
  s.counters[kNumCounters] += t_accesses;
  t_accesses = 0;
}

std::string thread_name(const Block& b, uint32_t tid) {
  char buf[96];
  if (tid == UINT32_MAX) {
    snprintf(buf, sizeof buf, "(%u,%u,%u)", b.bidx.x, b.bidx.y, b.bidx.z);
    return buf;
  }
  const Fiber& f = b.fibers[tid];
  snprintf(buf, sizeof buf, "thread (%u,%u,%u) [warp %u lane %u] of block (%u,%u,%u)",
           f.tidx.x, f.tidx.y, f.tidx.z, tid / 32, tid % 32, b.bidx.x, b.bidx.y, b.bidx.z);
  return buf;
}

std::string describe_threads(const Block&, const std::vector<uint32_t>& tids) {
  std::vector<uint32_t> sorted = tids;
  std::sort(sorted.begin(), sorted.end());
  std::string out = sorted.size() == 1 ? "thread " : "threads ";
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (i != 0) out += ",";
    out += std::to_string(sorted[i]);
    if (j > i) out += "-" + std::to_string(sorted[j]);
    i = j + 1;
  }
  if (sorted.empty()) out += "(none)";
  return out;
}

std::string where(const Block& b, uint32_t line) {
  return std::string(b.spec->file) + ":" + std::to_string(line);
}

}  // namespace emu
}  // namespace jaxtile

using jaxtile::emu::sink;

// Takes the findings, bank statistics and counters gathered since the last call, as JSON.
// Returns the length of the text; copies it (NUL-terminated) only if `cap` is larger, so a
// caller may ask for the size with cap = 0 first. The sink is cleared only by a call that
// copied the text.
extern "C" __attribute__((visibility("default"))) size_t jaxtile_emu_take_report(char* buf,
                                                                                 size_t cap) {
  using namespace jaxtile::emu;
  flush_counters();
  Sink& s = sink();
  std::lock_guard<std::mutex> lock(s.mu);
  std::string out = "{\"findings\": [";
  for (size_t i = 0; i < s.findings.size(); ++i) {
    const Finding& f = s.findings[i];
    if (i != 0) out += ", ";
    out += "{\"severity\": ";
    out += f.severity == kError ? "\"error\"" : "\"warning\"";
    out += ", \"count\": " + std::to_string(f.count) + ", \"message\": ";
    json_string(out, f.message);
    out += "}";
  }
  out += "], \"dropped\": " + std::to_string(s.dropped) + ", \"bank_conflicts\": [";
  bool first = true;
  for (const auto& [line, b] : s.banks) {
    if (!first) out += ", ";
    first = false;
    out += "{\"line\": " + std::to_string(line) +
           ", \"instructions\": " + std::to_string(b.instructions) +
           ", \"wavefronts\": " + std::to_string(b.wavefronts) +
           ", \"ideal_wavefronts\": " + std::to_string(b.ideal) + "}";
  }
  out += "], \"counters\": {\"shared_accesses_checked\": " +
         std::to_string(s.counters[kSharedAccessCount]) +
         ", \"warp_collectives\": " + std::to_string(s.counters[kCollectiveCount]) +
         ", \"blocks\": " + std::to_string(s.counters[kBlockCount]) +
         ", \"memory_accesses\": " + std::to_string(s.counters[kNumCounters]) + "}}";
  if (cap > out.size()) {
    std::memcpy(buf, out.c_str(), out.size() + 1);
    s.findings.clear();
    s.index.clear();
    s.dropped = 0;
    s.banks.clear();
    for (auto& c : s.counters) c = 0;
  }
  return out.size();
}
