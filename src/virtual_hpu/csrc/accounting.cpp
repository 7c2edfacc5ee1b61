// Counters of what a lazy-mode Gaudi run would turn into graphs and host syncs.
#include "virtual_hpu.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <unordered_set>

namespace virtual_hpu {
namespace {

std::atomic<int64_t> g_ops{0};
// g_ops when the pending graph began: the op count is the one counter every op updates
std::atomic<int64_t> g_ops_at_cut{0};
std::atomic<int64_t> g_graphs{0};
std::atomic<int64_t> g_last_graph_ops{0};
std::atomic<int64_t> g_max_graph_ops{0};
std::atomic<int64_t> g_mark_steps{0};
std::atomic<int64_t> g_host_syncs{0};
std::atomic<int64_t> g_collectives{0};
std::atomic<int64_t> g_all_reduces{0};
std::atomic<int64_t> g_collective_bytes{0};
// Lazy mode compiles a graph the first time its shape is seen and takes it from the cache afterwards. The pending
// graph's shape is summed up in an order-insensitive digest of its ops; never reset, like the bridge's metric.
std::atomic<uint64_t> g_graph_digest{0};
std::atomic<int64_t> g_lazy_compilations{0};
std::mutex g_seen_mutex;
std::unordered_set<uint64_t> g_seen_graphs;
// While a tool listens (virtual_hpu.events), each host sync and lazy compilation is reported to Python through the
// op virtual_hpu::event, which Python implements; off, the check is one relaxed load.
std::atomic<bool> g_report_events{false};

void reportEvent(const char* kind) {
  if (!g_report_events.load(std::memory_order_relaxed)) return;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("virtual_hpu::event", "")
                             .typed<void(c10::string_view)>();
  op.call(kind);
}

uint64_t mix(uint64_t value) {
  // splitmix64's finaliser: spreads the bits so that sums of digests rarely collide
  value += 0x9e3779b97f4a7c15ULL;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL;
  return value ^ (value >> 31);
}

// Ends the pending graph, as Gaudi does when it compiles and runs it.
void cutGraph() {
  const int64_t now = g_ops.load();
  const int64_t ops = now - g_ops_at_cut.exchange(now);
  const uint64_t digest = g_graph_digest.exchange(0);
  if (ops == 0) return;
  bool compiled = false;
  if (isLazy()) {
    std::lock_guard<std::mutex> lock(g_seen_mutex);
    compiled = g_seen_graphs.insert(mix(digest + static_cast<uint64_t>(ops))).second;
    if (compiled) ++g_lazy_compilations;
  }
  if (compiled) reportEvent("compilation");
  ++g_graphs;
  g_last_graph_ops = ops;
  int64_t max = g_max_graph_ops.load();
  while (ops > max && !g_max_graph_ops.compare_exchange_weak(max, ops)) {
  }
}

void markStep() {
  ++g_mark_steps;
  cutGraph();
}

// Order of the values matches COUNTER_NAMES in virtual_hpu/accounting.py.
std::vector<int64_t> counters() {
  const int64_t ops = g_ops.load();
  return {g_mark_steps.load(),   g_graphs.load(),     ops, ops - g_ops_at_cut.load(), g_last_graph_ops.load(),
          g_max_graph_ops.load(), g_host_syncs.load(), g_collectives.load(),       g_all_reduces.load(),
          g_collective_bytes.load()};
}

void resetCounters() {
  for (auto* counter : {&g_ops, &g_ops_at_cut, &g_graphs, &g_last_graph_ops, &g_max_graph_ops, &g_mark_steps,
                        &g_host_syncs, &g_collectives, &g_all_reduces, &g_collective_bytes}) {
    *counter = 0;
  }
}

int64_t lazyCompilations() { return g_lazy_compilations.load(); }

void reportEvents(bool enabled) { g_report_events = enabled; }

TORCH_LIBRARY_FRAGMENT(virtual_hpu, m) {
  m.def("event(str kind) -> ()");
  m.def("report_events(bool enabled) -> ()", &reportEvents);
  m.def("lazy_graph_compilations() -> int", &lazyCompilations);
  m.def("mark_step() -> ()", &markStep);
  m.def("counters() -> int[]", &counters);
  m.def("reset_counters() -> ()", &resetCounters);
}

}  // namespace

void countOp(uint64_t digest) {
  g_ops.fetch_add(1, std::memory_order_relaxed);
  if (digest != 0) g_graph_digest.fetch_add(mix(digest), std::memory_order_relaxed);
}

uint64_t nameDigest(const std::string& name, const std::string& overload) {
  return mix(std::hash<std::string>{}(name) ^ mix(std::hash<std::string>{}(overload)));
}

uint64_t opDigest(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const auto& name = op.operator_name();
  uint64_t digest = nameDigest(name.name, name.overload_name);
  for (size_t i = first; i < stack.size(); ++i) {
    if (stack[i].isTensor()) digest = tensorDigest(digest, stack[i].toTensor());
  }
  return digest;
}

void countCollective(bool all_reduce, int64_t bytes) {
  ++g_collectives;
  if (all_reduce) ++g_all_reduces;
  g_collective_bytes += bytes;
}

void countHostSync() {
  ++g_host_syncs;
  // Reading a value on the host forces the pending lazy graph to run (compiled first if new).
  if (isLazy()) cutGraph();
  reportEvent("host_sync");
}

}  // namespace virtual_hpu
