// What this machine's CPU can run, in the terms /proc/cpuinfo uses.
#pragma once

#include <string>
#include <unordered_set>

namespace jaxtile {

// The machine architecture as `uname -m` (and Python's platform.machine()) reports it.
const std::string& host_arch();

// The instruction-set flags of the first CPU in /proc/cpuinfo (the "flags" line on x86, the
// "Features" line on Arm), less AMX's where amx_permitted() is false: code with tile
// instructions cannot run in this process then. Null where they cannot be read, so nothing
// can be checked.
const std::unordered_set<std::string>* host_cpu_flags();

// Whether this process may execute AMX tile instructions. On the first call, where the CPU
// has AMX (flag amx_tile), asks Linux for the tile data state
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)), which it grants per process; the
// answer is kept. False where the CPU has no AMX, the kernel refuses (or predates the request:
// Linux < 5.16) or the machine is not x86-64 Linux.
bool amx_permitted();

}  // namespace jaxtile
