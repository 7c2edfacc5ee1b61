// Zero-copy bridging between HPU tensors and the CPU kernels that compute them.
#include "virtual_hpu.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

#include <cstring>

namespace virtual_hpu {
namespace {

// A CPU alias keeps the HPU storage it reads alive.
void releaseHpuStorage(void* storage) { c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(storage)); }

c10::Storage makeCpuAliasStorage(c10::StorageImpl* hpu) {
  c10::raw::intrusive_ptr::incref(hpu);
  c10::DataPtr data(hpu->mutable_data(), hpu, &releaseHpuStorage, c10::Device(c10::DeviceType::CPU));
  // Resizable so CPU kernels may grow `out=` tensors; CpuAliases::writeBack carries that over.
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), hpu->nbytes(),
                                                            std::move(data), c10::GetCPUAllocator(),
                                                            /*resizable=*/true));
}

// A CPU result adopted as HPU memory: keeps the CPU storage alive and books its bytes on the device.
struct AdoptedMemory {
  c10::Storage cpu;
  size_t nbytes;
  c10::DeviceIndex index;
};

void releaseAdopted(void* ctx) {
  auto* adopted = static_cast<AdoptedMemory*>(ctx);
  recordFree(adopted->index, adopted->nbytes, adopted->cpu.mutable_data());
  delete adopted;
}

c10::Storage adoptStorage(const c10::Storage& cpu, c10::DeviceIndex index) {
  const size_t nbytes = cpu.nbytes();
  c10::Device device(c10::DeviceType::HPU, index);
  c10::DataPtr data(nullptr, device);
  if (nbytes != 0) {
    void* ptr = cpu.mutable_data();
    recordAlloc(index, nbytes, ptr);
    data = c10::DataPtr(ptr, new AdoptedMemory{cpu, nbytes, index}, &releaseAdopted, device);
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

}  // namespace

at::Tensor CpuAliases::toCpu(const at::Tensor& hpu) {
  c10::StorageImpl* storage = hpu.storage().unsafeGetStorageImpl();
  const c10::Storage* alias = nullptr;
  for (const Entry& entry : storages_) {
    if (entry.hpu_storage == storage) alias = &entry.cpu_storage;
  }
  if (alias == nullptr) {
    storages_.push_back({storage, makeCpuAliasStorage(storage)});
    alias = &storages_.back().cpu_storage;
  }
  at::Tensor cpu = tensorOn(*alias, c10::DispatchKey::CPU, hpu);
  inputs_.push_back({cpu.unsafeGetTensorImpl(), hpu});
  return cpu;
}

at::Tensor CpuAliases::toHpu(const at::Tensor& cpu, c10::DeviceIndex index) {
  if (!cpu.defined() || !cpu.is_cpu()) return cpu;
  for (const Input& input : inputs_) {
    if (input.cpu_impl == cpu.unsafeGetTensorImpl()) return input.hpu;  // in-place and out= results
  }
  c10::StorageImpl* storage = cpu.storage().unsafeGetStorageImpl();
  for (const Entry& entry : storages_) {
    if (entry.cpu_storage.unsafeGetStorageImpl() == storage && entry.cpu_storage.data() == entry.hpu_storage->data()) {
      // A view of an input: the same view on the HPU storage.
      c10::Storage hpu(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(entry.hpu_storage));
      return tensorOn(std::move(hpu), c10::DispatchKey::HPU, cpu);
    }
  }
  checkDtype(cpu.scalar_type());
  for (const auto& [cpu_storage, hpu_storage] : adopted_) {
    if (cpu_storage == storage) return tensorOn(hpu_storage, c10::DispatchKey::HPU, cpu);
  }
  adopted_.emplace_back(storage, adoptStorage(cpu.storage(), index));
  return tensorOn(adopted_.back().second, c10::DispatchKey::HPU, cpu);
}

void CpuAliases::writeBack(const at::Tensor& hpu, const at::Tensor& cpu) {
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

}  // namespace virtual_hpu
