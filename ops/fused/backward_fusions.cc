// Backward-only fusions: they accept the contexts that the unfused forwards filled.
#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "ops/basic/activations.h"
#include "ops/basic/channel_ops.h"
#include "ops/basic/linear.h"
#include "ops/basic/norms.h"
#include "ops/errors.h"
#include "ops/faults.h"
#include "ops/fused/fused_ops.h"

#ifdef GRADFUZZ_WITH_CUDA
#include "ops/cuda/kernels.h"
#endif

namespace gradfuzz::ops {

namespace {

/// A backward result with one (possibly empty) parameter-gradient list per covered op and
/// empty extra-input gradients (none of the covered ops has extra inputs).
GroupBackwardResult make_result(const std::vector<BasicOpPtr>& ops, at::Tensor grad_input,
                                std::vector<std::vector<at::Tensor>> grad_params) {
  GroupBackwardResult result;
  result.grad_input = std::move(grad_input);
  result.grad_params = std::move(grad_params);
  result.grad_extra_inputs = detail::empty_extras(ops);
  return result;
}

/// grad_outputᵀ [out, rows] · input [rows, in] -> grad_weight [out, in]
at::Tensor weight_grad(const at::Tensor& grad_output, const at::Tensor& input) {
  return detail::flatten_rows(grad_output).t().mm(detail::flatten_rows(input));
}

}  // namespace

// ---------------------------------------------------------------------------------------
// BackwardLinearAdd: MakeExtraOutput, Linear

BackwardLinearAdd::BackwardLinearAdd(std::vector<BasicOpPtr> ops) : FusedOp("BackwardLinearAdd", std::move(ops)) {}

GroupBackwardResult BackwardLinearAdd::backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                                                const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const {
  const auto& linear = static_cast<const Linear&>(*basic_ops()[1]);
  const at::Tensor& weight = linear.weight();
  const at::Tensor& input = ctxs[1]->saved.at(0);
  const at::Tensor& grad_extra = grad_extra_outputs[0].at(0);
  const at::Tensor g2d = detail::flatten_rows(grad_output);
  at::Tensor grad_input;
  // g [rows, out] · W [out, in] + grad_extra [rows, in] -> grad_input [rows, in]; gᵀ x -> dW [out, in]
  if (grad_extra.defined() && detail::same_kind(grad_extra, g2d) && detail::same_kind(weight, g2d) &&
      grad_extra.numel() == g2d.size(0) * linear.in_features()) {
    // One GEMM whose accumulator starts at the extra-output gradient (beta = 1); addmm is
    // out of place, so the fuser's stored gradient is never written.
    grad_input =
        detail::unflatten_rows(at::addmm(grad_extra.reshape({-1, linear.in_features()}), g2d, weight), grad_output);
  } else {
    grad_input = at::matmul(grad_output, weight);
    if (grad_extra.defined()) {
      grad_input = grad_input + grad_extra.to(grad_input.scalar_type());
    }
  }
  return make_result(basic_ops(), std::move(grad_input), {{}, {weight_grad(grad_output, input)}});
}

// ---------------------------------------------------------------------------------------
// BackwardLinearScale: Linear, ConstantScale

BackwardLinearScale::BackwardLinearScale(std::vector<BasicOpPtr> ops)
    : FusedOp("BackwardLinearScale", std::move(ops)) {}

GroupBackwardResult BackwardLinearScale::backward(
    std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
    const std::vector<std::vector<at::Tensor>>& /*grad_extra_outputs*/) const {
  const auto& linear = static_cast<const Linear&>(*basic_ops()[0]);
  const double c = static_cast<const ConstantScale&>(*basic_ops()[1]).scale();
  const at::Tensor& weight = linear.weight();
  const at::Tensor& input = ctxs[0]->saved.at(0);
  const at::Tensor g2d = detail::flatten_rows(grad_output);
  const at::Tensor x2d = detail::flatten_rows(input);
  at::Tensor grad_input;
  at::Tensor grad_weight;
  if (detail::same_kind(weight, g2d) && detail::same_kind(x2d, g2d)) {
    // c · g [rows, out] · W [out, in] -> grad_input [rows, in]; c · gᵀ [out, rows] · x [rows, in] -> dW [out, in]
    // (the scale rides in the GEMMs' alpha; beta = 0 ignores the accumulator's contents)
    grad_input = at::addmm(at::empty({g2d.size(0), linear.in_features()}, g2d.options()), g2d, weight,
                           /*beta=*/0, /*alpha=*/c);
    grad_weight = at::addmm(at::empty_like(weight), g2d.t(), x2d, /*beta=*/0, /*alpha=*/c);
    grad_input = detail::unflatten_rows(grad_input, grad_output);
  } else {
    const at::Tensor scaled = grad_output * c;
    grad_input = at::matmul(scaled, weight);
    grad_weight = weight_grad(scaled, input);
  }
  return make_result(basic_ops(), std::move(grad_input), {{grad_weight}, {}});
}

// ---------------------------------------------------------------------------------------
// BackwardActivationBias: Bias, ReLU or GELU

BackwardActivationBias::BackwardActivationBias(std::vector<BasicOpPtr> ops)
    : FusedOp("BackwardActivationBias", std::move(ops)) {}

GroupBackwardResult BackwardActivationBias::backward(
    std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
    const std::vector<std::vector<at::Tensor>>& /*grad_extra_outputs*/) const {
  const auto& act = static_cast<const Activation&>(*basic_ops()[1]);
  // The activation's input is Bias's output x + b as the activation saved it: itself, or with
  // cache_quantized_input its FP8 quantize-dequantize, which TE's fused op reads too
  // (backward_activation_bias.py: maybe_dequantize(act_input)).
  const at::Tensor& pre_activation = ctxs[1]->saved.at(0);
  // g [rows, n] ⊙ act'(x + b) -> grad_input [rows, n]; Σ_rows -> grad_bias [n]
#ifdef GRADFUZZ_WITH_CUDA
  if (grad_output.is_cuda() && detail::same_kind(grad_output, pre_activation) &&
      grad_output.sizes() == pre_activation.sizes() && !fault_enabled(Fault::kHalfAccumulation)) {
    cuda::BiasActivationBackward fused = cuda::bias_activation_backward_cuda(
        grad_output, pre_activation,
        act.kind() == ActivationKind::kReLU ? cuda::EpilogueActivation::kReLU : cuda::EpilogueActivation::kGELU);
    return make_result(basic_ops(), std::move(fused.grad_pre_activation), {{std::move(fused.grad_bias)}, {}});
  }
#endif
  at::Tensor grad_pre = activation_math::backward(act.kind(), pre_activation, grad_output);
  // Summed in the op-math dtype (float for float16/bfloat16) and rounded once.
  const at::Tensor g2d = detail::flatten_rows(grad_pre);
  at::Tensor grad_bias = g2d.sum(0, /*keepdim=*/false, detail::opmath_type(g2d)).to(g2d.scalar_type());
  const bool half = g2d.scalar_type() == at::kBFloat16 || g2d.scalar_type() == at::kHalf;
  if (fault_enabled(Fault::kHalfAccumulation) && half && g2d.size(0) >= 64) {
    // planted: the reduction over rows accumulated in the dtype, one rounding per row
    grad_bias = at::zeros_like(g2d[0]);
    for (int64_t r = 0; r < g2d.size(0); ++r) grad_bias = grad_bias + g2d[r];
  }
  return make_result(basic_ops(), std::move(grad_pre), {{std::move(grad_bias)}, {}});
}

// ---------------------------------------------------------------------------------------
// BackwardAddRMSNorm: MakeExtraOutput, RMSNorm

BackwardAddRMSNorm::BackwardAddRMSNorm(std::vector<BasicOpPtr> ops) : FusedOp("BackwardAddRMSNorm", std::move(ops)) {}

GroupBackwardResult BackwardAddRMSNorm::backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                                                 const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const {
  const auto& norm = static_cast<const RMSNorm&>(*basic_ops()[1]);
  const at::Tensor& gamma = norm.gamma();
  const at::Tensor& input = ctxs[1]->saved.at(0);
  const at::Tensor& rstd = ctxs[1]->saved.at(1);
  const at::Tensor& grad_extra = grad_extra_outputs[0].at(0);  // undefined counts as zero
  // γ = gamma, or 1 + gamma with zero_centered_gamma (dγ/dgamma = 1, so dgamma = dγ).
  // g, x [rows, n], rstd [rows] -> dx = rstd·g·γ - x·rstd³·mean(g·γ·x) + grad_extra [rows, n]; dγ = Σ_rows g·x·rstd [n]
#ifdef GRADFUZZ_WITH_CUDA
  if (input.is_cuda() && grad_output.is_cuda() && gamma.is_cuda()) {
    const bool drop = fault_enabled(Fault::kHalfDroppedGradTerm) &&
                      (input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf);
    cuda::AddRmsNormBackward fused =
        cuda::add_rmsnorm_backward_cuda(grad_output, input, gamma, rstd, norm.eps(), drop ? at::Tensor() : grad_extra,
                                        norm.zero_centered_gamma() ? 1.0 : 0.0);
    return make_result(basic_ops(), fused.grad_input.to(grad_output.scalar_type()), {{}, {fused.grad_gamma}});
  }
#endif
  const int64_t n = input.size(-1);
  const at::ScalarType math = detail::opmath_type(input);
  const at::Tensor x = detail::flatten_rows(input).to(math);
  const at::Tensor g = detail::flatten_rows(grad_output).to(math);
  const at::Tensor r = rstd.reshape({-1, 1}).to(math);
  const at::Tensor g_gamma = g * norm.effective_gamma(math);
  const at::Tensor mean_dot = (g_gamma * x).sum(-1, /*keepdim=*/true) / static_cast<double>(n);
  at::Tensor grad_input = r * g_gamma - x * (r * r * r) * mean_dot;
  const bool half = input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf;
  if (grad_extra.defined() && !(fault_enabled(Fault::kHalfDroppedGradTerm) && half)) {
    grad_input = grad_input + detail::flatten_rows(grad_extra).to(math);  // (planted fault: dropped in half)
  }
  at::Tensor grad_gamma = (g * x * r).sum(0).to(gamma.scalar_type());
  grad_input = detail::unflatten_rows(grad_input.to(grad_output.scalar_type()), input);
  return make_result(basic_ops(), std::move(grad_input), {{}, {std::move(grad_gamma)}});
}

// ---------------------------------------------------------------------------------------
// Fusion functions

namespace {

/// A backward-only pattern of two basic ops A, B that all need backward; `accept` checks
/// the remaining preconditions and builds the fused op.
template <typename A, typename B, typename Make>
FusionFn pair_fusion(Make make) {
  return [make](const std::vector<FusedOpPtr>& groups, const FusionContext& context) {
    return apply_pattern(
        groups, context,
        [make](const std::vector<FusedOpPtr>& gs, size_t i, const FusionContext& ctx) -> std::pair<FusedOpPtr, size_t> {
          if (!detail::basic_run(gs, i, 2)) {
            return {nullptr, 0};
          }
          const A* a = detail::basic_as<A>(gs[i]);
          const B* b = detail::basic_as<B>(gs[i + 1]);
          if (a == nullptr || b == nullptr || !detail::all_need_backward(gs, i, 2, ctx)) {
            return {nullptr, 0};
          }
          FusedOpPtr fused = make(*a, *b, detail::collect_ops(gs, i, 2));
          return {fused, fused ? 2 : 0};
        });
  };
}

}  // namespace

FusionFn backward_linear_add_fusion() {
  return pair_fusion<MakeExtraOutput, Linear>(
      [](const MakeExtraOutput& /*make_extra*/, const Linear& /*linear*/, std::vector<BasicOpPtr> ops) -> FusedOpPtr {
        return std::make_shared<BackwardLinearAdd>(std::move(ops));
      });
}

FusionFn backward_linear_scale_fusion() {
  return pair_fusion<Linear, ConstantScale>(
      [](const Linear& /*linear*/, const ConstantScale& /*scale*/, std::vector<BasicOpPtr> ops) -> FusedOpPtr {
        return std::make_shared<BackwardLinearScale>(std::move(ops));
      });
}

FusionFn backward_activation_bias_fusion() {
  return pair_fusion<Bias, Activation>(
      [](const Bias& /*bias*/, const Activation& act, std::vector<BasicOpPtr> ops) -> FusedOpPtr {
        if (act.kind() != ActivationKind::kReLU && act.kind() != ActivationKind::kGELU) {
          return nullptr;
        }
        return std::make_shared<BackwardActivationBias>(std::move(ops));
      });
}

FusionFn backward_add_rmsnorm_fusion() {
  return pair_fusion<MakeExtraOutput, RMSNorm>(
      [](const MakeExtraOutput& /*make_extra*/, const RMSNorm& /*norm*/, std::vector<BasicOpPtr> ops) -> FusedOpPtr {
        return std::make_shared<BackwardAddRMSNorm>(std::move(ops));
      });
}

}  // namespace gradfuzz::ops
