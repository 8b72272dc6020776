#include "ops/fused_op.h"

#include "ops/errors.h"

namespace gradfuzz::ops {

GroupForwardResult FusedOp::forward(std::vector<OpContext*>& /*ctxs*/, const at::Tensor& /*input*/,
                                    const std::vector<std::vector<at::Tensor>>& /*extra_inputs*/) const {
  GRADFUZZ_INTERNAL_ASSERT(false, name_ + " is a backward-only fused op and cannot run forward");
}

GroupBackwardResult FusedOp::backward(std::vector<OpContext*>& /*ctxs*/, const at::Tensor& /*grad_output*/,
                                      const std::vector<std::vector<at::Tensor>>& /*grad_extra_outputs*/) const {
  GRADFUZZ_INTERNAL_ASSERT(false, name_ + " is a forward-only fused op and cannot run backward");
}

GroupForwardResult SingleOpGroup::forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                                          const std::vector<std::vector<at::Tensor>>& extra_inputs) const {
  ForwardResult result = basic_ops()[0]->forward(*ctxs[0], input, extra_inputs[0]);
  GroupForwardResult out;
  out.output = std::move(result.output);
  out.extra_outputs.push_back(std::move(result.extra_outputs));
  return out;
}

GroupBackwardResult SingleOpGroup::backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                                            const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const {
  BackwardResult result = basic_ops()[0]->backward(*ctxs[0], grad_output, grad_extra_outputs[0]);
  GroupBackwardResult out;
  out.grad_input = std::move(result.grad_input);
  out.grad_params.push_back(std::move(result.grad_params));
  out.grad_extra_inputs.push_back(std::move(result.grad_extra_inputs));
  return out;
}

}  // namespace gradfuzz::ops
