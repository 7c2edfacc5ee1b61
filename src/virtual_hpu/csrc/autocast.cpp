// torch.autocast("hpu"): one boxed casting kernel per policy, registered at run time for listed ops.
#include "virtual_hpu.h"

#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include <atomic>
#include <memory>

namespace virtual_hpu {
namespace {

std::atomic<bool> g_fp16_supported{true};
std::unique_ptr<torch::Library> g_registrations;

at::Tensor castTensor(const at::Tensor& t, c10::ScalarType to) {
  return t.defined() ? at::autocast::cached_cast(to, t, kDeviceType) : t;
}

// Casts the tensor arguments of the call on `stack` (all of them, or the first only) and runs the op
// without autocast, as torch's own autocast wrappers do.
void castAndCall(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::ScalarType to, bool first_only) {
  const size_t count = op.schema().arguments().size();
  bool done = false;
  for (size_t i = stack->size() - count; i < stack->size() && !done; ++i) {
    c10::IValue& value = (*stack)[i];
    if (value.isTensor()) {
      value = castTensor(value.toTensor(), to);
      done = first_only;
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> cast;
      for (const at::Tensor& t : value.toTensorList()) cast.push_back(castTensor(t, to));
      value = std::move(cast);
      done = first_only;
    }
  }
  c10::impl::ExcludeDispatchKeyGuard no_autocast(kAutocastKey);
  op.callBoxed(stack);
}

c10::ScalarType lowerPrecision() {
  const c10::ScalarType dtype = at::autocast::get_autocast_dtype(kDeviceType);
  TORCH_CHECK(dtype != c10::ScalarType::Half || g_fp16_supported.load(),
              "torch.float16 autocast is not supported on first-generation Gaudi (VIRTUAL_HPU_GENERATION=GAUDI); "
              "use torch.bfloat16");
  return dtype;
}

void castLower(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  castAndCall(op, stack, lowerPrecision(), false);
}

// For normalizations: their CPU kernels take a low-precision input with fp32 parameters, and casting the
// running statistics would lose their in-place updates.
void castLowerInput(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  castAndCall(op, stack, lowerPrecision(), true);
}

void castFp32(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  castAndCall(op, stack, c10::ScalarType::Float, false);
}

// Replaces all casting kernels; names are `op` or `op.overload` in the aten namespace.
void setAutocastOps(std::vector<std::string> lower, std::vector<std::string> lower_input,
                    std::vector<std::string> fp32) {
  g_registrations.reset();
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", kAutocastKey,
                                                  __FILE__, __LINE__);
  for (const auto& name : lower) library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&castLower>());
  for (const auto& name : lower_input) {
    library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&castLowerInput>());
  }
  for (const auto& name : fp32) library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&castFp32>());
  g_registrations = std::move(library);
}

TORCH_LIBRARY_FRAGMENT(virtual_hpu, m) {
  m.def("set_autocast_ops(str[] lower, str[] lower_input, str[] fp32) -> ()", &setAutocastOps);
  m.def("set_fp16_supported(bool supported) -> ()", [](bool supported) { g_fp16_supported = supported; });
}

// Ops without a casting kernel pass straight through autocast.
VIRTUAL_HPU_AUTOCAST_LIBRARY_IMPL(_, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

}  // namespace

bool fp16Supported() { return g_fp16_supported.load(); }

}  // namespace virtual_hpu
