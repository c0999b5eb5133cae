// Ranges in jax.profiler traces for the CPU thread pool's work.
//
// The XLA FFI gives a handler no way to open a trace range, and XLA's TraceMe is not exported
// from jaxlib, so the runtime is a profiler plugin instead: JAX's
// `_profiler.register_plugin_profiler` takes a PJRT C API whose profiler extension
// (PLUGIN_Profiler_Api: create, start, stop, collect data) it calls around every trace. While
// a trace runs, each chunk of blocks a thread runs is recorded (kernel, thread, start, end);
// when it stops they are handed over as an XSpace plane, "/device:CUSTOM:jaxtile CPU pool",
// with a line per thread and an event per chunk named after the kernel.
#pragma once

#include <cstdint>
#include <string_view>

namespace jaxtile {

// Whether a trace is being recorded (cheap: one relaxed atomic load).
bool tracing();

// Records that the calling thread ran blocks [begin, end) of `kernel` from `start_ns` to now
// (nanoseconds of the realtime clock, as XLA's own trace events).
void record_range(std::string_view kernel, int64_t begin, int64_t end, int64_t start_ns);

// Nanoseconds of the realtime clock.
int64_t trace_now_ns();

// The PJRT_Api (only its struct_size and extension chain are read) that
// `_profiler.register_plugin_profiler` takes, as a pointer.
const void* profiler_pjrt_api();

}  // namespace jaxtile
