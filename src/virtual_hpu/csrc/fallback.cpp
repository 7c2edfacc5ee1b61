// The boxed fallback: any other aten op on HPU tensors runs its CPU kernel on the same memory.
#include "virtual_hpu.h"

#include <ATen/core/List.h>
#include <ATen/core/stack.h>

namespace virtual_hpu {

void hpuFallback(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
  countOp();
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  CpuAliases aliases;
  std::optional<c10::DeviceIndex> index;
  std::vector<std::pair<at::Tensor, at::Tensor>> mutated;  // (HPU original, CPU alias)

  auto toCpu = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || !t.is_hpu()) return t;
    if (!index) index = t.device().index();
    return aliases.toCpu(t);
  };

  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (value.isTensor()) {
      at::Tensor hpu = value.toTensor();
      at::Tensor cpu = toCpu(hpu);
      const auto* alias_info = arguments[i].alias_info();
      if (hpu.is_hpu() && alias_info != nullptr && alias_info->isWrite()) mutated.emplace_back(hpu, cpu);
      value = std::move(cpu);
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> cpu;
      for (const at::Tensor& t : value.toTensorList()) cpu.push_back(toCpu(t));
      value = std::move(cpu);
    } else if (value.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> cpu;
      for (const std::optional<at::Tensor>& t : value.toOptionalTensorList()) {
        cpu.push_back(t ? std::optional<at::Tensor>(toCpu(*t)) : std::nullopt);
      }
      value = std::move(cpu);
    } else if (value.isDevice() && value.toDevice().is_hpu()) {
      index = resolveIndex(value.toDevice());
      value = c10::Device(c10::DeviceType::CPU);
    }
  }
  const c10::DeviceIndex device = index ? *index : currentDevice();

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  for (const auto& [hpu, cpu] : mutated) CpuAliases::writeBack(hpu, cpu);
  const size_t results = op.schema().returns().size();
  for (size_t i = stack->size() - results; i < stack->size(); ++i) {
    c10::IValue& value = (*stack)[i];
    if (value.isTensor()) {
      value = aliases.toHpu(value.toTensor(), device);
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> hpu;
      for (const at::Tensor& t : value.toTensorList()) hpu.push_back(aliases.toHpu(t, device));
      value = std::move(hpu);
    }
  }
}

}  // namespace virtual_hpu
