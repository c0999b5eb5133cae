// Stand-ins for the TVM runtime functions that TVM-generated CPU code calls back into.
//
// A kernel library exported by TVM expects its loader to provide these (through global
// function-pointer slots or plain undefined symbols). jaxtile provides its own versions so a
// cached kernel runs without libtvm or libtvm_ffi in the process.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace jaxtile {

struct RuntimeSymbol {
  std::string_view name;
  void* fn;
};

// Every TVM runtime function jaxtile implements, by its C name.
const RuntimeSymbol* runtime_functions(size_t* count);

// jaxtile's implementation of the TVM runtime function `name` (e.g. "TVMBackendAllocWorkspace"),
// or null if it has none. Generated code reaches these either through a pointer slot named
// "__<name>" that the loader fills, or as an undefined symbol `name` resolved at link time.
void* runtime_function(std::string_view name);

// Value stored in "__tvm_ffi__library_ctx"; only ever handed back to our own lookup stub.
void* library_context();

// Takes (and clears) the message of the last error raised by kernel code on this thread.
std::string take_last_error();

}  // namespace jaxtile
