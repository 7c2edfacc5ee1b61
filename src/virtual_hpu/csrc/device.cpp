// The device itself: a DeviceGuardImpl and the device's hooks so that torch treats `hpu` as available.
#include "virtual_hpu.h"

#include <ATen/CPUGeneratorImpl.h>
#ifdef VIRTUAL_HPU_PRIVATEUSE1
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>
#else
#include <ATen/detail/HPUHooksInterface.h>
#endif
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

namespace virtual_hpu {
namespace {

std::atomic<c10::DeviceIndex> g_device_count{0};
std::atomic<bool> g_lazy{true};
// Whether torch is told it has an HPU, which makes hpu torch's accelerator (see set_torch_accelerator).
std::atomic<bool> g_torch_accelerator{true};
// Like CUDA, the current device is per thread.
thread_local c10::DeviceIndex t_current_device = 0;
std::atomic<int64_t> g_next_stream_id{1};

// Events only carry a host timestamp: work on the virtual device is synchronous.
struct HostEvent {
  std::chrono::steady_clock::time_point recorded;
};

struct HpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDeviceType; }

  c10::Device exchangeDevice(c10::Device device) const override {
    c10::Device previous = getDevice();
    if (device.index() >= 0) setCurrentDevice(device.index());
    return previous;
  }
  c10::Device getDevice() const override { return {kDeviceType, currentDevice()}; }
  void setDevice(c10::Device device) const override {
    if (device.index() >= 0) setCurrentDevice(device.index());
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0) t_current_device = device.index();
  }

  // noexcept, as torch 2.6 declares these two (torch_compat.h)
  c10::Stream getStream(c10::Device device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getDefaultStream(c10::Device device) const override { return c10::Stream(c10::Stream::DEFAULT, device); }
  c10::Stream getNewStream(c10::Device device, int /*priority*/) const override {
    c10::Device on(kDeviceType, device.has_index() ? device.index() : currentDevice());
    return c10::Stream(c10::Stream::UNSAFE, on, g_next_stream_id++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool /*high_priority*/) const override {
    return getNewStream(device, 0);
  }
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return g_device_count.load(); }

  void record(void** event, const c10::Stream& /*stream*/, const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {
    if (*event == nullptr) *event = new HostEvent();
    static_cast<HostEvent*>(*event)->recorded = std::chrono::steady_clock::now();
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<HostEvent*>(event);
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex /*device_index*/) const override {}
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start && end, "Both events must be recorded before measuring the elapsed time");
    auto elapsed = static_cast<HostEvent*>(end)->recorded - static_cast<HostEvent*>(start)->recorded;
    return std::chrono::duration<double, std::milli>(elapsed).count();
  }
};

C10_REGISTER_GUARD_IMPL(VIRTUAL_HPU_KEY, HpuGuardImpl);

void configure(int64_t devices, bool lazy) {
  TORCH_CHECK(devices >= 1 && devices <= kMaxDevices, "device count must be in [1, ", kMaxDevices, "], got ", devices);
  g_device_count = static_cast<c10::DeviceIndex>(devices);
  g_lazy = lazy;
}

TORCH_LIBRARY_FRAGMENT(virtual_hpu, m) {
  m.def("configure(int devices, bool lazy) -> ()", &configure);
  m.def("device_count() -> int", [] { return static_cast<int64_t>(deviceCount()); });
  m.def("current_device() -> int", [] { return static_cast<int64_t>(currentDevice()); });
  m.def("set_device(int index) -> ()", [](int64_t index) { setCurrentDevice(static_cast<c10::DeviceIndex>(index)); });
  // Off where the HPU device type sits beside the accelerator torch was built for (PyPI's builds before 2.9): torch
  // 2.7 and 2.8 refuse two accelerators ("Cannot have both HPU and cuda") in every backward pass.
  m.def("set_torch_accelerator(bool on) -> ()", [](bool on) { g_torch_accelerator = on; });
}

}  // namespace

c10::DeviceIndex deviceCount() { return g_device_count.load(); }
c10::DeviceIndex currentDevice() { return t_current_device; }
bool isLazy() { return g_lazy.load(); }
bool isTorchAccelerator() { return g_torch_accelerator.load(); }

void setCurrentDevice(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < deviceCount(), "Invalid device hpu:", static_cast<int>(index), ": ",
              static_cast<int>(deviceCount()), " virtual HPU device(s) configured (VIRTUAL_HPU_DEVICES)");
  t_current_device = index;
}

c10::DeviceIndex resolveIndex(std::optional<c10::Device> device) {
  c10::DeviceIndex index = device && device->has_index() ? device->index() : currentDevice();
  TORCH_CHECK(index >= 0 && index < deviceCount(), "Invalid device hpu:", static_cast<int>(index), ": ",
              static_cast<int>(deviceCount()), " virtual HPU device(s) configured (VIRTUAL_HPU_DEVICES)");
  return index;
}

}  // namespace virtual_hpu

namespace at {
namespace {

// What torch asks of the device's hooks, whichever interface it asks through.
template <typename Interface>
struct DeviceHooks : Interface {
  void init() const override {}
  // torch picks its accelerator among the device types whose hooks say they are built (see set_torch_accelerator)
  bool isBuilt() const VIRTUAL_HPU_OVERRIDE_SINCE_2_7 { return virtual_hpu::isTorchAccelerator(); }
  bool isAvailable() const VIRTUAL_HPU_OVERRIDE_SINCE_2_7 {
    return virtual_hpu::isTorchAccelerator() && virtual_hpu::deviceCount() > 0;
  }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return virtual_hpu::deviceCount(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { virtual_hpu::setCurrentDevice(device); }
  c10::DeviceIndex getCurrentDevice() const override { return virtual_hpu::currentDevice(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    c10::DeviceIndex previous = virtual_hpu::currentDevice();
    virtual_hpu::setCurrentDevice(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }
  // Random numbers for HPU tensors come from the CPU generator, so seeded runs match CPU runs.
  const Generator& getDefaultGenerator(c10::DeviceIndex /*device_index*/) const override {
    return detail::getDefaultCPUGenerator();
  }
  Device getDeviceFromPtr(void* /*data*/) const override {
    return {virtual_hpu::kDeviceType, virtual_hpu::currentDevice()};
  }
  bool isPinnedPtr(const void* data) const override { return virtual_hpu::isPinned(data); }
  Allocator* getPinnedMemoryAllocator() const override { return virtual_hpu::pinnedAllocator(); }
};

}  // namespace

#ifdef VIRTUAL_HPU_PRIVATEUSE1

struct VirtualHpuPrivateUse1Hooks final : DeviceHooks<PrivateUse1HooksInterface> {
  // PrivateUse1's interface has no default for these two. `torch.Generator("hpu")`: a CPU generator, as the default.
  Generator getNewGenerator(c10::DeviceIndex /*device_index*/) const override {
    return make_generator<CPUGeneratorImpl>(default_rng_seed_val);
  }
  // `untyped_storage().resize_()`: new memory from the allocator of the storage's device, the old bytes copied. Not
  // torch's resize_bytes_cpu: resized to 0 bytes, its storage would be on the CPU (FSDP frees parameters so).
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    const c10::DeviceGuard on(storage.device());
    c10::DataPtr data = impl->allocator()->allocate(newsize);
    const size_t kept = std::min(newsize, impl->nbytes());
    if (kept > 0) std::memcpy(data.get(), impl->data(), kept);
    impl->set_data_ptr_noswap(std::move(data));
    impl->set_nbytes(newsize);
  }
};

namespace {
[[maybe_unused]] const bool g_hooks_registered = [] {
  static VirtualHpuPrivateUse1Hooks hooks;
  RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}();
}  // namespace

#else

// Named `HPUHooks` because torch looks the hooks up by that name.
struct HPUHooks final : DeviceHooks<HPUHooksInterface> {
  explicit HPUHooks(HPUHooksArgs /*args*/) {}
  bool hasHPU() const override { return virtual_hpu::isTorchAccelerator(); }
};

REGISTER_HPU_HOOKS(HPUHooks);

#endif

}  // namespace at
