// Shared-memory bank conflicts, counted per source line: the accesses lanes of a warp make
// at one line between two points where the warp is known to be converged form one
// instruction, whose wavefronts are counted as the hardware serves them.
#include <algorithm>
#include <utility>
#include <vector>

#include "block.h"

namespace jaxtile {
namespace emu {

void count_banks(BankAccess* accesses, size_t n, uint32_t warp_size) {
  if (n == 0) return;
  // A warp's access is split into phases of 128 bytes' worth of lanes (32 lanes for 4-byte
  // accesses, 16 for 8-byte, 8 for 16-byte); a phase takes as many wavefronts as the largest
  // number of distinct 4-byte words one bank must deliver in it. NVIDIA's 32 banks of 4
  // bytes and AMD's LDS (compiler/hip/lds.py: 32 banks of 4 bytes, 128 bytes a cycle, a
  // wave64 access in phases of 128 // width lanes) follow the same rule; a 64-lane wave
  // just has twice the phases.
  uint32_t bytes = 0;
  for (size_t i = 0; i < n; ++i) bytes = std::max(bytes, accesses[i].bytes);
  const uint32_t lanes_per_phase = bytes <= 4 ? 32 : 128 / bytes;
  uint64_t wavefronts = 0, ideal = 0;
  for (uint32_t p = 0; p < warp_size / lanes_per_phase; ++p) {
    uint64_t words[32][16];
    int nwords[32] = {};
    int worst = 0;
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      const BankAccess& a = accesses[i];
      if (a.lane / lanes_per_phase != p) continue;
      any = true;
      for (uint64_t word = a.offset / 4; word <= (a.offset + a.bytes - 1) / 4; ++word) {
        const int bank = static_cast<int>(word % 32);
        bool seen = false;
        for (int k = 0; k < nwords[bank]; ++k) seen |= words[bank][k] == word;
        if (!seen && nwords[bank] < 16) words[bank][nwords[bank]++] = word;
        worst = std::max(worst, nwords[bank]);
      }
    }
    if (any) {
      wavefronts += static_cast<uint64_t>(worst);
      ++ideal;
    }
  }
  record_banks(accesses[0].line, wavefronts, ideal);
}

void flush_bank_log(Block& b, uint32_t warp) {
  std::vector<std::pair<uint64_t, BankAccess>> keyed;
  const uint32_t ws = b.warp_size;
  for (uint32_t l = 0; l < ws && warp * ws + l < b.nthreads; ++l) {
    std::vector<BankAccess>& log = b.bank_log[warp * ws + l];
    // The k-th access of this lane at a line belongs to instance k of that instruction.
    std::vector<std::pair<uint32_t, uint32_t>> seen;  // (line, count so far)
    for (const BankAccess& a : log) {
      uint32_t k = 0;
      bool found = false;
      for (auto& [line, count] : seen) {
        if (line == a.line) {
          k = count++;
          found = true;
          break;
        }
      }
      if (!found) seen.push_back({a.line, 1});
      keyed.push_back({(static_cast<uint64_t>(a.line) << 32) | k, a});
    }
    log.clear();
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<BankAccess> group;
  for (size_t i = 0; i < keyed.size(); ++i) {
    group.push_back(keyed[i].second);
    if (i + 1 == keyed.size() || keyed[i + 1].first != keyed[i].first) {
      count_banks(group.data(), group.size(), ws);
      group.clear();
    }
  }
}

void log_bank_access(Fiber& f, const char* addr, uint32_t bytes, uint32_t line) {
  Block& b = *f.block;
  std::vector<BankAccess>& log = b.bank_log[f.tid];
  log.push_back({line, f.tid % b.warp_size, static_cast<uint64_t>(addr - b.smem), bytes});
  // A warp that never converges (no collective, no barrier) must not grow without bound.
  if (log.size() >= 4096) flush_bank_log(b, f.tid / b.warp_size);
}

}  // namespace emu
}  // namespace jaxtile
