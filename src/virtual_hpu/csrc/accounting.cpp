// Counters of what a lazy-mode Gaudi run would turn into graphs and host syncs.
#include "virtual_hpu.h"

#include <torch/library.h>

#include <atomic>

namespace virtual_hpu {
namespace {

std::atomic<int64_t> g_ops{0};
std::atomic<int64_t> g_ops_since_cut{0};
std::atomic<int64_t> g_graphs{0};
std::atomic<int64_t> g_last_graph_ops{0};
std::atomic<int64_t> g_max_graph_ops{0};
std::atomic<int64_t> g_mark_steps{0};
std::atomic<int64_t> g_host_syncs{0};

// Ends the pending graph, as Gaudi does when it compiles and runs it.
void cutGraph() {
  const int64_t ops = g_ops_since_cut.exchange(0);
  if (ops == 0) return;
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
  return {g_mark_steps.load(), g_graphs.load(), g_ops.load(), g_ops_since_cut.load(),
          g_last_graph_ops.load(), g_max_graph_ops.load(), g_host_syncs.load()};
}

void resetCounters() {
  for (auto* counter : {&g_ops, &g_ops_since_cut, &g_graphs, &g_last_graph_ops, &g_max_graph_ops, &g_mark_steps,
                        &g_host_syncs}) {
    *counter = 0;
  }
}

TORCH_LIBRARY_FRAGMENT(virtual_hpu, m) {
  m.def("mark_step() -> ()", &markStep);
  m.def("counters() -> int[]", &counters);
  m.def("reset_counters() -> ()", &resetCounters);
}

}  // namespace

void countOp() {
  g_ops.fetch_add(1, std::memory_order_relaxed);
  g_ops_since_cut.fetch_add(1, std::memory_order_relaxed);
}

void countHostSync() {
  ++g_host_syncs;
  // Reading a value on the host forces the pending lazy graph to run.
  if (isLazy()) cutGraph();
}

}  // namespace virtual_hpu
