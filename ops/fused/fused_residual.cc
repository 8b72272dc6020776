// FusedResidual: MakeExtraOutput -> one op -> AddExtraInput over one channel, registered
// in all three passes. The fusion owns both ends of the channel (runtime.md section 8,
// the same-fusion rule), the branch that review finding 4 says was never exercised.
#include <ATen/ATen.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ops/basic/channel_ops.h"
#include "ops/errors.h"
#include "ops/faults.h"
#include "ops/fused/fused_ops.h"

namespace gradfuzz::ops {

std::string fused_residual_name(FusionPass pass) { return std::string("FusedResidual.") + fusion_pass_name(pass); }

FusedResidual::FusedResidual(std::string name, FusionPass pass, std::vector<BasicOpPtr> ops)
    : FusedOp(std::move(name), std::move(ops)), pass_(pass) {}

GroupForwardResult FusedResidual::forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                                          const std::vector<std::vector<at::Tensor>>& extra_inputs) const {
  if (pass_ == FusionPass::kBackward) {
    return FusedOp::forward(ctxs, input, extra_inputs);  // asserts: backward-only
  }
  const BasicOp& inner = *basic_ops()[1];
  const BasicOp& add = *basic_ops()[2];
  // AddExtraInput's slot 0 is never read: its producer is MakeExtraOutput in this group,
  // so the fusion routes x to the add itself (the fuser hands the slot over undefined).

  ctxs[0]->saved.clear();  // MakeExtraOutput saves nothing
  ctxs[0]->saved_sizes.clear();
  // The middle op is not fused: it runs its own fused-path forward and fills its context.
  ForwardResult inner_result = inner.forward(*ctxs[1], input, extra_inputs[1]);
  const at::Tensor& y = inner_result.output;
  if (y.sizes() != input.sizes()) {
    // AddExtraInput's own check, with its error type: e (= x) must have y's shape.
    std::ostringstream os;
    os << add.type() << " slot 0: extra input must have the input's shape " << y.sizes() << ", got " << input.sizes();
    throw InvalidArgumentError(os.str());
  }
  ctxs[2]->saved.clear();  // AddExtraInput saves nothing
  ctxs[2]->saved_sizes.clear();
  // y [rows, n] + x [rows, n] -> output [rows, n]; out of place, so x (still the channel
  // value and MakeExtraOutput's extra output) is never written.
  at::Tensor output = y + input.to(y.scalar_type());

  GroupForwardResult result;
  result.output = std::move(output);
  // The fusion owns the channel in forward, so the tensor is returned only when someone
  // outside this group reads it (runtime.md section 6.5). In the forward-only pass the
  // unfused backward still routes the consumer's gradient to the producer through the fuser.
  const bool needed = ctxs[0]->output_needed.empty() || ctxs[0]->output_needed[0];
  result.extra_outputs.push_back(ExtraOutputs::make(basic_ops()[0]->output_style(), {needed ? input : at::Tensor()}));
  result.extra_outputs.push_back(std::move(inner_result.extra_outputs));
  result.extra_outputs.push_back(ExtraOutputs::make(add.output_style(), {}));
  return result;
}

GroupBackwardResult FusedResidual::backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                                            const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const {
  if (pass_ == FusionPass::kForward) {
    return FusedOp::backward(ctxs, grad_output, grad_extra_outputs);  // asserts: forward-only
  }
  const BasicOp& inner = *basic_ops()[1];
  // AddExtraInput: d y_inner = g, de = g [rows, n]; inner: g -> inner_dx [rows, n];
  // MakeExtraOutput: dx = inner_dx + grad_extra_output + de [rows, n].
  const at::Tensor& grad_extra_input = grad_output;
  BackwardResult inner_result = inner.backward(*ctxs[1], grad_output, grad_extra_outputs[1]);
  at::Tensor grad_input = inner_result.grad_input;
  const at::Tensor& grad_extra_output = grad_extra_outputs[0].at(0);
  if (grad_extra_output.defined()) {
    grad_input = grad_input + grad_extra_output.to(grad_input.scalar_type());
  }
  // The same-fusion rule: the consumer's gradient goes to the producer here, since the
  // fuser does not route a channel gradient inside one group. The fault forgets it.
  if (!fault_enabled(Fault::kSameFusionGradDrop)) {
    grad_input = grad_input + grad_extra_input.to(grad_input.scalar_type());
  }

  GroupBackwardResult result;
  result.grad_input = std::move(grad_input);
  result.grad_params = {{}, std::move(inner_result.grad_params), {}};
  result.grad_extra_inputs.push_back(ExtraOutputs::make(basic_ops()[0]->output_style(), {}));
  result.grad_extra_inputs.push_back(std::move(inner_result.grad_extra_inputs));
  // Still reported so the fuser can trace the channel's gradient.
  result.grad_extra_inputs.push_back(
      ExtraOutputs::make(basic_ops()[2]->output_style(), {ctxs[2]->wants_grad(0) ? grad_extra_input : at::Tensor()}));
  return result;
}

FusionFn fused_residual_fusion(FusionPass pass) {
  return [pass](const std::vector<FusedOpPtr>& groups, const FusionContext& context) {
    return apply_pattern(
        groups, context,
        [pass](const std::vector<FusedOpPtr>& gs, size_t i, const FusionContext& ctx) -> std::pair<FusedOpPtr, size_t> {
          if (!detail::basic_run(gs, i, 3)) {
            return {nullptr, 0};
          }
          const MakeExtraOutput* producer = detail::basic_as<MakeExtraOutput>(gs[i]);
          const BasicOp& inner = *gs[i + 1]->basic_ops()[0];
          const AddExtraInput* consumer = detail::basic_as<AddExtraInput>(gs[i + 2]);
          if (producer == nullptr || consumer == nullptr || inner.num_extra_inputs() != 0 ||
              inner.num_extra_outputs() != 0) {
            return {nullptr, 0};
          }
          const OutputBinding binding = producer->extra_output_binding(0);
          const std::optional<std::string> source = consumer->extra_input_channel(0);
          if (!binding.channel || !source || *binding.channel != *source) {
            return {nullptr, 0};
          }
          if (pass != FusionPass::kForward && !detail::all_need_backward(gs, i, 3, ctx)) {
            return {nullptr, 0};
          }
          return {std::make_shared<FusedResidual>(fused_residual_name(pass), pass, detail::collect_ops(gs, i, 3)), 3};
        });
  };
}

}  // namespace gradfuzz::ops
