// Findings of the checks, counters, and the C functions that hand them to Python.
#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

// Where findings go when no launch is running on this CPU thread (a runtime function called
// outside a launch); never destroyed: kernels may run during process exit.
Sink& orphan_sink() {
  static Sink* s = new Sink();
  return *s;
}

// The sink of the kernel whose launch runs on this CPU thread: each kernel keeps its own
// findings, so launches of different kernels running at the same time do not mix them.
thread_local Sink* t_sink = nullptr;

Sink& sink() { return t_sink != nullptr ? *t_sink : orphan_sink(); }

// `spec`'s sink, made on first use (kept for the process's lifetime, like the library).
Sink& sink_of(const KernelSpec* spec) {
  if (spec->settings == nullptr) return orphan_sink();
  static std::mutex made;
  std::lock_guard<std::mutex> lock(made);
  if (spec->settings->sink == nullptr) spec->settings->sink = new Sink();
  return *static_cast<Sink*>(spec->settings->sink);
}

// Adds this CPU thread's counters to `s`.
void flush_counters_to(Sink& s) {
  std::lock_guard<std::mutex> lock(s.mu);
  for (int i = 0; i < kNumCounters; ++i) {
    s.counters[i] += t_counters[i];
    t_counters[i] = 0;
  }
  s.counters[kNumCounters] += t_accesses;
  t_accesses = 0;
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

void flush_counters() { flush_counters_to(sink()); }

void use_reports_of(const KernelSpec* spec) {
  t_sink = spec != nullptr ? &sink_of(spec) : nullptr;
}

void use_fresh_reports() { t_sink = new Sink(); }

std::string export_reports() {
  Sink& s = sink();
  flush_counters_to(s);
  std::lock_guard<std::mutex> lock(s.mu);
  std::string out;
  std::vector<const std::string*> keys(s.findings.size());
  for (const auto& [key, i] : s.index) keys[i] = &key;
  for (size_t i = 0; i < s.findings.size(); ++i) {
    const Finding& f = s.findings[i];
    std::string message = f.message;
    std::replace(message.begin(), message.end(), '\n', ' ');
    out += "F\t" + std::to_string(static_cast<int>(f.severity)) + "\t" +
           std::to_string(f.count) + "\t" + *keys[i] + "\t" + message + "\n";
  }
  out += "D\t" + std::to_string(s.dropped) + "\n";
  for (const auto& [line, b] : s.banks) {
    out += "B\t" + std::to_string(line) + "\t" + std::to_string(b.instructions) + "\t" +
           std::to_string(b.wavefronts) + "\t" + std::to_string(b.ideal) + "\n";
  }
  for (int i = 0; i <= kNumCounters; ++i) {
    out += "C\t" + std::to_string(i) + "\t" + std::to_string(s.counters[i]) + "\n";
  }
  return out;
}

void import_reports(const std::string& text) {
  Sink& s = sink();
  std::lock_guard<std::mutex> lock(s.mu);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty()) continue;
    // Tab-separated; a finding's message, the last field, may hold tabs itself.
    const size_t fields = line[0] == 'F' ? 5 : line[0] == 'B' ? 5 : line[0] == 'C' ? 3 : 2;
    std::vector<std::string> f;
    size_t a = 0;
    while (f.size() + 1 < fields) {
      const size_t tab = line.find('\t', a);
      if (tab == std::string::npos) break;
      f.push_back(line.substr(a, tab - a));
      a = tab + 1;
    }
    f.push_back(line.substr(a));
    if (f.size() != fields) continue;
    const auto num = [&](size_t i) { return std::strtoull(f[i].c_str(), nullptr, 10); };
    if (f[0] == "F") {
      // Under the finding's own key: the same finding from workers of different blocks is
      // counted once, as in a launch that is not isolated.
      const std::string& key = f[3];
      auto it = s.index.find(key);
      if (it != s.index.end()) {
        s.findings[it->second].count += num(2);
      } else if (s.findings.size() >= kMaxFindings) {
        s.dropped += num(2);
      } else {
        s.index.emplace(key, s.findings.size());
        s.findings.push_back({num(1) != 0 ? kError : kWarning, f[4], num(2)});
      }
    } else if (f[0] == "D") {
      s.dropped += num(1);
    } else if (f[0] == "B") {
      BankStat& bank = s.banks[static_cast<uint32_t>(num(1))];
      bank.instructions += num(2);
      bank.wavefronts += num(3);
      bank.ideal += num(4);
    } else if (f[0] == "C" && num(1) <= kNumCounters) {
      s.counters[num(1)] += num(2);
    }
  }
}

std::string thread_name(const Block& b, uint32_t tid) {
  char buf[96];
  if (tid == UINT32_MAX) {
    snprintf(buf, sizeof buf, "(%u,%u,%u)", b.bidx.x, b.bidx.y, b.bidx.z);
    return buf;
  }
  const Fiber& f = b.fibers[tid];
  // AMD calls its 64-lane warps waves.
  snprintf(buf, sizeof buf, "thread (%u,%u,%u) [%s %u lane %u] of block (%u,%u,%u)",
           f.tidx.x, f.tidx.y, f.tidx.z, b.warp_size == 64 ? "wave" : "warp",
           tid / b.warp_size, tid % b.warp_size, b.bidx.x, b.bidx.y, b.bidx.z);
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

extern "C" char** environ;

uint32_t source_line_of(const void* pc) {
  Dl_info info;
  if (pc == nullptr || dladdr(pc, &info) == 0 || info.dli_fname == nullptr) return 0;
  // A return address: the call is the instruction before it.
  char offset[32];
  snprintf(offset, sizeof offset, "0x%zx",
           static_cast<size_t>(static_cast<const char*>(pc) - 1 -
                               static_cast<const char*>(info.dli_fbase)));
  int fds[2];
  if (pipe(fds) != 0) return 0;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  char* argv[] = {const_cast<char*>("addr2line"), const_cast<char*>("-e"),
                  const_cast<char*>(info.dli_fname), offset, nullptr};
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, "addr2line", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string out;
  char buf[256];
  ssize_t n;
  while (rc == 0 && (n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, n);
  close(fds[0]);
  if (rc != 0) return 0;
  int status = 0;
  waitpid(pid, &status, 0);
  // "path/kernel.cu:12" or "path/kernel.cu:12 (discriminator 1)"; "??:0" when unknown.
  const size_t colon = out.rfind(':', out.find(' ') == std::string::npos ? out.size()
                                                                          : out.find(' '));
  if (colon == std::string::npos) return 0;
  return static_cast<uint32_t>(std::strtoul(out.c_str() + colon + 1, nullptr, 10));
}

// The JSON fields: findings [{severity, count, message}], dropped, bank_conflicts [{line,
// instructions, wavefronts, ideal_wavefronts}], counters {shared_accesses_checked,
// warp_collectives, blocks, memory_accesses}. A caller may ask for the size with cap = 0.
size_t take_report(const KernelSpec* spec, char* buf, size_t cap) {
  Sink& s = sink_of(spec);
  flush_counters_to(s);
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

}  // namespace emu
}  // namespace jaxtile
