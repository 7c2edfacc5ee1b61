// Shared declarations of the virtual Gaudi core: a CPU-backed `hpu` device.
#pragma once

#include "torch_compat.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/util/MaybeOwned.h>
#include <c10/util/SmallVector.h>

#include <string_view>

// The device the virtual Gaudi is. Gaudi's torch, like the CPU build, has an HPU device type. A torch built for another
// accelerator (CUDA, XPU, MPS) has that one as its accelerator, and autograd syncs only its streams: a second device
// works there only as torch's PrivateUse1 backend, which Python names "hpu" before loading this library (_native.py).
#ifdef VIRTUAL_HPU_PRIVATEUSE1
#define VIRTUAL_HPU_KEY PrivateUse1
#define VIRTUAL_HPU_AUTOCAST_KEY AutocastPrivateUse1
#else
#define VIRTUAL_HPU_KEY HPU
#define VIRTUAL_HPU_AUTOCAST_KEY AutocastHPU
#endif
// TORCH_LIBRARY_IMPL pastes its key into names: expand ours first.
#define VIRTUAL_HPU_LIBRARY_IMPL_(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)
#define VIRTUAL_HPU_LIBRARY_IMPL(ns, m) VIRTUAL_HPU_LIBRARY_IMPL_(ns, VIRTUAL_HPU_KEY, m)
#define VIRTUAL_HPU_AUTOCAST_LIBRARY_IMPL(ns, m) VIRTUAL_HPU_LIBRARY_IMPL_(ns, VIRTUAL_HPU_AUTOCAST_KEY, m)

namespace virtual_hpu {

constexpr c10::DeviceType kDeviceType = c10::DeviceType::VIRTUAL_HPU_KEY;
constexpr c10::DispatchKey kDispatchKey = c10::DispatchKey::VIRTUAL_HPU_KEY;
constexpr c10::DispatchKey kAutocastKey = c10::DispatchKey::VIRTUAL_HPU_AUTOCAST_KEY;

// Whether a tensor or device is on the virtual Gaudi.
template <typename TensorOrDevice>
inline bool isHpu(const TensorOrDevice& x) {
#ifdef VIRTUAL_HPU_PRIVATEUSE1
  return x.is_privateuseone();
#else
  return x.is_hpu();
#endif
}

// Upper bound on the number of devices a process may configure.
constexpr c10::DeviceIndex kMaxDevices = 16;

// ---- device.cpp: configuration and the current device ----
c10::DeviceIndex deviceCount();
c10::DeviceIndex currentDevice();
void setCurrentDevice(c10::DeviceIndex index);
// Index of `device`, or the current device when it carries none; validates the range.
c10::DeviceIndex resolveIndex(std::optional<c10::Device> device);
bool isLazy();
// Whether the device tells torch it has an HPU (its accelerator then).
bool isTorchAccelerator();

// ---- allocator.cpp: host memory tagged with an HPU device, with accounting ----
c10::Allocator* allocatorFor(c10::DeviceIndex index);
// Books `nbytes` at `index` (raises torch.OutOfMemoryError over the limit).
void recordAlloc(c10::DeviceIndex index, size_t nbytes, void* ptr);
void recordFree(c10::DeviceIndex index, size_t nbytes, void* ptr);
// Books `nbytes` taken from (handed back to) the host for `index`: what it reserves, and its system allocations.
void recordSystemAlloc(c10::DeviceIndex index, size_t nbytes);
void recordSystemFree(c10::DeviceIndex index, size_t nbytes);
// Host memory for `pin_memory()` (not counted as device memory), and whether `ptr` lies in such memory.
c10::Allocator* pinnedAllocator();
bool isPinned(const void* ptr);

// ---- kernels.cpp ----
// Gaudi has no complex support, and first-generation Gaudi no float16: refuse such HPU tensors. It holds float64
// tensors but computes them in float32: warn once.
void checkDtype(c10::ScalarType dtype);
// Rounds a float64 CPU view of HPU memory to float32 precision, as Gaudi stores float64 values.
void roundToFloat(const at::Tensor& cpu);

// ---- aliasing.cpp: HPU tensors seen as CPU tensors on the same memory ----
class AliasPool;

class CpuAliases {
 public:
  // Uses this thread's pool of alias objects.
  CpuAliases();
  CpuAliases(const CpuAliases&) = delete;
  CpuAliases& operator=(const CpuAliases&) = delete;
  // Hands the alias objects nobody else holds back to this thread's pool.
  ~CpuAliases();
  // CPU tensor on the memory of `hpu`; tensors sharing a storage share the alias storage. `hpu` is borrowed when the
  // caller keeps it alive through the op: copying a tensor that has a Python object takes the GIL.
  at::Tensor toCpu(c10::MaybeOwned<at::Tensor> hpu, bool written = false);
  // After the CPU kernel: carries what it did to the `written` aliases (values rounded as Gaudi stores them, a resize
  // or new memory) over to their HPU tensors.
  void finishWrites();
  // HPU tensor for a CPU result (float64 values rounded to float32 first): the original input, an HPU view, or an
  // adopted new tensor.
  at::Tensor toHpu(const at::Tensor& cpu, c10::DeviceIndex index);

 private:
  struct Entry {
    c10::StorageImpl* hpu_storage;
    c10::intrusive_ptr<c10::StorageImpl> cpu_storage;
  };
  struct Input {
    c10::intrusive_ptr<c10::TensorImpl> cpu;
    c10::MaybeOwned<at::Tensor> hpu;
    bool written;
  };
  // Small inline vectors: most ops have a handful of tensors, and a heap allocation per op would show.
  c10::SmallVector<Entry, 4> storages_;
  c10::SmallVector<Input, 4> inputs_;
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 2> adopted_;
  // Found once per op: every lookup of a thread_local in a loaded library is a call.
  AliasPool& pool_;
};

// ---- fallback.cpp ----
void hpuFallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

// Refuses the device mixes a real device refuses, so that missing `.to(device)` calls show up here too.
class DeviceCheck {
 public:
  void see(const at::Tensor& t) {
    if (isHpu(t)) {
      if (!hpu_) {
        hpu_ = t.device();
      } else if (*hpu_ != t.device()) {
        refuseTwoDevices(*hpu_, t.device());
      }
    } else if (t.dim() > 0 && !cpu_) {
      cpu_ = t.device();
    }
  }
  // Throws when HPU and CPU tensors (other than 0-dim ones) meet in `op` (e.g. "aten::add"), unless its device
  // kernels accept that.
  void check(std::string_view op) const;
  // The HPU tensors' device, or the current device without HPU tensors.
  c10::DeviceIndex index() const;

 private:
  [[noreturn]] static void refuseTwoDevices(c10::Device first, c10::Device second);
  std::optional<c10::Device> hpu_;
  std::optional<c10::Device> cpu_;
};

// ---- alltoall.cpp ----
// c10d::alltoall_ as one alltoall_base: a size for each pair of ranks, as HCCL takes them.
void alltoallAsBase(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

// ---- autocast.cpp ----
// Whether the configured generation has float16 (Gaudi2 and newer).
bool fp16Supported();

// ---- accounting.cpp: cheap counters for lazy-mode behaviour ----
// `digest` describes the op and its input shapes (0 outside lazy mode, where graphs are not compiled per cut)
void countOp(uint64_t digest = 0);
void countHostSync();
// A collective on hpu tensors: its kind (an all-reduce or not) and the bytes of the tensors it sends.
void countCollective(bool all_reduce, int64_t bytes);
// the digest countOp takes: what the op is (nameDigest) and the shapes and dtypes of its tensor inputs
uint64_t opDigest(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first);
uint64_t nameDigest(const std::string& name, const std::string& overload);

// Folds `value` into `digest` with one multiply, a bijection of the digest for each value: tensorDigest runs it per
// size of every tensor of every lazy-mode op, and countOp mixes the op's whole digest once before summing it into the
// graph's.
inline uint64_t combineDigest(uint64_t digest, uint64_t value) { return (digest ^ value) * 0x100000001b3ULL; }

// Inline, as it runs per tensor argument of every lazy-mode op.
inline uint64_t tensorDigest(uint64_t seed, const at::Tensor& tensor) {
  if (!tensor.defined()) return combineDigest(seed, 0x756e646566ULL);
  const c10::IntArrayRef sizes = tensor.sizes();
  uint64_t digest = combineDigest(combineDigest(seed, static_cast<uint64_t>(tensor.scalar_type())), sizes.size());
  for (const int64_t size : sizes) digest = combineDigest(digest, static_cast<uint64_t>(size));
  return digest;
}

}  // namespace virtual_hpu
