// The aten kernels the HPU key needs of its own: allocation, copies, views and storage changes.
#include "virtual_hpu.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#ifdef VIRTUAL_HPU_PRIVATEUSE1
#include <ATen/native/transformers/attention.h>
#endif
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <string>
#include <string_view>

namespace virtual_hpu {
namespace {

at::Tensor empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> /*layout*/,
                 std::optional<c10::Device> device, std::optional<bool> /*pin_memory*/,
                 std::optional<c10::MemoryFormat> memory_format) {
  const c10::ScalarType type = c10::dtype_or_default(dtype);
  checkDtype(type);
  return at::detail::empty_generic(size, allocatorFor(resolveIndex(device)), c10::DispatchKeySet(kDispatchKey),
                                   type, memory_format);
}

at::Tensor emptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                        std::optional<c10::Layout> /*layout*/, std::optional<c10::Device> device,
                        std::optional<bool> /*pin_memory*/) {
  const c10::ScalarType type = c10::dtype_or_default(dtype);
  checkDtype(type);
  return at::detail::empty_strided_generic(size, stride, allocatorFor(resolveIndex(device)),
                                           c10::DispatchKeySet(kDispatchKey), type);
}

// Whether float32 holds every value of `type` exactly (float32 itself, and all types of 16 bits or less), so that a
// copy from it into a float64 HPU tensor needs no rounding.
bool fitsInFloat32(c10::ScalarType type) { return type == c10::ScalarType::Float || c10::elementSize(type) <= 2; }

// Every transfer to or from the device runs as a CPU copy between aliases of the same memory.
at::Tensor copyFrom(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  if (isHpu(self) && !isHpu(dst)) {
    countHostSync();
  } else {
    countOp(isLazy() ? tensorDigest(tensorDigest(0x636f7079, self), dst) : 0);
  }
  CpuAliases aliases;
  at::Tensor source = isHpu(self) ? aliases.toCpu(c10::MaybeOwned<at::Tensor>::borrowed(self)) : self;
  at::Tensor target = isHpu(dst) ? aliases.toCpu(c10::MaybeOwned<at::Tensor>::borrowed(dst)) : dst;
  target.copy_(source);
  if (isHpu(dst) && !fitsInFloat32(source.scalar_type())) roundToFloat(target);
  return dst;
}

at::Tensor copyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copyFrom(self, dst, false);
}

c10::Scalar localScalarDense(const at::Tensor& self) {
  countHostSync();
  CpuAliases aliases;
  return at::native::_local_scalar_dense_cpu(aliases.toCpu(c10::MaybeOwned<at::Tensor>::borrowed(self)));
}

// Storages set into HPU tensors must be HPU storages.
at::Tensor& setStorage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                       c10::IntArrayRef stride) {
  TORCH_CHECK(isHpu(source.device()), "set_: expected a storage on hpu, got one on ", source.device());
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

at::Tensor& setWholeStorage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return setStorage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& setTensor(at::Tensor& self, const at::Tensor& source) {
  return setStorage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& setEmpty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocatorFor(resolveIndex(self.device())), true);
  return setStorage(self, std::move(storage), 0, {0}, {});
}

// The HPU key needs a kernel of its own for every aten op that has both a CPU kernel and a composite one: else
// the dispatcher prefers the composite (e.g. math_native_layer_norm, which computes and returns fp32 for bf16
// inputs) and the op no longer behaves as on a device with its own kernel. The CPU kernel, run by the fallback, is
// what Gaudi's own kernels do: the same dtype rules, mixed bf16/fp16 activations with fp32 parameters included.
void registerCpuKernelsOverComposites(torch::Library& m) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    const std::string_view full = name.name;
    if (full.rfind("aten::", 0) != 0) continue;
    const auto op = dispatcher.findOp(name);
    if (!op || op->hasKernelForDispatchKey(kDispatchKey) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        !(op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))) {
      continue;
    }
    std::string qualified(full.substr(6));
    if (!name.overload_name.empty()) qualified += "." + name.overload_name;
    m.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&hpuFallback>());
  }
}

// transformers' mixture-of-experts layers count the tokens routed to each expert with histc on int32 ids when on an
// accelerator. Gaudi counts integer tensors; the host kernel takes floating ones only: count float copies (exact for
// such ids) and return the input's type.
void histc(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const size_t first = stack->size() - op.schema().arguments().size();
  const c10::ScalarType type = (*stack)[first].toTensor().scalar_type();
  const bool integral = !at::isFloatingType(type);
  if (integral) (*stack)[first] = (*stack)[first].toTensor().to(c10::ScalarType::Float);
  hpuFallback(op, keys, stack);
  if (integral) stack->back() = stack->back().toTensor().to(type);
}

#ifdef VIRTUAL_HPU_PRIVATEUSE1
// `param.data = tensor` between hpu and cpu, which torch allows for its HPU device type but, by this check, not for a
// PrivateUse1 one.
bool hasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.key_set().has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && (t.is_cpu() || isHpu(t));
  };
  return (dense(self) && dense(from)) || self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}
#endif

// Host memory is written synchronously: no stream can still be using a tensor's memory when it is freed.
void recordStream(at::Tensor& /*self*/, c10::Stream /*stream*/) {}

VIRTUAL_HPU_LIBRARY_IMPL(aten, m) {
  m.impl("empty.memory_format", &empty);
  m.impl("empty_strided", &emptyStrided);
  m.impl("_copy_from", &copyFrom);
  m.impl("_copy_from_and_resize", &copyFromAndResize);
  m.impl("_local_scalar_dense", &localScalarDense);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("view", &at::native::view);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("resize_", &at::native::resize_);
  m.impl("set_.source_Storage", &setWholeStorage);
  m.impl("set_.source_Storage_storage_offset", &setStorage);
  m.impl("set_.source_Tensor", &setTensor);
  m.impl("set_", &setEmpty);
  m.impl("record_stream", &recordStream);
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&histc>());
  // Without these, convolution would look for convolution_overrideable, which has no CPU kernel.
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&hpuFallback>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&hpuFallback>());
  // The CPU choice reads only metadata, but through the fallback's aliases it would not see which inputs require
  // grad and could pick a fused kernel that cannot differentiate an attention bias that does.
  m.impl("_fused_sdp_choice", &at::native::_fused_sdp_choice_cpp);
#ifdef VIRTUAL_HPU_PRIVATEUSE1
  m.impl("_has_compatible_shallow_copy_type", &hasCompatibleShallowCopyType);
#endif
  registerCpuKernelsOverComposites(m);
}

VIRTUAL_HPU_LIBRARY_IMPL(_, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&hpuFallback>()); }

#ifdef VIRTUAL_HPU_PRIVATEUSE1
// The op is composite (CompositeImplicitAutograd): with a backend kernel of ours, torch 2.9 leaves its autograd key
// without one ("Could not run ... from the 'Autogradhpu' backend" in `module.to("hpu")`). A query with no gradient, so
// the same kernel serves there on every torch.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", &hasCompatibleShallowCopyType);
}

#if VIRTUAL_HPU_REGISTERS_PRIVATEUSE1_AUTOGRAD_FALLBACK
// The fallback torch has for its other autograd keys, which torch 2.10 registers for PrivateUse1 itself: without it the
// fp8 ops, the c10d collectives and every other custom op without an autograd kernel fail on hpu.
TORCH_LIBRARY_IMPL(_, AutogradPrivateUse1, m) { m.fallback(torch::autograd::basicAutogradNotImplementedFallback()); }
#endif
#endif

}  // namespace

void checkDtype(c10::ScalarType dtype) {
  const char* name = dtype == c10::ScalarType::ComplexFloat    ? "torch.complex64"
                     : dtype == c10::ScalarType::ComplexDouble ? "torch.complex128"
                                                               : nullptr;
  TORCH_CHECK_TYPE(name == nullptr, "Gaudi does not support ", name,
                   " tensors on hpu (no complex support); keep this tensor on the CPU");
  // the message of Gaudi's own software
  TORCH_CHECK(dtype != c10::ScalarType::Half || fp16Supported(), "float16/half is not supported on Gaudi.");
  if (dtype == c10::ScalarType::Double) {
    TORCH_WARN_ONCE("Gaudi computes torch.float64 tensors on hpu in torch.float32: their values have float32 "
                    "precision. Keep data that needs float64 on the CPU.");
  }
}

void roundToFloat(const at::Tensor& cpu) {
  if (cpu.defined() && cpu.scalar_type() == c10::ScalarType::Double && cpu.numel() > 0) {
    cpu.copy_(cpu.to(c10::ScalarType::Float));
  }
}

}  // namespace virtual_hpu

#ifdef VIRTUAL_HPU_PRIVATEUSE1
// For a PrivateUse1 device, scaled_dot_product_attention asks this dispatch stub instead of the `_fused_sdp_choice` op.
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &_fused_sdp_choice_cpp);
}  // namespace at::native
#endif
