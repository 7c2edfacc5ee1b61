// The boxed fallback: any other aten op on HPU tensors runs its CPU kernel on the same memory.
#include "virtual_hpu.h"

#include <ATen/core/List.h>
#include <ATen/core/stack.h>

#include <algorithm>
#include <array>
#include <string_view>

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

// Ops whose CUDA kernels accept CPU index tensors next to device tensors; elsewhere only 0-dim CPU tensors may mix.
bool acceptsCpuTensors(std::string_view name) {
  static const std::array<std::string_view, 6> ops = {"aten::index",     "aten::index_put_", "aten::_index_put_impl_",
                                                      "aten::index_put", "aten::_unsafe_index", "aten::_unsafe_index_put"};
  return std::find(ops.begin(), ops.end(), name) != ops.end();
}

}  // namespace

void hpuFallback(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  countOp(isLazy() ? opDigest(op, *stack, first) : 0);
  CpuAliases aliases;
  DeviceCheck devices;
  std::optional<c10::DeviceIndex> requested;  // from a `device=` argument

  // Tensors in lists are copied out of lists that are then replaced: the aliases keep them.
  auto listElementToCpu = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    devices.see(t);
    return isHpu(t) ? aliases.toCpu(c10::MaybeOwned<at::Tensor>::owned(at::Tensor(t))) : t;
  };

  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (value.isTensor()) {
      // moved, not copied, out of the stack: no reference count to change
      at::Tensor tensor = std::move(value).toTensor();
      if (tensor.defined()) devices.see(tensor);
      if (tensor.defined() && isHpu(tensor)) {
        const auto* alias_info = arguments[i].alias_info();
        const bool written = alias_info != nullptr && alias_info->isWrite();
        value = aliases.toCpu(c10::MaybeOwned<at::Tensor>::owned(std::move(tensor)), written);
      } else {
        value = std::move(tensor);
      }
    } else if (value.isDevice() && isHpu(value.toDevice())) {
      requested = resolveIndex(value.toDevice());
      value = c10::Device(c10::DeviceType::CPU);
    } else {
      value = mapTensors(value, listElementToCpu);
    }
  }
  devices.check(op.operator_name().name);
  const c10::DeviceIndex device = requested ? *requested : devices.index();

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  aliases.finishWrites();
  auto toHpu = [&](const at::Tensor& t) { return aliases.toHpu(t, device); };
  for (size_t i = stack->size() - op.schema().returns().size(); i < stack->size(); ++i) {
    (*stack)[i] = mapTensors((*stack)[i], toHpu);
  }
}

void DeviceCheck::check(std::string_view op) const {
  TORCH_CHECK(!hpu_ || !cpu_ || acceptsCpuTensors(op), "Expected all tensors to be on the same device, but found at "
              "least two devices, ", *hpu_, " and ", *cpu_, "! (when running ", op, ")");
}

c10::DeviceIndex DeviceCheck::index() const { return hpu_ ? hpu_->index() : currentDevice(); }

void DeviceCheck::refuseTwoDevices(c10::Device first, c10::Device second) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", first, " and ",
              second, "!");
}

}  // namespace virtual_hpu
