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
#include <deque>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <pthread.h>
#include <string>
#include <unordered_map>
#include <vector>

namespace virtual_hpu {
namespace {

// The fields behind Gaudi's memory_stats(), plus the bytes held from the host (memory_reserved). Atomics, not a
// lock: every op result is booked here.
struct MemoryStats {
  std::atomic<int64_t> limit{0};
  std::atomic<int64_t> in_use{0};
  std::atomic<int64_t> max_in_use{0};
  std::atomic<int64_t> peak_in_use{0};  // max_in_use without resets: the bound of the pool
  std::atomic<int64_t> num_allocs{0};
  std::atomic<int64_t> num_frees{0};
  std::atomic<int64_t> max_alloc_size{0};
  std::atomic<int64_t> system_allocs{0};
  std::atomic<int64_t> system_frees{0};
  std::atomic<int64_t> reserved{0};
  std::atomic<int64_t> max_reserved{0};
};

void raiseTo(std::atomic<int64_t>& maximum, int64_t value) {
  int64_t seen = maximum.load(std::memory_order_relaxed);
  while (value > seen && !maximum.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

std::array<MemoryStats, kMaxDevices> g_stats;

// Room in front of each block for its sizes and device, keeping the data 64-byte aligned.
constexpr size_t kHeader = 64;
struct BlockHeader {
  size_t nbytes;  // booked as in use
  size_t held;    // taken from the host: its size class if pooled (kPooledMin and more), else nbytes
  c10::DeviceIndex index;
};

// Blocks from this size up are pooled: freed, they wait in their device's pool for a request of their size class, as
// a device allocator keeps its memory. The host's allocator would hand such blocks back to the system at once (or on
// trimming) and fault their pages in again at the next step, the same tensors at every step of a training loop.
constexpr size_t kPooledMin = size_t{64} << 10;

// Size classes an eighth of a power of two apart: a block serves requests up to 1/8 smaller than it.
size_t sizeClass(size_t nbytes) {
  const size_t step = (size_t{1} << (63 - __builtin_clzll(nbytes))) / 8;
  return (nbytes + step - 1) / step * step;
}

// One device's free pooled blocks by capacity. It holds at most as many bytes as the device ever had in use, so a
// device never reserves more than twice its peak. When a freed block does not fit, the blocks freed longest ago go
// back to the host to make room: a loop that repeats the same sizes finds them pooled, whatever ran before it.
class Pool {
 public:
  void* take(size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto free = by_capacity_.find(capacity);
    if (free == by_capacity_.end() || free->second.empty()) return nullptr;
    auto newest = free->second.back();
    free->second.pop_back();
    void* base = newest->base;
    by_age_.erase(newest);
    held_ -= capacity;
    return base;
  }

  // Keeps a freed block unless it alone exceeds the bound; returns the blocks evicted for it, for the host.
  std::vector<void*> keep(void* base, size_t capacity, int64_t bound, bool& kept) {
    std::vector<void*> evicted;
    std::lock_guard<std::mutex> lock(mutex_);
    kept = static_cast<int64_t>(capacity) <= bound;
    if (!kept) return evicted;
    while (static_cast<int64_t>(held_ + capacity) > bound) {
      const Block oldest = by_age_.front();
      by_capacity_[oldest.capacity].pop_front();  // the oldest of its class, too
      by_age_.pop_front();
      held_ -= oldest.capacity;
      evicted.push_back(oldest.base);
    }
    by_age_.push_back({base, capacity});
    by_capacity_[capacity].push_back(std::prev(by_age_.end()));
    held_ += capacity;
    return evicted;
  }

  // A fork while another thread holds the lock would leave it held forever in the child.
  void lock() { mutex_.lock(); }
  void unlock() { mutex_.unlock(); }

 private:
  struct Block {
    void* base;
    size_t capacity;
  };
  std::mutex mutex_;
  std::list<Block> by_age_;  // oldest first
  std::unordered_map<size_t, std::deque<std::list<Block>::iterator>> by_capacity_;
  size_t held_ = 0;
};

std::array<Pool, kMaxDevices> g_pools;

[[maybe_unused]] const int g_fork_guard = pthread_atfork(
    [] {
      for (Pool& pool : g_pools) pool.lock();
    },
    [] {
      for (Pool& pool : g_pools) pool.unlock();
    },
    [] {
      for (Pool& pool : g_pools) pool.unlock();
    });

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

// Also for a block the device refused to book (over its limit), which goes back to the host, not to the pool.
void returnToHost(void* base) {
  const auto* header = static_cast<BlockHeader*>(base);
  recordSystemFree(header->index, header->held);
  c10::free_cpu(base);
}

void freeBlock(void* base) {
  const auto* header = static_cast<BlockHeader*>(base);
  const c10::DeviceIndex index = header->index;
  recordFree(index, header->nbytes, static_cast<char*>(base) + kHeader);
  const int64_t bound = g_stats[index].peak_in_use.load(std::memory_order_relaxed);
  bool kept = false;
  if (header->held >= kPooledMin) {
    for (void* evicted : g_pools[index].keep(base, header->held, bound, kept)) returnToHost(evicted);
  }
  if (!kept) returnToHost(base);
}

class HpuAllocator final : public c10::Allocator {
 public:
  void setIndex(c10::DeviceIndex index) { index_ = index; }

  c10::DataPtr allocate(size_t nbytes) override {
    c10::Device device(kDeviceType, index_);
    if (nbytes == 0) return {nullptr, nullptr, nullptr, device};
    const size_t held = nbytes >= kPooledMin ? sizeClass(nbytes) : nbytes;
    void* base = held >= kPooledMin ? g_pools[index_].take(held) : nullptr;
    if (base == nullptr) {
      base = c10::alloc_cpu(held + kHeader);
      recordSystemAlloc(index_, held);
    }
    *static_cast<BlockHeader*>(base) = {nbytes, held, index_};
    void* data = static_cast<char*>(base) + kHeader;
    try {
      recordAlloc(index_, nbytes, data);
    } catch (...) {
      returnToHost(base);
      throw;
    }
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
REGISTER_ALLOCATOR(kDeviceType, &g_current_device_allocator);

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

// Order of the values matches MEMORY_STATS_KEYS in habana_frameworks/torch/hpu/memory.py.
std::vector<int64_t> memoryStats(int64_t index) {
  MemoryStats& s = statsFor(index);
  const int64_t allocs = s.num_allocs.load(), frees = s.num_frees.load();
  const int64_t system_allocs = s.system_allocs.load(), system_frees = s.system_frees.load();
  return {s.limit.load(), s.in_use.load(), s.max_in_use.load(), allocs, frees, allocs - frees,
          s.max_alloc_size.load(), system_allocs, system_frees, system_allocs - system_frees};
}

// Bytes the device holds from the host (in use, and free in its pool), and their peak.
std::vector<int64_t> memoryReserved(int64_t index) {
  MemoryStats& s = statsFor(index);
  return {s.reserved.load(), s.max_reserved.load()};
}

void resetPeakStats(int64_t index) {
  MemoryStats& s = statsFor(index);
  s.max_in_use = s.in_use.load();
  s.max_alloc_size = 0;
  s.max_reserved = s.reserved.load();
}

void setMemoryLimit(int64_t index, int64_t limit_bytes) {
  TORCH_CHECK(limit_bytes > 0, "memory limit must be positive, got ", limit_bytes);
  MemoryStats& s = statsFor(index);
  s.limit = limit_bytes;
}

TORCH_LIBRARY_FRAGMENT(virtual_hpu, m) {
  m.def("memory_stats(int device) -> int[]", &memoryStats);
  m.def("memory_reserved(int device) -> int[]", &memoryReserved);
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
  c10::Device device(kDeviceType, index);
  if (limit != 0 && in_use > limit) {
    const int64_t before = s.in_use.fetch_sub(size, std::memory_order_relaxed) - size;
    c10::reportOutOfMemoryToProfiler(size, before, before, device);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "HPU out of memory on hpu:", static_cast<int>(index),
                     ": tried to allocate ", mib(size), " MiB; ", mib(before), " MiB in use of ", mib(limit),
                     " MiB limit (VIRTUAL_HPU_MEMORY_MB)");
  }
  raiseTo(s.max_in_use, in_use);
  raiseTo(s.peak_in_use, in_use);
  raiseTo(s.max_alloc_size, size);
  s.num_allocs.fetch_add(1, std::memory_order_relaxed);
  c10::reportMemoryUsageToProfiler(ptr, size, in_use, s.reserved.load(std::memory_order_relaxed), device);
}

void recordFree(c10::DeviceIndex index, size_t nbytes, void* ptr) {
  MemoryStats& s = g_stats[index];
  const auto size = static_cast<int64_t>(nbytes);
  const int64_t in_use = s.in_use.fetch_sub(size, std::memory_order_relaxed) - size;
  s.num_frees.fetch_add(1, std::memory_order_relaxed);
  c10::reportMemoryUsageToProfiler(ptr, -size, in_use, s.reserved.load(std::memory_order_relaxed),
                                   c10::Device(kDeviceType, index));
}

void recordSystemAlloc(c10::DeviceIndex index, size_t nbytes) {
  MemoryStats& s = g_stats[index];
  const auto size = static_cast<int64_t>(nbytes);
  raiseTo(s.max_reserved, s.reserved.fetch_add(size, std::memory_order_relaxed) + size);
  s.system_allocs.fetch_add(1, std::memory_order_relaxed);
}

void recordSystemFree(c10::DeviceIndex index, size_t nbytes) {
  MemoryStats& s = g_stats[index];
  s.reserved.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  s.system_frees.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace virtual_hpu
