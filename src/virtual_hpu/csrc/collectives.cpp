// c10d collectives on HPU tensors: the group's hpu backend (gloo) works on CPU aliases of the same memory, HCCL's
// reduce ops are enforced, and the work's future hands back the HPU tensors (DDP builds its gradient views from them).
#include "virtual_hpu.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#include <torch/library.h>

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace virtual_hpu {
namespace {

const char* reduceOpName(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

// HCCL reduces with SUM, MIN and MAX only.
void checkReduceOp(const c10::IValue& value) {
  const c10d::ReduceOp::RedOpType op = value.toCustomClass<c10d::ReduceOp>()->op_;
  TORCH_CHECK(op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::MIN || op == c10d::ReduceOp::MAX,
              "HCCL supports the reduce ops SUM, MIN and MAX on hpu tensors, got ReduceOp.", reduceOpName(op),
              (op == c10d::ReduceOp::AVG ? "; for a mean, reduce with SUM and divide by the world size" : ""));
}

template <typename Visit>
void forEachTensor(const c10::IValue& value, const Visit& visit) {
  if (value.isTensor()) {
    visit(value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) forEachTensor(element, visit);
  }
}

// Maps CPU aliases found in a future's value to HPU tensors on the memory they alias: the original argument when
// the geometry matches, otherwise a view of it (gloo's allgather_into_tensor completes with chunks of the output).
class HpuTensors {
 public:
  void add(const at::Tensor& t) {
    if (t.defined() && isHpu(t)) tensors_.push_back(t);
  }

  at::Tensor toHpu(const at::Tensor& cpu) const {
    if (!cpu.defined() || isHpu(cpu)) return cpu;
    const void* base = cpu.storage().data();
    for (const at::Tensor& hpu : tensors_) {
      if (hpu.storage().data() != base || hpu.scalar_type() != cpu.scalar_type()) continue;
      if (hpu.sizes() == cpu.sizes() && hpu.strides() == cpu.strides() &&
          hpu.storage_offset() == cpu.storage_offset()) {
        return hpu;
      }
      return hpu.as_strided(cpu.sizes(), cpu.strides(), cpu.storage_offset());
    }
    return cpu;
  }

  c10::IValue toHpu(const c10::IValue& value) const {
    if (value.isTensor()) return toHpu(value.toTensor());
    if (value.isTensorList()) {
      c10::List<at::Tensor> mapped;
      for (const at::Tensor& t : value.toTensorList()) mapped.push_back(toHpu(t));
      return mapped;
    }
    if (value.isList()) {
      c10::impl::GenericList mapped(value.toList().elementType());
      for (const c10::IValue& element : value.toListRef()) mapped.push_back(toHpu(element));
      return mapped;
    }
    return value;
  }

 private:
  std::vector<at::Tensor> tensors_;  // also keeps the memory alive while the backend works on it
};

// Completes the futures of HPU work on a thread of its own, as HCCL completes work on the device's stream, so that
// gloo's worker threads never run, or free, what users chain on a future (Python callbacks, tensors Python made).
// Both need the GIL, and torch before 2.8 destroys a gloo process group by joining its worker threads while it holds
// the GIL: a worker still freeing a callback then waits for the GIL forever (pytorch#154976). This thread is never
// joined; it lives as long as the process.
class FutureCompleter {
 public:
  static FutureCompleter& instance() {
    static FutureCompleter* completer = new FutureCompleter();  // never destroyed: its thread outlives static destructors
    return *completer;
  }

  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
  }

 private:
  FutureCompleter() { std::thread([this] { run(); }).detach(); }

  [[noreturn]] void run() {
    // a name of its own: a new thread takes its creator's, here usually a gloo worker's
    pthread_setname_np(pthread_self(), "vhpu_futures");
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return !tasks_.empty(); });
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();  // and the task's captures are released here, on this thread
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
};

// The backend's work, with results and future mapped back to HPU tensors.
class HpuWork : public c10d::Work {
 public:
  HpuWork(c10::intrusive_ptr<c10d::Work> work, std::shared_ptr<const HpuTensors> tensors)
      : c10d::Work(-1, work->retrieveOpType()), work_(std::move(work)), tensors_(std::move(tensors)) {}

  bool isCompleted() override { return work_->isCompleted(); }
  bool isSuccess() const override { return work_->isSuccess(); }
  std::exception_ptr exception() const override { return work_->exception(); }
  int sourceRank() const override { return work_->sourceRank(); }
  void synchronize() override { work_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override { return work_->wait(timeout); }
#if VIRTUAL_HPU_WORK_BLOCKS_STREAMS
  void blockCurrentStream() override { work_->blockCurrentStream(); }
#endif
  void abort() override { work_->abort(); }
  float getDuration() const override { return work_->getDuration(); }
  uint64_t getSequencenumber() const override { return work_->getSequencenumber(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override { return work_->getFutureResult(); }

  std::vector<at::Tensor> result() override {
    std::vector<at::Tensor> tensors = work_->result();
    for (at::Tensor& t : tensors) t = tensors_->toHpu(t);
    return tensors;
  }

  // The backend's future, completed with HPU tensors by the FutureCompleter: gloo's thread only hands it over.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(future_mutex_);
    if (!future_) {
      c10::intrusive_ptr<c10::ivalue::Future> inner = work_->getFuture();
      future_ = c10::make_intrusive<c10::ivalue::Future>(inner->elementType(), inner->devices());
      inner->addCallback([future = future_, tensors = tensors_](c10::ivalue::Future& done) mutable {
        // what gloo's thread keeps of it (the CPU aliases of the result) needs no GIL to free
        std::exception_ptr error = done.hasError() ? done.exception_ptr() : nullptr;
        c10::IValue value = error ? c10::IValue() : done.value();
        FutureCompleter::instance().post([future = std::move(future), tensors = std::move(tensors),
                                          value = std::move(value), error = std::move(error)] {
          if (error) {
            future->setError(error);
          } else {
            future->markCompleted(tensors->toHpu(value));
          }
        });
      });
    }
    return future_;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::shared_ptr<const HpuTensors> tensors_;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Compared by the class's qualified name without building the type's string: these run for every argument of every
// collective.
bool isClass(const c10::Argument& argument, std::string_view name) {
  const auto* type = argument.type()->castRaw<c10::ClassType>();
  return type != nullptr && type->name().has_value() && type->name()->qualifiedName() == name;
}

bool isReduceOp(const c10::Argument& argument) { return isClass(argument, "__torch__.torch.classes.c10d.ReduceOp"); }

bool isWork(const c10::Argument& argument) { return isClass(argument, "__torch__.torch.classes.c10d.Work"); }

bool isProcessGroup(const c10::Argument& argument) {
  return isClass(argument, "__torch__.torch.classes.c10d.ProcessGroup");
}

// The CPU kernels of the c10d ops call the group's cpu backend. When the group has its own backend for hpu (always
// the case for "hccl"; `init_process_group()` without a backend registers it for hpu alone), they get a stand-in
// group whose cpu backend is that hpu backend.
// Asked through getDeviceTypes(), which every supported torch has (hasBackendForDeviceType came in 2.12).
bool hasBackendFor(const c10d::ProcessGroup& group, c10::DeviceType type) {
  const std::vector<c10::Device> devices = group.getDeviceTypes();
  return std::any_of(devices.begin(), devices.end(), [type](const c10::Device& d) { return d.type() == type; });
}

c10::IValue withHpuBackend(const c10::IValue& value) {
  auto group = value.toCustomClass<c10d::ProcessGroup>();
  if (!hasBackendFor(*group, kDeviceType)) return value;
  c10::intrusive_ptr<c10d::Backend> backend = group->getBackend(kDeviceType);
  if (hasBackendFor(*group, c10::DeviceType::CPU) && group->getBackend(c10::DeviceType::CPU) == backend) {
    return value;
  }
  auto stand_in = c10::make_intrusive<c10d::ProcessGroup>(group->getRank(), group->getSize());
  stand_in->setBoundDeviceId(backend->getBoundDeviceId());  // so that setBackend leaves the backend's as it is
  stand_in->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  return c10::IValue(std::move(stand_in));
}

// HCCL (as NCCL) reads the output of all_gather_into_tensor, and the input of reduce_scatter_tensor, as flat: any
// shape with world-size times the elements of the other tensor (SyncBatchNorm gathers (2C+1) values into a
// (1, world * (2C+1)) tensor). Gloo splits it along its first dimension: it gets a view in that layout.
void stackChunksForGloo(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t first) {
  const std::string& name = op.schema().name();
  const bool gather = name == "c10d::_allgather_base_";
  if (!gather && name != "c10d::_reduce_scatter_base_") return;
  c10::IValue& whole = (*stack)[first + (gather ? 0 : 1)];
  const at::Tensor chunk = (*stack)[first + (gather ? 1 : 0)].toTensor();
  const at::Tensor tensor = whole.toTensor();
  const int64_t world = (*stack)[first + 2].toCustomClass<c10d::ProcessGroup>()->getSize();
  if (chunk.dim() == 0 || !tensor.is_contiguous() || tensor.numel() != world * chunk.numel()) return;
  if (tensor.dim() > 0 && tensor.size(0) == world * chunk.size(0)) return;
  std::vector<int64_t> sizes = chunk.sizes().vec();
  sizes[0] *= world;
  whole = tensor.view(sizes);
}

// The bytes a collective sends: those of its input tensors (the arguments named "tensors", or "input..."; a
// barrier's tensor is a token and sends nothing).
int64_t bytesSent(const std::vector<c10::Argument>& arguments, const torch::jit::Stack& stack, size_t first) {
  int64_t bytes = 0;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& name = arguments[i].name();
    if (name != "tensors" && name.rfind("input", 0) != 0) continue;
    forEachTensor(stack[first + i], [&](const at::Tensor& t) { bytes += static_cast<int64_t>(t.nbytes()); });
  }
  return bytes;
}

void collective(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  stackChunksForGloo(op, stack, first);
  const std::string& name = op.schema().name();
  const bool all_reduce = name == "c10d::allreduce_" || name == "c10d::allreduce_coalesced_";
  countCollective(all_reduce, bytesSent(arguments, *stack, first));
  auto tensors = std::make_shared<HpuTensors>();
  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (isReduceOp(arguments[i])) checkReduceOp(value);
    if (isProcessGroup(arguments[i])) value = withHpuBackend(value);
    forEachTensor(value, [&](const at::Tensor& t) { tensors->add(t); });
  }
  hpuFallback(op, keys, stack);  // aliases, runs the CPU kernel, maps returned tensors back
  const auto& returns = op.schema().returns();
  const size_t first_return = stack->size() - returns.size();
  for (size_t i = 0; i < returns.size(); ++i) {
    c10::IValue& value = (*stack)[first_return + i];
    if (isWork(returns[i])) {
      c10::intrusive_ptr<c10d::Work> work = c10::make_intrusive<HpuWork>(value.toCustomClass<c10d::Work>(), tensors);
      value = c10::IValue(std::move(work));
    }
  }
}

#ifdef VIRTUAL_HPU_PRIVATEUSE1
// torch registers c10d kernels for any PrivateUse1 backend that hand its tensors to the group's backend for that device,
// which gloo cannot take; ours replace them on purpose, so the dispatcher's warning about overriding a kernel (meant for
// accidents) is dropped while they register. Other warnings go on to the handler in place.
class DropKernelOverrideWarning : public c10::WarningHandler {
 public:
  explicit DropKernelOverrideWarning(c10::WarningHandler* next) : next_(next) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") == std::string::npos) next_->process(warning);
  }

 private:
  c10::WarningHandler* next_;
};
#endif

VIRTUAL_HPU_LIBRARY_IMPL(c10d, m) {
#ifdef VIRTUAL_HPU_PRIVATEUSE1
  DropKernelOverrideWarning drop(c10::WarningUtils::get_warning_handler());
  c10::WarningUtils::WarningHandlerGuard guard(&drop);
#endif
  for (const char* name :
       {"allreduce_", "allreduce_coalesced_", "reduce_", "broadcast_", "allgather_", "_allgather_base_",
        "allgather_coalesced_", "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
        "reduce_scatter_tensor_coalesced_", "gather_", "scatter_", "alltoall_base_", "barrier",
        "monitored_barrier_", "send", "recv_", "recv_any_source_"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&collective>());
  }
  m.impl("alltoall_", torch::CppFunction::makeFromBoxedFunction<&alltoallAsBase>());
}

// DDP times its steps with a timer registered for the parameters' device type, and warns on every run for a device
// without one. Work on the virtual device is synchronous: host timestamps are the device's.
class HpuTimer : public c10d::Timer {
 public:
  explicit HpuTimer(c10::Device /*device*/) {}

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const int64_t start_time = getTimeRef(start);
    const int64_t end_time = getTimeRef(end);
    // unset, or recorded in different iterations
    if (start_time == c10d::kUnsetTime || end_time == c10d::kUnsetTime || end_time < start_time) return std::nullopt;
    return end_time - start_time;
  }
};

}  // namespace
}  // namespace virtual_hpu

// the registration macro names the registry unqualified
namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, virtual_hpu::kDeviceType, virtual_hpu::HpuTimer);
}  // namespace c10d
