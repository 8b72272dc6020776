// Registration of the catalog fusions (ops.md, "Fused ops") and the helpers the fusion
// sources share.
#include <ATen/ATen.h>

#include <algorithm>

#include "ops/errors.h"
#include "ops/fused/fused_ops.h"
#include "ops/op_registry.h"

namespace gradfuzz::ops {

namespace detail {

bool basic_run(const std::vector<FusedOpPtr>& groups, size_t begin, size_t count) {
  if (begin + count > groups.size()) {
    return false;
  }
  for (size_t k = begin; k < begin + count; ++k) {
    if (!groups[k] || !groups[k]->is_basic() || groups[k]->basic_ops().size() != 1) {
      return false;
    }
  }
  return true;
}

bool all_need_backward(const std::vector<FusedOpPtr>& groups, size_t begin, size_t count,
                       const FusionContext& context) {
  GRADFUZZ_INTERNAL_ASSERT(context.basic_ops != nullptr, "FusionContext without basic ops");
  const std::vector<BasicOpPtr>& all = *context.basic_ops;
  for (size_t k = begin; k < begin + count && k < groups.size(); ++k) {
    for (const BasicOpPtr& op : groups[k]->basic_ops()) {
      const auto it = std::find(all.begin(), all.end(), op);
      GRADFUZZ_INTERNAL_ASSERT(it != all.end(), "fusion group op " + op->type() + " is not one of the fuser's ops");
      if (static_cast<int64_t>(it - all.begin()) < context.first_op_requiring_backward) {
        return false;
      }
    }
  }
  return true;
}

std::vector<BasicOpPtr> collect_ops(const std::vector<FusedOpPtr>& groups, size_t begin, size_t count) {
  std::vector<BasicOpPtr> ops;
  for (size_t k = begin; k < begin + count; ++k) {
    ops.push_back(groups[k]->basic_ops().at(0));
  }
  return ops;
}

bool same_kind(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.scalar_type() == b.scalar_type() && a.device() == b.device();
}

std::vector<ExtraOutputs> empty_extras(const std::vector<BasicOpPtr>& ops) {
  std::vector<ExtraOutputs> out;
  out.reserve(ops.size());
  for (const BasicOpPtr& op : ops) {
    out.push_back(ExtraOutputs::make(op->output_style(), {}));
  }
  return out;
}

at::Tensor flatten_rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

at::Tensor unflatten_rows(const at::Tensor& t2d, const at::Tensor& like) {
  std::vector<int64_t> sizes = like.sizes().vec();
  sizes.back() = t2d.size(-1);
  return t2d.reshape(sizes);
}

}  // namespace detail

void register_catalog_fusions(FusionRegistry& registry) {
  // Registration order is application order inside a pass: FusedResidual first, so that
  // with every fusion on the residual pattern (the same-fusion channel) wins over the
  // shorter patterns that share its MakeExtraOutput; the longer linear patterns before
  // the shorter ones.
  registry.add(fused_residual_name(FusionPass::kJoint), FusionPass::kJoint, fused_residual_fusion(FusionPass::kJoint));
  registry.add("GroupedMLP", FusionPass::kJoint, grouped_mlp_fusion());

  registry.add(fused_residual_name(FusionPass::kForward), FusionPass::kForward,
               fused_residual_fusion(FusionPass::kForward));
  registry.add("ForwardLinearBiasAdd", FusionPass::kForward, forward_linear_bias_add_fusion());
  registry.add("ForwardLinearScaleAdd", FusionPass::kForward, forward_linear_scale_add_fusion());
  registry.add("ForwardLinearBiasActivation", FusionPass::kForward, forward_linear_bias_activation_fusion());

  registry.add(fused_residual_name(FusionPass::kBackward), FusionPass::kBackward,
               fused_residual_fusion(FusionPass::kBackward));
  registry.add("BackwardLinearAdd", FusionPass::kBackward, backward_linear_add_fusion());
  registry.add("BackwardLinearScale", FusionPass::kBackward, backward_linear_scale_fusion());
  registry.add("BackwardActivationBias", FusionPass::kBackward, backward_activation_bias_fusion());
  registry.add("BackwardAddRMSNorm", FusionPass::kBackward, backward_add_rmsnorm_fusion());
}

}  // namespace gradfuzz::ops
