// Direct (unboxed) HPU kernels for the ops training runs most: the same CPU kernel on aliases of the same memory as
// the boxed fallback, without packing the arguments into a stack of IValues. Copying an HPU tensor into a stack changes
// its reference count, which for a tensor with a Python object takes the GIL: these kernels borrow their arguments.
#include "virtual_hpu.h"

#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/_log_softmax_backward_data_native.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_native.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_softmax_backward_data_native.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_native.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/abs_ops.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addcdiv_ops.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/addmm_native.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/baddbmm_native.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bmm_native.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/clamp_ops.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/exp_native.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/gelu_backward_native.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_native.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/lerp_ops.h>
#include <ATen/ops/maximum_native.h>
#include <ATen/ops/maximum_ops.h>
#include <ATen/ops/mean_native.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_native.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <ATen/ops/pow_native.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/rsqrt_native.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sigmoid_backward_native.h>
#include <ATen/ops/sigmoid_backward_ops.h>
#include <ATen/ops/sigmoid_native.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_backward_native.h>
#include <ATen/ops/silu_backward_ops.h>
#include <ATen/ops/silu_native.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_native.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_backward_native.h>
#include <ATen/ops/tanh_backward_ops.h>
#include <ATen/ops/tanh_native.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/threshold_backward_native.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/where_ops.h>
#include <ATen/ops/zero_ops.h>
#include <torch/library.h>

#include <atomic>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace virtual_hpu {
namespace {

// Set from Python for hosts whose CPU has no bf16 (or fp16) matrix instructions: there torch's own low-precision
// matmul is about a hundred times slower than fp32's.
std::atomic<bool> g_widen_bf16_matmul{false};
std::atomic<bool> g_widen_fp16_matmul{false};

// The low precision a matmul's tensors share, when the host computes it faster in fp32: one rounding of an fp32
// accumulation, as Gaudi's matrix engine does. Mixed dtypes stay with the CPU kernel, which refuses them.
template <class... Args>
std::optional<c10::ScalarType> matmulToWiden(const Args&... args) {
  std::optional<c10::ScalarType> shared;
  bool same = true;
  auto see = [&](const auto& arg) {
    if constexpr (std::is_same_v<std::decay_t<decltype(arg)>, at::Tensor>) {
      if (!shared) shared = arg.scalar_type();
      same = same && arg.scalar_type() == *shared;
    }
  };
  (see(args), ...);
  if (!shared || !same) return std::nullopt;
  const bool widen = (*shared == c10::ScalarType::BFloat16 && g_widen_bf16_matmul.load(std::memory_order_relaxed)) ||
                     (*shared == c10::ScalarType::Half && g_widen_fp16_matmul.load(std::memory_order_relaxed));
  return widen ? shared : std::nullopt;
}

// The arguments of one call as the CPU kernel takes them, with the device check and the lazy-mode digest.
class Arguments {
 public:
  // `widen`: tensors go to the kernel in fp32 (see matmulToWiden).
  Arguments(uint64_t digest, bool widen) : widen_(widen), digest_(digest) {}

  at::Tensor cpu(const at::Tensor& t, bool written) {
    if (lazy_) digest_ = tensorDigest(digest_, t);
    if (!t.defined()) return t;
    devices_.see(t);
    at::Tensor cpu = isHpu(t) ? aliases_.toCpu(c10::MaybeOwned<at::Tensor>::borrowed(t), written) : t;
    return widen_ ? cpu.to(c10::ScalarType::Float) : cpu;
  }
  std::optional<at::Tensor> cpu(const std::optional<at::Tensor>& t, bool written) {
    return t ? std::optional<at::Tensor>(cpu(*t, written)) : std::nullopt;
  }
  // Everything else (scalars, sizes, flags) passes as it is.
  template <class T>
  const T& cpu(const T& value, bool /*written*/) {
    return value;
  }

  // Checks the devices and counts the op once all its arguments are seen.
  void ready(const char* name) {
    devices_.check(name);
    countOp(lazy_ ? digest_ : 0);
  }

  CpuAliases& aliases() { return aliases_; }
  c10::DeviceIndex device() const { return devices_.index(); }

 private:
  const bool lazy_ = isLazy();
  const bool widen_;
  uint64_t digest_;
  DeviceCheck devices_;
  CpuAliases aliases_;
};

// HPU results of the CPU kernel's results.
template <class Result>
Result toHpu(Arguments& arguments, Result&& result) {
  if constexpr (std::is_same_v<std::decay_t<Result>, at::Tensor>) {
    return arguments.aliases().toHpu(result, arguments.device());
  } else {
    return std::apply([&](auto&&... each) { return Result(toHpu(arguments, std::move(each))...); }, std::move(result));
  }
}

// Torch's structured CPU kernel for an op (its meta and impl halves, `Native`), with the output allocated on the device
// and handed to the kernel as a CPU alias: the result needs no CPU allocation of its own to adopt, which is most of
// what an out-of-place op costs beyond the CPU's, and comes from the device's pool.
template <class Native>
class DeviceOutput final : public Native {
 public:
  explicit DeviceOutput(Arguments& arguments) : arguments_(arguments) {}

  const at::Tensor& maybe_get_output(int64_t /*index*/) override { return cpu_; }

  // Kernels that take an output of any strides: TensorIterator's, which must also see it, and reductions, matmuls and
  // softmaxes, which ask for a dense one (no strides).
  void set_output_raw_strided(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options VIRTUAL_HPU_OUTPUT_NAMES_PARAM) override {
    allocate(sizes, strides, options);
    if constexpr (std::is_base_of_v<at::TensorIteratorBase, Native>)
      Native::set_output_raw_strided(index, sizes, strides, options VIRTUAL_HPU_OUTPUT_NAMES_ARG);
  }

  // Kernels that need these very strides.
  void set_output_strided(int64_t /*index*/, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          c10::TensorOptions options VIRTUAL_HPU_OUTPUT_NAMES_PARAM) override {
    allocate(sizes, strides, options);
  }

  const at::Tensor& cpu() const { return cpu_; }
  at::Tensor take() { return std::move(hpu_); }

 private:
  void allocate(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::TensorOptions options) {
    const c10::ScalarType dtype = options.dtype().toScalarType();
    checkDtype(dtype);
    c10::Allocator* allocator = allocatorFor(arguments_.device());
    const c10::DispatchKeySet keys(kDispatchKey);
    // no strides: dense in the options' memory format
    hpu_ = strides.empty() ? at::detail::empty_generic(sizes, allocator, keys, dtype, options.memory_format_opt())
                           : at::detail::empty_strided_generic(sizes, strides, allocator, keys, dtype);
    // written: float64 values are rounded as Gaudi stores them once the kernel is done
    cpu_ = arguments_.aliases().toCpu(c10::MaybeOwned<at::Tensor>::borrowed(hpu_), /*written=*/true);
  }

  Arguments& arguments_;
  at::Tensor hpu_;
  at::Tensor cpu_;
};

// `Native`: the op's structured CPU kernel class, run with a device output (DeviceOutput); void: the CPU kernel through
// the dispatcher. `kMatmul`: a matrix product, computed in fp32 where the host multiplies its low precision slowly.
// `kContiguous`: the result is contiguous whatever its inputs' layout, as torch's fake tensors take hpu's results of
// add, sub, mul and div to be (torch._subclasses.fake_impls: hpu does not support non-contiguous outputs); compiled
// graphs plan their views on those fake strides.
template <class Op, class Native = void, bool kMatmul = false, bool kContiguous = false,
          class Signature = typename Op::schema>
struct Direct;

template <class Op, class Native, bool kMatmul, bool kContiguous, class Result, class... Args>
struct Direct<Op, Native, kMatmul, kContiguous, Result(Args...)> {
  // Arguments the schema marks as written are the non-const tensor references: `self` of in-place ops, `out`.
  template <class Arg>
  static constexpr bool kWritten = std::is_same_v<Arg, at::Tensor&>;

  static Result run(Args... args) {
    static const uint64_t name = nameDigest(Op::name, Op::overload_name);
    std::optional<c10::ScalarType> narrow;
    if constexpr (kMatmul) narrow = matmulToWiden(args...);
    Arguments arguments(name, narrow.has_value());
    // Braced initialisation converts the arguments in order; the aliases outlive this tuple.
    std::tuple<std::decay_t<decltype(arguments.cpu(args, kWritten<Args>))>...> cpu{
        arguments.cpu(args, kWritten<Args>)...};
    arguments.ready(Op::name);
    const c10::DispatchKeySet keys(c10::DispatchKey::CPU);
    if constexpr (std::is_void_v<Result>) {
      std::apply([&](auto&... each) { Op::redispatch(keys, each...); }, cpu);
      arguments.aliases().finishWrites();
    } else if constexpr (std::is_same_v<Result, at::Tensor&>) {
      // In-place and out= ops return the tensor they wrote: the caller's own.
      std::apply([&](auto&... each) { Op::redispatch(keys, each...); }, cpu);
      arguments.aliases().finishWrites();
      return written(args...);
    } else {
      if constexpr (!std::is_void_v<Native>) {
        // a widened matmul computes in fp32: its fp32 result is rounded to a new tensor below
        if (!narrow) {
          // the aliases (inside `arguments`) borrow the output, so `kernel` is declared after them and dies first
          DeviceOutput<Native> kernel(arguments);
          std::apply([&](auto&... each) { kernel.meta(each...); }, cpu);
          std::apply([&](auto&... each) { kernel.impl(each..., kernel.cpu()); }, cpu);
          arguments.aliases().finishWrites();
          if constexpr (kContiguous) return kernel.take().contiguous();
          return kernel.take();
        }
      }
      Result result = std::apply([&](auto&... each) { return Op::redispatch(keys, each...); }, cpu);
      if constexpr (kMatmul) {
        if (narrow) result = result.to(*narrow);
      }
      arguments.aliases().finishWrites();
      return toHpu(arguments, std::move(result));
    }
  }

  // The one written argument of an op that returns a reference to it.
  template <class First, class... Rest>
  static at::Tensor& written(First&& first, Rest&&... rest) {
    if constexpr (std::is_same_v<First&&, at::Tensor&>) {
      return first;
    } else {
      static_assert(sizeof...(Rest) > 0, "an op returning a tensor reference writes one of its arguments");
      return written(std::forward<Rest>(rest)...);
    }
  }

  static void registerIn(torch::Library& m) {
    std::string qualified = Op::name;
    if (*Op::overload_name != '\0') qualified += std::string(".") + Op::overload_name;
    m.impl(qualified.c_str(), TORCH_FN(run));
  }
};

template <class... Ops>
void registerDirect(torch::Library& m) {
  (Direct<Ops>::registerIn(m), ...);
}

template <class... Kernels>
void registerKernels(torch::Library& m) {
  (Kernels::registerIn(m), ...);
}

void widenLowPrecisionMatmuls(bool bf16, bool fp16) {
  g_widen_bf16_matmul = bf16;
  g_widen_fp16_matmul = fp16;
}

TORCH_LIBRARY_FRAGMENT(virtual_hpu, m) {
  m.def("widen_low_precision_matmuls(bool bf16, bool fp16) -> ()", &widenLowPrecisionMatmuls);
}

// What an optimizer step (SGD, Adam, AdamW: one tensor at a time, as torch runs them on hpu), the forward and backward
// of linear layers, normalizations, activations and losses call per step.
VIRTUAL_HPU_LIBRARY_IMPL(aten, m) {
  namespace ops = at::_ops;
  namespace native = at::native;
  // out-of-place elementwise ops: the CPU kernel writes straight into device memory
  registerKernels<Direct<ops::add_Tensor, native::structured_ufunc_add_CPU, false, true>,
                  Direct<ops::sub_Tensor, native::structured_sub_out, false, true>,
                  Direct<ops::mul_Tensor, native::structured_mul_out, false, true>,
                  Direct<ops::div_Tensor, native::structured_div_out, false, true>,
                  Direct<ops::neg, native::structured_neg_out>,
                  Direct<ops::exp, native::structured_exp_out>, Direct<ops::sqrt, native::structured_sqrt_out>,
                  Direct<ops::rsqrt, native::structured_rsqrt_out>,
                  Direct<ops::pow_Tensor_Scalar, native::structured_pow_Tensor_Scalar_out>,
                  Direct<ops::maximum, native::structured_maximum_out>,
                  Direct<ops::gelu, native::structured_gelu_out_cpu>,
                  Direct<ops::gelu_backward, native::structured_gelu_backward_out_cpu>,
                  Direct<ops::silu, native::structured_silu_out>,
                  Direct<ops::silu_backward, native::structured_silu_backward_out>,
                  Direct<ops::tanh, native::structured_tanh_out>,
                  Direct<ops::tanh_backward, native::structured_tanh_backward_out>,
                  Direct<ops::sigmoid, native::structured_sigmoid_out>,
                  Direct<ops::sigmoid_backward, native::structured_sigmoid_backward_out>,
                  Direct<ops::threshold_backward, native::structured_threshold_backward_out>>(m);
  registerDirect<ops::add__Tensor, ops::add_Scalar, ops::sub__Tensor, ops::mul__Tensor, ops::mul__Scalar,
                 ops::div__Tensor, ops::div__Scalar, ops::abs, ops::clamp, ops::where_self, ops::addcmul_,
                 ops::addcdiv_, ops::lerp__Scalar, ops::fill__Scalar, ops::zero_>(m);
  // matmuls, reductions and softmaxes: the CPU kernel writes a dense result straight into device memory too
  registerKernels<Direct<ops::mm, native::structured_mm_out_cpu, true>,
                  Direct<ops::bmm, native::structured_bmm_out_cpu, true>,
                  Direct<ops::addmm, native::structured_addmm_out_cpu, true>,
                  Direct<ops::baddbmm, native::structured_baddbmm_out_cpu, true>,
                  Direct<ops::sum_dim_IntList, native::structured_sum_out>,
                  Direct<ops::mean_dim, native::structured_mean_out>,
                  Direct<ops::_softmax, native::structured_softmax_cpu_out>,
                  Direct<ops::_softmax_backward_data, native::structured_softmax_backward_cpu_out>,
                  Direct<ops::_log_softmax, native::structured_log_softmax_cpu_out>,
                  Direct<ops::_log_softmax_backward_data, native::structured_log_softmax_backward_cpu_out>>(m);
  registerDirect<ops::relu, ops::nll_loss_forward, ops::nll_loss_backward, ops::native_layer_norm,
                 ops::native_layer_norm_backward>(m);
}

}  // namespace
}  // namespace virtual_hpu
