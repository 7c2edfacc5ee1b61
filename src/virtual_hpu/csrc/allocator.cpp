// Host memory handed out as HPU memory, one accounting allocator per device index.
#include "virtual_hpu.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

namespace virtual_hpu {
namespace {

// The fields behind Gaudi's memory_stats(); without a pool every allocation is a system allocation. Atomics, not a
// lock: every op result is booked here.
struct MemoryStats {
  std::atomic<int64_t> limit{0};
  std::atomic<int64_t> in_use{0};
  std::atomic<int64_t> max_in_use{0};
  std::atomic<int64_t> num_allocs{0};
  std::atomic<int64_t> num_frees{0};
  std::atomic<int64_t> max_alloc_size{0};
};

void raiseTo(std::atomic<int64_t>& maximum, int64_t value) {
  int64_t seen = maximum.load(std::memory_order_relaxed);
  while (value > seen && !maximum.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

std::array<MemoryStats, kMaxDevices> g_stats;

// Room in front of each block for its size and device, keeping the data 64-byte aligned.
constexpr size_t kHeader = 64;
struct BlockHeader {
  size_t nbytes;
  c10::DeviceIndex index;
};

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

void freeBlock(void* base) {
  auto* header = static_cast<BlockHeader*>(base);
  recordFree(header->index, header->nbytes, static_cast<char*>(base) + kHeader);
  c10::free_cpu(base);
}

class HpuAllocator final : public c10::Allocator {
 public:
  void setIndex(c10::DeviceIndex index) { index_ = index; }

  c10::DataPtr allocate(size_t nbytes) override {
    c10::Device device(c10::DeviceType::HPU, index_);
    if (nbytes == 0) return {nullptr, nullptr, nullptr, device};
    void* base = c10::alloc_cpu(nbytes + kHeader);
    void* data = static_cast<char*>(base) + kHeader;
    try {
      recordAlloc(index_, nbytes, data);
    } catch (...) {
      c10::free_cpu(base);
      throw;
    }
    *static_cast<BlockHeader*>(base) = {nbytes, index_};
    return {data, base, &freeBlock, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::DeviceIndex index_ = 0;
};

std::array<HpuAllocator, kMaxDevices>& allocators() {
  static std::array<HpuAllocator, kMaxDevices> instances = [] {
    std::array<HpuAllocator, kMaxDevices> all;
    for (c10::DeviceIndex i = 0; i < kMaxDevices; ++i) all[i].setIndex(i);
    return all;
  }();
  return instances;
}

// c10::GetAllocator(HPU) has no device argument: it serves the current device.
class CurrentDeviceAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override { return allocatorFor(currentDevice())->allocate(nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CurrentDeviceAllocator g_current_device_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::HPU, &g_current_device_allocator);

// Pinned host memory, what `pin_memory()` hands out: plain host memory here (copies are synchronous anyway), kept in
// a map of blocks so that `is_pinned()` recognises it, also from a pointer inside a block, and nothing else.
std::mutex g_pinned_mutex;
std::map<std::uintptr_t, size_t> g_pinned_blocks;  // start -> size

void freePinned(void* data) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_blocks.erase(reinterpret_cast<std::uintptr_t>(data));
  }
  c10::free_cpu(data);
}

class PinnedHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    c10::Device cpu(c10::DeviceType::CPU);
    if (nbytes == 0) return {nullptr, nullptr, nullptr, cpu};
    void* data = c10::alloc_cpu(nbytes);
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_blocks.emplace(reinterpret_cast<std::uintptr_t>(data), nbytes);
    return {data, data, &freePinned, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &freePinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

PinnedHostAllocator g_pinned_allocator;

MemoryStats& statsFor(int64_t index) {
  TORCH_CHECK(index >= 0 && index < deviceCount(), "Invalid device hpu:", index);
  return g_stats[index];
}

// Order of the values matches MEMORY_STATS_KEYS in virtual_hpu/_native.py.
std::vector<int64_t> memoryStats(int64_t index) {
  MemoryStats& s = statsFor(index);
  const int64_t allocs = s.num_allocs.load(), frees = s.num_frees.load();
  return {s.limit.load(), s.in_use.load(), s.max_in_use.load(), allocs, frees, allocs - frees,
          s.max_alloc_size.load(), allocs, frees, allocs - frees};
}

void resetPeakStats(int64_t index) {
  MemoryStats& s = statsFor(index);
  s.max_in_use = s.in_use.load();
  s.max_alloc_size = 0;
}

void setMemoryLimit(int64_t index, int64_t limit_bytes) {
  TORCH_CHECK(limit_bytes > 0, "memory limit must be positive, got ", limit_bytes);
  MemoryStats& s = statsFor(index);
  s.limit = limit_bytes;
}

TORCH_LIBRARY_FRAGMENT(virtual_hpu, m) {
  m.def("memory_stats(int device) -> int[]", &memoryStats);
  m.def("reset_peak_memory_stats(int device) -> ()", &resetPeakStats);
  m.def("set_memory_limit(int device, int limit_bytes) -> ()", &setMemoryLimit);
}

}  // namespace

c10::Allocator* allocatorFor(c10::DeviceIndex index) { return &allocators()[index]; }

c10::Allocator* pinnedAllocator() { return &g_pinned_allocator; }

bool isPinned(const void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto block = g_pinned_blocks.upper_bound(address);
  if (block == g_pinned_blocks.begin()) return false;
  --block;
  return address < block->first + block->second;
}

void recordAlloc(c10::DeviceIndex index, size_t nbytes, void* ptr) {
  MemoryStats& s = g_stats[index];
  const auto size = static_cast<int64_t>(nbytes);
  const int64_t limit = s.limit.load(std::memory_order_relaxed);
  const int64_t in_use = s.in_use.fetch_add(size, std::memory_order_relaxed) + size;
  c10::Device device(c10::DeviceType::HPU, index);
  if (limit != 0 && in_use > limit) {
    const int64_t before = s.in_use.fetch_sub(size, std::memory_order_relaxed) - size;
    c10::reportOutOfMemoryToProfiler(size, before, before, device);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "HPU out of memory on hpu:", static_cast<int>(index),
                     ": tried to allocate ", mib(size), " MiB; ", mib(before), " MiB in use of ", mib(limit),
                     " MiB limit (VIRTUAL_HPU_MEMORY_MB)");
  }
  raiseTo(s.max_in_use, in_use);
  raiseTo(s.max_alloc_size, size);
  s.num_allocs.fetch_add(1, std::memory_order_relaxed);
  c10::reportMemoryUsageToProfiler(ptr, size, in_use, in_use, device);
}

void recordFree(c10::DeviceIndex index, size_t nbytes, void* ptr) {
  MemoryStats& s = g_stats[index];
  const auto size = static_cast<int64_t>(nbytes);
  const int64_t in_use = s.in_use.fetch_sub(size, std::memory_order_relaxed) - size;
  s.num_frees.fetch_add(1, std::memory_order_relaxed);
  c10::reportMemoryUsageToProfiler(ptr, -size, in_use, in_use, c10::Device(c10::DeviceType::HPU, index));
}

}  // namespace virtual_hpu
