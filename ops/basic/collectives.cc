#include "ops/basic/collectives.h"

namespace gradfuzz::ops {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "AllGather";
    case CollectiveKind::kReduceScatter:
      return "ReduceScatter";
    case CollectiveKind::kAllReduce:
      return "AllReduce";
  }
  return "AllGather";
}

ForwardResult Collective::forward_impl(OpContext& ctx, const at::Tensor& input,
                                       const std::vector<at::Tensor>& /*extra_inputs*/) const {
  ctx.saved.clear();
  ctx.saved_sizes.clear();
  return {input, pack({})};
}

BackwardResult Collective::backward_impl(OpContext& /*ctx*/, const at::Tensor& grad_output,
                                         const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  // grad_output [rows, n] (the whole tensor) -> grad_input [rows, n]
  return {grad_output, {}, pack({})};
}

ReferenceResult Collective::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                           const std::vector<at::Tensor>& /*params*/) const {
  return {input.view_as(input), {}};
}

}  // namespace gradfuzz::ops
