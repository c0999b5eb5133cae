#include "cpu/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace jaxtile {
namespace {

// --- The C ABI JAX's profiler calls (XLA's pjrt_c_api.h, pjrt_c_api_profiler_extension.h and
// backends/profiler/plugin/profiler_c_api.h): only the parts a profiler plugin needs. ------

struct PluginError;    // never made: every call succeeds
struct PluginSession;  // one per profiling session (a PluginTracer in XLA)

struct ErrorDestroyArgs {
  size_t struct_size;
  void* priv;
  PluginError* error;
};
struct ErrorMessageArgs {
  size_t struct_size;
  void* priv;
  const PluginError* error;
  const char* message;
  size_t message_size;
};
struct ErrorGetCodeArgs {
  size_t struct_size;
  void* priv;
  const PluginError* error;
  int code;
};
struct CreateArgs {
  size_t struct_size;
  const char* options;  // a serialised ProfileOptions, not needed here
  size_t options_size;
  PluginSession* profiler;
};
struct SessionArgs {  // destroy, start and stop take the same arguments
  size_t struct_size;
  PluginSession* profiler;
};
struct CollectDataArgs {
  size_t struct_size;
  PluginSession* profiler;
  uint8_t* buffer;
  size_t buffer_size_in_bytes;
};

struct ProfilerApi {
  size_t struct_size;
  void* priv;
  void (*error_destroy)(ErrorDestroyArgs*);
  void (*error_message)(ErrorMessageArgs*);
  PluginError* (*error_get_code)(ErrorGetCodeArgs*);
  PluginError* (*create)(CreateArgs*);
  PluginError* (*destroy)(SessionArgs*);
  PluginError* (*start)(SessionArgs*);
  PluginError* (*stop)(SessionArgs*);
  PluginError* (*collect_data)(CollectDataArgs*);
};

struct ExtensionBase {
  size_t struct_size;
  int type;  // PJRT_Extension_Type
  ExtensionBase* next;
};
constexpr int kProfilerExtension = 1;  // PJRT_Extension_Type_Profiler

struct ProfilerExtension {
  ExtensionBase base;
  ProfilerApi* profiler_api;
  int64_t traceme_context_id;
};

// The head of a PJRT_Api: its size and the extension chain, all the registration reads.
struct ApiHead {
  size_t struct_size;
  ExtensionBase* extension_start;
};

// --- Recording ------------------------------------------------------------------------

struct Range {
  std::string kernel;
  int64_t thread;
  int64_t begin, end;  // blocks
  int64_t start_ns, end_ns;
};

std::atomic<bool> g_tracing{false};
std::mutex g_mu;
std::vector<Range>* g_ranges = new std::vector<Range>;  // never destroyed: threads may record late

struct PluginSession {
  std::vector<Range> ranges;  // what the session recorded, after stop
  std::string bytes;          // the XSpace handed to collect_data
};

// --- A protobuf writer for the few XSpace fields the plane needs (tsl's xplane.proto) -------

class Message {
 public:
  Message& integer(int field, int64_t v) {
    key(field, 0);
    varint(static_cast<uint64_t>(v));
    return *this;
  }
  Message& bytes(int field, std::string_view v) {
    key(field, 2);
    varint(v.size());
    out_.append(v);
    return *this;
  }
  Message& message(int field, const Message& m) { return bytes(field, m.out_); }
  const std::string& str() const { return out_; }

 private:
  void key(int field, int wire) { varint((static_cast<uint64_t>(field) << 3) | wire); }
  void varint(uint64_t v) {
    for (; v >= 0x80; v >>= 7) out_.push_back(static_cast<char>(v | 0x80));
    out_.push_back(static_cast<char>(v));
  }
  std::string out_;
};

// Stats of each event (XStat metadata ids): the chunk's first block and its block count.
constexpr int64_t kFirstBlock = 1;
constexpr int64_t kBlocks = 2;

// XSpace{planes: [XPlane{id, name, lines: [XLine{id, name, timestamp_ns, events: [XEvent{
// metadata_id, offset_ps, duration_ps, stats: [XStat{metadata_id, int64_value}]}]}],
// event_metadata: {id: XEventMetadata{id, name}}, stat_metadata: {id: XStatMetadata{id,
// name}}}]}
std::string to_xspace(const std::vector<Range>& ranges) {
  std::map<std::string, int64_t> names;
  std::map<int64_t, std::vector<const Range*>> by_thread;
  for (const Range& r : ranges) {
    names.emplace(r.kernel, static_cast<int64_t>(names.size()) + 1);
    by_thread[r.thread].push_back(&r);
  }
  Message plane;
  plane.integer(1, 0x6a74).bytes(2, "/device:CUSTOM:jaxtile CPU pool");
  for (auto& [thread, rs] : by_thread) {
    int64_t t0 = rs.front()->start_ns;
    for (const Range* r : rs) t0 = std::min(t0, r->start_ns);
    Message line;
    line.integer(1, thread).bytes(2, "jaxtile thread " + std::to_string(thread)).integer(3, t0);
    for (const Range* r : rs) {
      Message event;
      event.integer(1, names[r->kernel])
          .integer(2, (r->start_ns - t0) * 1000)
          .integer(3, std::max<int64_t>(r->end_ns - r->start_ns, 0) * 1000)
          .message(4, Message().integer(1, kFirstBlock).integer(4, r->begin))
          .message(4, Message().integer(1, kBlocks).integer(4, r->end - r->begin));
      line.message(4, event);
    }
    plane.message(3, line);
  }
  for (auto [id, name] : {std::pair{kFirstBlock, "first block"}, std::pair{kBlocks, "blocks"}}) {
    Message entry;  // stat_metadata: XStatMetadata{id, name}
    entry.integer(1, id).message(2, Message().integer(1, id).bytes(2, name));
    plane.message(5, entry);
  }
  for (auto& [name, id] : names) {
    Message entry;  // a map entry: key 1, value 2
    entry.integer(1, id).message(2, Message().integer(1, id).bytes(2, name));
    plane.message(4, entry);
  }
  return Message().message(1, plane).str();
}

// --- The plugin's functions ------------------------------------------------------------

void error_destroy(ErrorDestroyArgs*) {}
void error_message(ErrorMessageArgs* args) {
  args->message = "";
  args->message_size = 0;
}
PluginError* error_get_code(ErrorGetCodeArgs* args) {
  args->code = 0;
  return nullptr;
}
PluginError* create(CreateArgs* args) {
  args->profiler = new PluginSession;
  return nullptr;
}
PluginError* destroy(SessionArgs* args) {
  delete args->profiler;
  return nullptr;
}
PluginError* start(SessionArgs*) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_ranges->clear();
  g_tracing.store(true);
  return nullptr;
}
PluginError* stop(SessionArgs* args) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_tracing.store(false);
  args->profiler->ranges = std::move(*g_ranges);
  g_ranges->clear();
  return nullptr;
}
// Callers differ by XLA version: one call that takes the plugin's buffer (`buffer` null on
// entry), or a first call for the size and a second into the caller's buffer.
PluginError* collect_data(CollectDataArgs* args) {
  PluginSession& s = *args->profiler;
  if (args->buffer == nullptr) {
    s.bytes = s.ranges.empty() ? std::string() : to_xspace(s.ranges);
    args->buffer = reinterpret_cast<uint8_t*>(s.bytes.data());
  } else if (args->buffer != reinterpret_cast<uint8_t*>(s.bytes.data())) {
    std::memcpy(args->buffer, s.bytes.data(), s.bytes.size());
  }
  args->buffer_size_in_bytes = s.bytes.size();
  return nullptr;
}

ProfilerApi g_api{sizeof(ProfilerApi), nullptr, error_destroy, error_message, error_get_code,
                  create,              destroy, start,         stop,          collect_data};
ProfilerExtension g_extension{{sizeof(ProfilerExtension), kProfilerExtension, nullptr}, &g_api, 0};
ApiHead g_head{sizeof(ApiHead), &g_extension.base};

int64_t thread_id() {
  static thread_local const int64_t id = static_cast<int64_t>(::syscall(SYS_gettid));
  return id;
}

}  // namespace

bool tracing() { return g_tracing.load(std::memory_order_relaxed); }

int64_t trace_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void record_range(std::string_view kernel, int64_t begin, int64_t end, int64_t start_ns) {
  Range r{std::string(kernel), thread_id(), begin, end, start_ns, trace_now_ns()};
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_tracing.load()) g_ranges->push_back(std::move(r));
}

const void* profiler_pjrt_api() { return &g_head; }

}  // namespace jaxtile
