// What this machine's CPU can run, in the terms /proc/cpuinfo uses.
#pragma once

#include <string>
#include <unordered_set>

namespace jaxtile {

// The machine architecture as `uname -m` (and Python's platform.machine()) reports it.
const std::string& host_arch();

// The instruction-set flags of the first CPU in /proc/cpuinfo (the "flags" line on x86, the
// "Features" line on Arm). Null where they cannot be read, so nothing can be checked.
const std::unordered_set<std::string>* host_cpu_flags();

}  // namespace jaxtile
