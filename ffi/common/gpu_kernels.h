// What CUDA's and ROCm's handlers share: kernels loaded once per (context or device, content
// key) and kept, the scope that makes a context or device current, how their messages start,
// and the skeleton of a call (find the driver and the stream's context or device, load the
// kernel on first use, check the buffers, launch).
//
// A vendor supplies a traits struct `T`:
//   kVendor ("CUDA", "HIP"), kWhere ("context", "device": what a module is loaded into),
//   kLaunchInScope (whether a launch needs that current, as CUDA's does);
//   types Api (the driver or runtime, with `std::string describe(Status) const`), Status,
//   kSuccess, Stream, Where, Function;
//   static const Api* api(std::string* why)            the driver, or null saying why not;
//   static Status where_of(const Api&, Stream, Where*)  the stream's context or device;
//   static Status current(const Api&, Where*)           the thread's current one;
//   static Status make_current(const Api&, Where)
//   static void restore(const Api&, Where previous)     undoes make_current;
//   static std::string name_of(key, payload)            the kernel's name (throws if the
//                                                       payload does not decode);
//   static std::unique_ptr<Kernel<Function>> load(const Api&, Where, key, payload)
//                                                       the payload's code loaded there;
//                                                       throws std::runtime_error with the
//                                                       whole message;
//   static TensorMapEncoder tensor_maps(const Api&, Where)   builds `tmap` parameters for
//                                                       that context or device (empty: the
//                                                       vendor has no TMA);
//   static Status launch(const Api&, Function, const std::array<unsigned, 3>& grid,
//                        const LaunchSpec&, Stream, void** params).
#pragma once

#include <array>
#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "common/launch_spec.h"

namespace jaxtile::gpu {

template <typename Function>
struct Kernel {
  std::string name;
  Function fn;
  LaunchSpec spec;
};

// "jaxtile: CUDA kernel 'name' (key 0123456789abcdef...)": how every message of a GPU
// handler about a kernel starts.
inline std::string who(std::string_view vendor, std::string_view name, std::string_view key) {
  return "jaxtile: " + std::string(vendor) + " kernel '" + std::string(name) + "' (key " +
         std::string(key.substr(0, 16)) + "...)";
}

// Makes `where` current for the scope, as loading a module needs (and, on CUDA, launching on
// a stream of that context): XLA usually has it current on its thread already (then nothing
// changes), but a thread of another runtime or a call after a switch may not.
template <typename T>
class CurrentScope {
 public:
  CurrentScope(const typename T::Api& api, typename T::Where where) : api_(api) {
    status_ = T::current(api, &previous_);
    if (status_ == T::kSuccess && previous_ != where) {
      status_ = T::make_current(api, where);
      switched_ = status_ == T::kSuccess;
    }
  }
  ~CurrentScope() {
    if (switched_) T::restore(api_, previous_);
  }
  CurrentScope(const CurrentScope&) = delete;
  CurrentScope& operator=(const CurrentScope&) = delete;
  typename T::Status status() const { return status_; }

 private:
  const typename T::Api& api_;
  typename T::Where previous_{};
  typename T::Status status_;
  bool switched_ = false;
};

// The handler's entry points over the vendor's traits; they throw nothing.
template <typename T>
class Handler {
 public:
  using Api = typename T::Api;
  using Stream = typename T::Stream;
  using Where = typename T::Where;
  using Loaded = Kernel<typename T::Function>;

  // Launches the kernel `key` on `stream` with `buffers` (operands, then results; `dims`
  // their shapes, or null), loading it from `payload` on the first call for the stream's
  // context or device. Returns "" on success, else the message naming the kernel.
  static std::string launch(Stream stream, std::string_view key, std::string_view payload,
                            void* const* buffers, size_t num_buffers, const BufferDims* dims) {
    try {
      const Resolved r = resolve(stream, key, payload);
      return run(*r.api, r.where, *r.kernel, key, stream, buffers, num_buffers, dims);
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  // Loads the kernel if it is not loaded yet, launching nothing; same messages.
  static std::string load(Stream stream, std::string_view key, std::string_view payload) {
    try {
      resolve(stream, key, payload);
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  }

 private:
  // Orders (where, key) pairs, looked up without copying the key.
  struct Less {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return a.first != b.first ? a.first < b.first
                                : std::string_view(a.second) < std::string_view(b.second);
    }
  };

  // Kernels are never unloaded (keys name immutable code), so references stay valid.
  struct Cache {
    std::mutex mutex;
    std::map<std::pair<Where, std::string>, std::unique_ptr<Loaded>, Less> kernels;
  };

  static Cache& cache() {
    static Cache c;
    return c;
  }

  static const Loaded& find_or_load(const Api& api, Where where, std::string_view key,
                                    std::string_view payload) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.kernels.find(std::make_pair(where, key));
    if (it == c.kernels.end()) {
      it = c.kernels
               .emplace(std::make_pair(where, std::string(key)),
                        T::load(api, where, key, payload))
               .first;
    }
    return *it->second;
  }

  // The kernel's name from its payload, for messages where loading failed before decoding.
  static std::string name_in(std::string_view key, std::string_view payload) {
    try {
      return T::name_of(key, payload);
    } catch (const std::exception&) {
      return "?";
    }
  }

  struct Resolved {
    const Api* api;
    Where where;
    const Loaded* kernel;
  };

  // The driver, the stream's context or device and the kernel loaded there; throws with
  // the whole message.
  static Resolved resolve(Stream stream, std::string_view key, std::string_view payload) {
    std::string why;
    const Api* api = T::api(&why);
    if (api == nullptr) {
      throw std::runtime_error(who(T::kVendor, name_in(key, payload), key) +
                               " cannot run: " + why);
    }
    Where where{};
    if (auto e = T::where_of(*api, stream, &where); e != T::kSuccess) {
      throw std::runtime_error(who(T::kVendor, name_in(key, payload), key) +
                               ": cannot find the " + T::kWhere +
                               " of the stream XLA passed: " + api->describe(e));
    }
    return {api, where, &find_or_load(*api, where, key, payload)};
  }

  static std::string run(const Api& api, Where where, const Loaded& k, std::string_view key,
                         Stream stream, void* const* buffers, size_t num_buffers,
                         const BufferDims* dims) {
    const std::string name = who(T::kVendor, k.name, key);
    const LaunchSpec& s = k.spec;
    if (num_buffers < s.buffers_needed) {
      return name + ": called with " + std::to_string(num_buffers) +
             " buffers, but its parameters use " + std::to_string(s.buffers_needed);
    }
    std::optional<LaunchArgs> args;
    try {
      const TensorMapEncoder encode = T::tensor_maps(api, where);
      args.emplace(s, buffers, dims, num_buffers, encode ? &encode : nullptr);
    } catch (const std::invalid_argument& e) {
      return name + ": " + e.what();
    }
    if (args->empty()) return "";  // no blocks (an empty batch): nothing to run
    // After the empty-grid exit: the buffers of an empty batch may be anywhere.
    if (std::string bad = misaligned(s, buffers); !bad.empty()) return name + ": " + bad;
    std::optional<CurrentScope<T>> scope;
    if constexpr (T::kLaunchInScope) {
      scope.emplace(api, where);
      if (scope->status() != T::kSuccess) {
        return name + ": making the stream's " + T::kWhere + " current failed: " +
               api.describe(scope->status());
      }
    }
    const auto e = T::launch(api, k.fn, args->grid(), s, stream, args->pointers());
    if (e != T::kSuccess) {
      return name + " failed to launch (" + s.describe() + "): " + api.describe(e);
    }
    return "";
  }
};

}  // namespace jaxtile::gpu
