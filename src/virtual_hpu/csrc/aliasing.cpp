// Zero-copy bridging between HPU tensors and the CPU kernels that compute them.
#include "virtual_hpu.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorImpl.h>

#include <array>
#include <cstring>
#include <utility>

namespace virtual_hpu {
namespace {

// A CPU alias keeps the HPU storage it reads alive.
void releaseHpuStorage(void* storage) { c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(storage)); }

}  // namespace

// Every op makes CPU aliases of its HPU tensors. Their TensorImpl and StorageImpl objects (three heap blocks per
// tensor with the version counter) are kept per thread and re-aimed at the next op's memory; an alias that outlived
// its op (held by someone else) is simply not reused.
class AliasPool {
 public:
  c10::intrusive_ptr<c10::StorageImpl> storage(c10::StorageImpl* hpu) {
    c10::raw::intrusive_ptr::incref(hpu);
    c10::DataPtr data(hpu->mutable_data(), hpu, &releaseHpuStorage, c10::Device(c10::DeviceType::CPU));
    if (storages_.empty()) {
      // Resizable so CPU kernels may grow `out=` tensors; CpuAliases::writeBack carries that over.
      return c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), hpu->nbytes(),
                                                   std::move(data), c10::GetCPUAllocator(), /*resizable=*/true);
    }
    c10::intrusive_ptr<c10::StorageImpl> storage = std::move(storages_.back());
    storages_.pop_back();
    storage->set_data_ptr_noswap(std::move(data));
    storage->set_nbytes(hpu->nbytes());
    return storage;
  }

  c10::intrusive_ptr<c10::TensorImpl> tensor(const c10::intrusive_ptr<c10::StorageImpl>& storage, const at::Tensor& like) {
    c10::intrusive_ptr<c10::TensorImpl> impl;
    auto& kept = tensors_[c10::InferenceMode::is_enabled()];
    if (kept.empty()) {
      impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                  like.dtype());
    } else {
      impl = std::move(kept.back());
      kept.pop_back();
      impl->set_storage_and_dtype(c10::Storage(storage), like.dtype());
    }
    impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
    return impl;
  }

  void give(c10::intrusive_ptr<c10::TensorImpl>&& impl) {
    auto& kept = tensors_[impl->is_inference()];
    if (impl.use_count() != 1 || impl.weak_use_count() != 1 || kept.size() >= kKept) return;
    impl->set_storage_keep_dtype(parking_);  // lets go of the op's memory
    kept.push_back(std::move(impl));
  }

  void give(c10::intrusive_ptr<c10::StorageImpl>&& storage) {
    if (storage.use_count() != 1 || storage.weak_use_count() != 1 || storages_.size() >= kKept) return;
    storage->set_data_ptr_noswap(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
    storage->set_nbytes(0);
    storages_.push_back(std::move(storage));
  }

 private:
  static constexpr size_t kKept = 16;
  c10::Storage parking_{c10::Storage::use_byte_size_t(), 0, c10::GetCPUAllocator(), /*resizable=*/false};
  // A TensorImpl takes its dispatch keys and version counter from the mode it is made in: one made in inference mode
  // is an inference tensor for good (no in-place update outside that mode, gloo's copy into it included). Aliases are
  // kept apart by the mode they were made in, [0] outside inference mode and [1] inside it.
  std::array<c10::SmallVector<c10::intrusive_ptr<c10::TensorImpl>, kKept>, 2> tensors_;
  c10::SmallVector<c10::intrusive_ptr<c10::StorageImpl>, kKept> storages_;
};

namespace {

thread_local AliasPool t_pool;

// A CPU result adopted as HPU memory: the HPU storage holds the CPU storage (its context, one reference) and books its
// bytes on the device; one deleter per device index, so that nothing else needs allocating per result.
template <c10::DeviceIndex kIndex>
void releaseAdopted(void* context) {
  auto* cpu = static_cast<c10::StorageImpl*>(context);
  recordFree(kIndex, cpu->nbytes(), const_cast<void*>(cpu->data()));
  recordSystemFree(kIndex, cpu->nbytes());
  c10::raw::intrusive_ptr::decref(cpu);
}

template <size_t... kIndex>
constexpr std::array<c10::DeleterFnPtr, kMaxDevices> adoptedDeleters(std::index_sequence<kIndex...>) {
  return {&releaseAdopted<static_cast<c10::DeviceIndex>(kIndex)>...};
}

constexpr std::array<c10::DeleterFnPtr, kMaxDevices> kReleaseAdopted =
    adoptedDeleters(std::make_index_sequence<kMaxDevices>{});

c10::Storage adoptStorage(const c10::Storage& cpu, c10::DeviceIndex index) {
  const size_t nbytes = cpu.nbytes();
  c10::Device device(kDeviceType, index);
  c10::DataPtr data(nullptr, device);
  if (nbytes != 0) {
    void* ptr = cpu.mutable_data();
    recordSystemAlloc(index, nbytes);
    try {
      recordAlloc(index, nbytes, ptr);
    } catch (...) {
      recordSystemFree(index, nbytes);
      throw;
    }
    c10::StorageImpl* held = cpu.unsafeGetStorageImpl();
    c10::raw::intrusive_ptr::incref(held);
    data = c10::DataPtr(ptr, held, kReleaseAdopted[index], device);
  }
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            std::move(data), allocatorFor(index),
                                                            /*resizable=*/true));
}

at::Tensor tensorOn(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return out;
}

// Brings a resize or re-seat done by a CPU kernel on `cpu` back to its HPU original.
void writeBack(const at::Tensor& hpu, const at::Tensor& cpu) {
  c10::StorageImpl* target = hpu.storage().unsafeGetStorageImpl();
  const c10::Storage& source = cpu.storage();
  if (source.data() != target->data()) {
    // The CPU kernel moved the tensor to new memory: copy it into fresh device memory.
    const size_t nbytes = source.nbytes();
    c10::DataPtr fresh = target->allocator()->allocate(nbytes);
    if (nbytes != 0) std::memcpy(fresh.get(), source.data(), nbytes);
    target->set_data_ptr_noswap(std::move(fresh));
    target->set_nbytes(nbytes);
  }
  c10::TensorImpl* impl = hpu.unsafeGetTensorImpl();
  if (impl->sizes() != cpu.sizes() || impl->strides() != cpu.strides() ||
      impl->storage_offset() != cpu.storage_offset()) {
    impl->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
  }
}

}  // namespace

CpuAliases::CpuAliases() : pool_(t_pool) {}

CpuAliases::~CpuAliases() {
  // Drop the inputs first: only then is an alias storage held by this object alone.
  for (Input& input : inputs_) pool_.give(std::move(input.cpu));
  for (Entry& entry : storages_) pool_.give(std::move(entry.cpu_storage));
}

at::Tensor CpuAliases::toCpu(c10::MaybeOwned<at::Tensor> hpu, bool written) {
  c10::StorageImpl* storage = hpu->storage().unsafeGetStorageImpl();
  const c10::intrusive_ptr<c10::StorageImpl>* alias = nullptr;
  for (const Entry& entry : storages_) {
    if (entry.hpu_storage == storage) alias = &entry.cpu_storage;
  }
  if (alias == nullptr) {
    storages_.push_back({storage, pool_.storage(storage)});
    alias = &storages_.back().cpu_storage;
  }
  c10::intrusive_ptr<c10::TensorImpl> cpu = pool_.tensor(*alias, *hpu);
  inputs_.push_back({cpu, std::move(hpu), written});
  return at::Tensor(std::move(cpu));
}

void CpuAliases::finishWrites() {
  for (const Input& input : inputs_) {
    if (!input.written) continue;
    const at::Tensor cpu = at::Tensor::wrap_tensor_impl(input.cpu);
    roundToFloat(cpu);
    writeBack(*input.hpu, cpu);
  }
}

at::Tensor CpuAliases::toHpu(const at::Tensor& cpu, c10::DeviceIndex index) {
  if (!cpu.defined() || !cpu.is_cpu()) return cpu;
  roundToFloat(cpu);  // what comes back to the device has the values Gaudi stores
  for (const Input& input : inputs_) {
    if (input.cpu.get() == cpu.unsafeGetTensorImpl()) return *input.hpu;  // in-place and out= results
  }
  c10::StorageImpl* storage = cpu.storage().unsafeGetStorageImpl();
  for (const Entry& entry : storages_) {
    if (entry.cpu_storage.get() == storage && entry.cpu_storage->data() == entry.hpu_storage->data()) {
      // A view of an input: the same view on the HPU storage.
      c10::Storage hpu(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(entry.hpu_storage));
      return tensorOn(std::move(hpu), kDispatchKey, cpu);
    }
  }
  checkDtype(cpu.scalar_type());
  for (const auto& [cpu_storage, hpu_storage] : adopted_) {
    if (cpu_storage == storage) return tensorOn(hpu_storage, kDispatchKey, cpu);
  }
  adopted_.emplace_back(storage, adoptStorage(cpu.storage(), index));
  return tensorOn(adopted_.back().second, kDispatchKey, cpu);
}

}  // namespace virtual_hpu
