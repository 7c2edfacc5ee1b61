// The boxed fallback: any other aten op on HPU tensors runs its CPU kernel on the same memory.
#include "virtual_hpu.h"

#include <ATen/core/List.h>
#include <ATen/core/stack.h>

namespace virtual_hpu {
namespace {

// Applies `map` to every tensor in `value`: a tensor, an optional tensor, or (nested) lists of them.
template <typename Map>
c10::IValue mapTensors(const c10::IValue& value, const Map& map) {
  if (value.isTensor()) return map(value.toTensor());
  if (value.isTensorList()) {
    c10::List<at::Tensor> mapped;
    for (const at::Tensor& t : value.toTensorList()) mapped.push_back(map(t));
    return mapped;
  }
  if (value.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> mapped;
    for (const std::optional<at::Tensor>& t : value.toOptionalTensorList()) {
      mapped.push_back(t ? std::optional<at::Tensor>(map(*t)) : std::nullopt);
    }
    return mapped;
  }
  if (value.isList()) {  // e.g. Tensor[][] of collectives
    c10::impl::GenericList mapped(value.toList().elementType());
    for (const c10::IValue& element : value.toList()) mapped.push_back(mapTensors(element, map));
    return mapped;
  }
  return value;
}

}  // namespace

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
    } else if (value.isDevice() && value.toDevice().is_hpu()) {
      index = resolveIndex(value.toDevice());
      value = c10::Device(c10::DeviceType::CPU);
    } else {
      value = mapTensors(value, toCpu);
    }
  }
  const c10::DeviceIndex device = index ? *index : currentDevice();

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  for (const auto& [hpu, cpu] : mutated) CpuAliases::writeBack(hpu, cpu);
  auto toHpu = [&](const at::Tensor& t) { return aliases.toHpu(t, device); };
  for (size_t i = stack->size() - op.schema().returns().size(); i < stack->size(); ++i) {
    (*stack)[i] = mapTensors((*stack)[i], toHpu);
  }
}

}  // namespace virtual_hpu
