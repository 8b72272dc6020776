#pragma once

// The catalog fused ops of ops.md ("Fused ops") and the fusion functions that create them.
// Every fusion fires only when its pattern of *basic* groups and its preconditions hold
// (parameter shapes, dtypes and devices, channel bindings); otherwise it declines and the
// ops stay unfused. Backward-only and joint fusions additionally decline unless every
// covered op needs backward (its index >= FusionContext::first_op_requiring_backward).
// The math of each fused op is written by hand: no reference_impl, no autograd.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/fused_op.h"
#include "ops/fusion_registry.h"

namespace gradfuzz::ops {

// ---- forward-only (ops/fused/forward_fusions.cc) ---------------------------------------

/// Linear, Bias[, ReLU or GELU]: y = act(x Wᵀ + b) in one GEMM plus one epilogue (a CUDA
/// kernel for CUDA tensors). Leaves each op's context as its own forward would.
class ForwardLinearBiasActivation final : public FusedOp {
 public:
  explicit ForwardLinearBiasActivation(std::vector<BasicOpPtr> ops);
  GroupForwardResult forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                             const std::vector<std::vector<at::Tensor>>& extra_inputs) const override;
};

/// Linear[, Bias], AddExtraInput: y = x Wᵀ (+ b) + e as one GEMM accumulating into e.
class ForwardLinearBiasAdd final : public FusedOp {
 public:
  explicit ForwardLinearBiasAdd(std::vector<BasicOpPtr> ops);
  GroupForwardResult forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                             const std::vector<std::vector<at::Tensor>>& extra_inputs) const override;
};

/// Linear, ConstantScale, AddExtraInput: y = c·x Wᵀ + e as one GEMM (alpha = c, beta = 1).
class ForwardLinearScaleAdd final : public FusedOp {
 public:
  explicit ForwardLinearScaleAdd(std::vector<BasicOpPtr> ops);
  GroupForwardResult forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                             const std::vector<std::vector<at::Tensor>>& extra_inputs) const override;
};

/// Fusion functions of the forward pass (decline = leave the groups unchanged).
FusionFn forward_linear_bias_activation_fusion();
FusionFn forward_linear_bias_add_fusion();
FusionFn forward_linear_scale_add_fusion();

// ---- backward-only (ops/fused/backward_fusions.cc) -------------------------------------

/// MakeExtraOutput, Linear: dx = g W + g_extra as one GEMM accumulating into the
/// extra-output gradient (which already holds the channel gradients); dW = gᵀ x.
class BackwardLinearAdd final : public FusedOp {
 public:
  explicit BackwardLinearAdd(std::vector<BasicOpPtr> ops);
  GroupBackwardResult backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                               const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const override;
};

/// Linear, ConstantScale: dx = c·(g W), dW = c·(gᵀ x), the scale folded into the GEMMs.
class BackwardLinearScale final : public FusedOp {
 public:
  explicit BackwardLinearScale(std::vector<BasicOpPtr> ops);
  GroupBackwardResult backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                               const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const override;
};

/// Bias, ReLU or GELU: d act and d bias in one pass (a CUDA kernel for CUDA tensors).
class BackwardActivationBias final : public FusedOp {
 public:
  explicit BackwardActivationBias(std::vector<BasicOpPtr> ops);
  GroupBackwardResult backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                               const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const override;
};

/// MakeExtraOutput, RMSNorm: RMSNorm's d input plus the extra-output gradient (missing =
/// zero) and d gamma in one pass (a CUDA kernel for CUDA tensors); honours the norm's
/// zero_centered_gamma (scale 1 + gamma) as TE's rmsnorm_bwd_add does.
class BackwardAddRMSNorm final : public FusedOp {
 public:
  explicit BackwardAddRMSNorm(std::vector<BasicOpPtr> ops);
  GroupBackwardResult backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                               const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const override;
};

FusionFn backward_linear_add_fusion();
FusionFn backward_linear_scale_fusion();
FusionFn backward_activation_bias_fusion();
FusionFn backward_add_rmsnorm_fusion();

// ---- joint (ops/fused/grouped_mlp.cc) --------------------------------------------------

/// GroupedLinear (fc1), ScaledSwiGLU or ScaledSReLU, GroupedLinear (fc2), with fc1 and fc2
/// slot 0 bound to the same split-sizes channel: the split sizes are read and validated
/// once for both linears. The activation's scale gradient and fc2's scale_bias gradient are
/// returned to their own slots (never merged); the activation's only when its context
/// wants it. The scaled SwiGLU runs a CUDA kernel for CUDA tensors.
class GroupedMLP final : public FusedOp {
 public:
  explicit GroupedMLP(std::vector<BasicOpPtr> ops);
  GroupForwardResult forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                             const std::vector<std::vector<at::Tensor>>& extra_inputs) const override;
  GroupBackwardResult backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                               const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const override;
};

FusionFn grouped_mlp_fusion();

// ---- FusedResidual, all three passes (ops/fused/fused_residual.cc) ---------------------

/// MakeExtraOutput (output slot 0 bound to channel C), one op without extra inputs or
/// outputs, AddExtraInput (input slot 0 bound to C). Owns the channel: forward routes x to
/// the add itself (and returns the extra output undefined when nobody outside reads it);
/// backward applies the add's gradient to the producer itself (the same-fusion rule),
/// dx = inner_dx + grad_extra_output + de, and still returns de for the channel trace.
/// Under Fault::kSameFusionGradDrop the `+ de` term is forgotten.
class FusedResidual final : public FusedOp {
 public:
  /// `pass` says which of forward/backward this registration runs (kJoint: both).
  FusedResidual(std::string name, FusionPass pass, std::vector<BasicOpPtr> ops);
  FusionPass pass() const { return pass_; }
  GroupForwardResult forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                             const std::vector<std::vector<at::Tensor>>& extra_inputs) const override;
  GroupBackwardResult backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                               const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const override;

 private:
  FusionPass pass_;
};

/// The FusedResidual fusion for one pass; the fused op is named "FusedResidual.forward",
/// "FusedResidual.backward" or "FusedResidual.joint".
FusionFn fused_residual_fusion(FusionPass pass);
/// Registration name of FusedResidual in `pass`.
std::string fused_residual_name(FusionPass pass);

// ---- helpers shared by the fusion sources -----------------------------------------------

namespace detail {

/// The basic op of `group` as a T, or nullptr when the group is fused or of another type.
template <typename T>
T* basic_as(const FusedOpPtr& group) {
  if (!group || !group->is_basic() || group->basic_ops().empty()) {
    return nullptr;
  }
  return dynamic_cast<T*>(group->basic_ops()[0].get());
}

/// Whether groups [begin, begin + count) exist and are all basic.
bool basic_run(const std::vector<FusedOpPtr>& groups, size_t begin, size_t count);

/// Whether every basic op of groups [begin, begin + count) needs backward: its index in
/// *context.basic_ops is at or after context.first_op_requiring_backward.
bool all_need_backward(const std::vector<FusedOpPtr>& groups, size_t begin, size_t count, const FusionContext& context);

/// The basic ops of groups [begin, begin + count), one per (basic) group.
std::vector<BasicOpPtr> collect_ops(const std::vector<FusedOpPtr>& groups, size_t begin, size_t count);

/// Whether two tensors have the same dtype and device.
bool same_kind(const at::Tensor& a, const at::Tensor& b);

/// Empty extra-output / extra-input-gradient containers, one per op, in each op's style.
std::vector<ExtraOutputs> empty_extras(const std::vector<BasicOpPtr>& ops);

/// `t` viewed as [rows, features] with features = t.size(-1).
at::Tensor flatten_rows(const at::Tensor& t);
/// `t2d` [rows, n] reshaped to like.sizes()[:-1] + [n].
at::Tensor unflatten_rows(const at::Tensor& t2d, const at::Tensor& like);

}  // namespace detail

}  // namespace gradfuzz::ops
