// all_to_all of tensor lists, as HCCL does it: a size for each pair of ranks. Gloo, under the virtual HCCL, has none
// before torch 2.12 and takes one size for all pairs since; torch's differentiable all_gather (`torch.distributed.nn`,
// Lightning's `all_gather(sync_grads=True)`) calls it in its backward for every backend but gloo. Here it is one
// alltoall_base of the flattened tensors, which every gloo has. Registered with the other collectives.
#include "virtual_hpu.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <string>
#include <unordered_map>
#include <vector>

namespace virtual_hpu {
namespace {

std::vector<int64_t> numels(const std::vector<at::Tensor>& tensors) {
  std::vector<int64_t> sizes;
  sizes.reserve(tensors.size());
  for (const at::Tensor& t : tensors) sizes.push_back(t.numel());
  return sizes;
}

at::Tensor flat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> pieces;
  pieces.reserve(tensors.size());
  for (const at::Tensor& t : tensors) pieces.push_back(t.reshape({-1}));
  return at::cat(pieces);
}

}  // namespace

void alltoallAsBase(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  // by name: the schemas of both ops gained `async_op` in some releases
  std::unordered_map<std::string, c10::IValue> given;
  for (size_t i = 0; i < arguments.size(); ++i) given.emplace(arguments[i].name(), std::move((*stack)[first + i]));
  stack->resize(first);

  const std::vector<at::Tensor> outputs = given.at("output_tensors").toTensorVector();
  const std::vector<at::Tensor> inputs = given.at("input_tensors").toTensorVector();
  TORCH_CHECK(!outputs.empty() && outputs.size() == inputs.size(),
              "all_to_all needs one input and one output tensor per rank");
  const std::vector<int64_t> output_sizes = numels(outputs);
  at::Tensor output = at::empty({c10::sum_integers(output_sizes)}, outputs.front().options());
  given.emplace("output", output);
  given.emplace("input", flat(inputs));
  given.emplace("output_split_sizes", c10::IValue(output_sizes));
  given.emplace("input_split_sizes", c10::IValue(numels(inputs)));

  static const c10::OperatorHandle base = c10::Dispatcher::singleton().findSchemaOrThrow("c10d::alltoall_base_", "");
  torch::jit::Stack call;
  for (const c10::Argument& argument : base.schema().arguments()) call.push_back(given.at(argument.name()));
  base.callBoxed(call);
  c10::intrusive_ptr<c10d::Work> work = call.back().toCustomClass<c10d::Work>();
  work->wait();  // the outputs are filled below, from the flat result
  int64_t offset = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i].copy_(output.narrow(0, offset, output_sizes[i]).view(outputs[i].sizes()));
    offset += output_sizes[i];
  }
  stack->emplace_back(outputs);
  stack->emplace_back(std::move(work));
}

}  // namespace virtual_hpu
