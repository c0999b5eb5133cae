// Running a kernel's grid blocks, split across the thread pool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/registry.h"
#include "cpu/thread_pool.h"

namespace jaxtile {

// How run_blocks splits `num_blocks` blocks over `threads` threads: chunk c is blocks
// [bounds[c], bounds[c + 1]), taken in order by whichever thread is free; the chunks shrink
// from 1 / (2 * threads) of the blocks to one block (guided scheduling, see launch.cc). One
// chunk for one thread; {0} for no blocks.
std::vector<int64_t> chunk_bounds(int64_t num_blocks, int threads);

// Runs blocks [begin, end) of `kernel`. `args` holds the full packed argument list; args[0]
// and args[1] (the block range) are filled in here. `host`: the pool of the runtime calling
// (XLA's intra-op pool), whose threads the call borrows unless JAXTILE_NUM_THREADS is set
// (plan_threads); null: jaxtile's own pool. Returns the error message of a failing call or
// of a misaligned buffer, or an empty string.
std::string run_blocks(const Kernel& kernel, TVMFFIAny* args, int32_t num_args, int64_t begin,
                       int64_t end, const HostPool* host = nullptr);

}  // namespace jaxtile
