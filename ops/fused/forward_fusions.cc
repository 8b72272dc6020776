// Forward-only fusions: one fused forward that leaves every covered op's context exactly
// as that op's own forward would, so the unfused backward runs unchanged.
#include <ATen/ATen.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ops/basic/activations.h"
#include "ops/basic/channel_ops.h"
#include "ops/basic/linear.h"
#include "ops/errors.h"
#include "ops/faults.h"
#include "ops/fused/fused_ops.h"

#ifdef GRADFUZZ_WITH_CUDA
#include "ops/cuda/kernels.h"
#endif

namespace gradfuzz::ops {

namespace {

/// Activation op of a ForwardLinearBiasActivation group (nullptr for Linear, Bias alone).
const Activation* epilogue_activation(const std::vector<BasicOpPtr>& ops) {
  return ops.size() == 3 ? dynamic_cast<const Activation*>(ops[2].get()) : nullptr;
}

/// AddExtraInput's forward check (same error type and text as the op): e must match y.
void check_residual_shape(const BasicOp& add, at::IntArrayRef y_sizes, const at::Tensor& e) {
  if (!e.defined() || e.sizes() != y_sizes) {
    std::ostringstream os;
    os << add.type() << " slot 0: extra input must have the input's shape " << y_sizes << ", got ";
    if (e.defined()) {
      os << e.sizes();
    } else {
      os << "<undefined>";
    }
    throw InvalidArgumentError(os.str());
  }
}

/// Clears a context the way the parameter-free ops (Bias, ConstantScale, AddExtraInput) do.
/// The planted half-precision faults (ops/faults.h) act only on bfloat16/float16 tensors.
bool is_half(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf; }

void save_nothing(OpContext& ctx) {
  ctx.saved.clear();
  ctx.saved_sizes.clear();
}

/// y = alpha · x Wᵀ (+ bias) + e: one GEMM accumulating into e when the dtypes allow it,
/// else the unfused sequence of roundings (x Wᵀ, then + b, then + e, promoting like the ops).
at::Tensor linear_accumulate(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias, double alpha,
                             const at::Tensor& residual) {
  const at::Tensor x2d = detail::flatten_rows(input);
  const int64_t out = weight.size(0);
  if (detail::same_kind(residual, weight) && residual.numel() == x2d.size(0) * out &&
      (!bias.defined() || detail::same_kind(bias, weight))) {
    at::Tensor acc = residual.reshape({-1, out});
    if (bias.defined()) {
      acc = acc + bias;  // fresh: addmm below must not write into e
    }
    // e [rows, out] + alpha · x [rows, in] · Wᵀ [in, out]
    return detail::unflatten_rows(at::addmm(acc, x2d, weight.t(), /*beta=*/1, /*alpha=*/alpha), input);
  }
  at::Tensor y = at::matmul(input, weight.t());
  if (alpha != 1.0) {
    y = y * alpha;
  }
  if (bias.defined()) {
    y = y + bias;
  }
  return y + residual;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// ForwardLinearBiasActivation

ForwardLinearBiasActivation::ForwardLinearBiasActivation(std::vector<BasicOpPtr> ops)
    : FusedOp("ForwardLinearBiasActivation", std::move(ops)) {}

GroupForwardResult ForwardLinearBiasActivation::forward(
    std::vector<OpContext*>& ctxs, const at::Tensor& input,
    const std::vector<std::vector<at::Tensor>>& /*extra_inputs*/) const {
  const auto& linear = static_cast<const Linear&>(*basic_ops()[0]);
  const auto& bias_op = static_cast<const Bias&>(*basic_ops()[1]);
  const Activation* act = epilogue_activation(basic_ops());
  detail::check_features(linear.type(), "input", input, linear.in_features());

  Linear::save_context(*ctxs[0], input);
  save_nothing(*ctxs[1]);
  const at::Tensor& weight = linear.weight();
  const at::Tensor& bias = bias_op.bias();

  at::Tensor pre_activation;
  at::Tensor output;
#ifdef GRADFUZZ_WITH_CUDA
  if (input.is_cuda() && detail::same_kind(input, weight) && detail::same_kind(bias, weight)) {
    const cuda::EpilogueActivation kind =
        act == nullptr ? cuda::EpilogueActivation::kNone
                       : (act->kind() == ActivationKind::kReLU ? cuda::EpilogueActivation::kReLU
                                                               : cuda::EpilogueActivation::kGELU);
    // x [rows, in] · Wᵀ [in, out] -> [rows, out], then the bias + activation epilogue kernel
    const at::Tensor y = at::matmul(input, weight.t());
    cuda::BiasActivationForward epilogue = cuda::bias_activation_forward_cuda(y, bias, kind, act != nullptr);
    pre_activation = std::move(epilogue.pre_activation);
    output = std::move(epilogue.output);
  }
#endif
  if (!output.defined()) {
    if (detail::same_kind(input, weight) && detail::same_kind(bias, weight)) {
      // b + x [rows, in] · Wᵀ [in, out]: the bias rides in the GEMM's accumulator
      pre_activation = detail::unflatten_rows(at::addmm(bias, detail::flatten_rows(input), weight.t()), input);
    } else {
      pre_activation = at::matmul(input, weight.t()) + bias;
    }
    output = act == nullptr ? pre_activation : activation_math::forward(act->kind(), pre_activation);
  }
  if (act != nullptr) {
    // The activation's own caching (cache_quantized_input: its FP8 quantize-dequantize), so
    // the unfused backward sees what the unfused forward would have saved. TE never fuses
    // an activation here (forward_linear_bias_activation.py: fuse_forward_ops builds the op
    // with activation=None), so it always runs the activation's own op_forward.
    act->save_context(*ctxs[2], pre_activation);
  }
  if (fault_enabled(Fault::kHalfOutputScale) && is_half(output)) {
    output = output * 1.0625;  // planted: a constant factor in half precision only
  }
  return {output, detail::empty_extras(basic_ops())};
}

// ---------------------------------------------------------------------------------------
// ForwardLinearBiasAdd

ForwardLinearBiasAdd::ForwardLinearBiasAdd(std::vector<BasicOpPtr> ops)
    : FusedOp("ForwardLinearBiasAdd", std::move(ops)) {}

GroupForwardResult ForwardLinearBiasAdd::forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                                                 const std::vector<std::vector<at::Tensor>>& extra_inputs) const {
  const auto& linear = static_cast<const Linear&>(*basic_ops()[0]);
  const bool has_bias = basic_ops().size() == 3;
  const BasicOp& add = *basic_ops().back();
  detail::check_features(linear.type(), "input", input, linear.in_features());
  const at::Tensor& residual = extra_inputs.back().at(0);
  std::vector<int64_t> y_sizes = input.sizes().vec();
  y_sizes.back() = linear.out_features();
  check_residual_shape(add, y_sizes, residual);

  if (fault_enabled(Fault::kHalfSavedDtype) && is_half(input)) {
    // planted: the tensor saved for backward kept as float8 e4m3 (the wrong dtype)
    Linear::save_context(*ctxs[0], input.to(at::kFloat8_e4m3fn).to(input.scalar_type()));
  } else {
    Linear::save_context(*ctxs[0], input);
  }
  for (size_t i = 1; i < ctxs.size(); ++i) {
    save_nothing(*ctxs[i]);
  }
  const at::Tensor bias = has_bias ? static_cast<const Bias&>(*basic_ops()[1]).bias() : at::Tensor();
  return {linear_accumulate(input, linear.weight(), bias, 1.0, residual), detail::empty_extras(basic_ops())};
}

// ---------------------------------------------------------------------------------------
// ForwardLinearScaleAdd

ForwardLinearScaleAdd::ForwardLinearScaleAdd(std::vector<BasicOpPtr> ops)
    : FusedOp("ForwardLinearScaleAdd", std::move(ops)) {}

GroupForwardResult ForwardLinearScaleAdd::forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                                                  const std::vector<std::vector<at::Tensor>>& extra_inputs) const {
  const auto& linear = static_cast<const Linear&>(*basic_ops()[0]);
  const auto& scale = static_cast<const ConstantScale&>(*basic_ops()[1]);
  const BasicOp& add = *basic_ops()[2];
  detail::check_features(linear.type(), "input", input, linear.in_features());
  const at::Tensor& residual = extra_inputs[2].at(0);
  std::vector<int64_t> y_sizes = input.sizes().vec();
  y_sizes.back() = linear.out_features();
  check_residual_shape(add, y_sizes, residual);

  Linear::save_context(*ctxs[0], input);
  save_nothing(*ctxs[1]);
  save_nothing(*ctxs[2]);
  return {linear_accumulate(input, linear.weight(), at::Tensor(), scale.scale(), residual),
          detail::empty_extras(basic_ops())};
}

// ---------------------------------------------------------------------------------------
// Fusion functions

FusionFn forward_linear_bias_activation_fusion() {
  return [](const std::vector<FusedOpPtr>& groups, const FusionContext& context) {
    return apply_pattern(
        groups, context,
        [](const std::vector<FusedOpPtr>& gs, size_t i, const FusionContext& /*ctx*/) -> std::pair<FusedOpPtr, size_t> {
          const Linear* linear = detail::basic_as<Linear>(gs[i]);
          const Bias* bias = i + 1 < gs.size() ? detail::basic_as<Bias>(gs[i + 1]) : nullptr;
          if (linear == nullptr || bias == nullptr || bias->features() != linear->out_features() ||
              !detail::same_kind(bias->bias(), linear->weight())) {
            return {nullptr, 0};
          }
          size_t count = 2;
          if (i + 2 < gs.size()) {
            const Activation* act = detail::basic_as<Activation>(gs[i + 2]);
            if (act != nullptr && (act->kind() == ActivationKind::kReLU || act->kind() == ActivationKind::kGELU)) {
              count = 3;
            }
          }
          return {std::make_shared<ForwardLinearBiasActivation>(detail::collect_ops(gs, i, count)), count};
        });
  };
}

FusionFn forward_linear_bias_add_fusion() {
  return [](const std::vector<FusedOpPtr>& groups, const FusionContext& context) {
    return apply_pattern(
        groups, context,
        [](const std::vector<FusedOpPtr>& gs, size_t i, const FusionContext& /*ctx*/) -> std::pair<FusedOpPtr, size_t> {
          const Linear* linear = detail::basic_as<Linear>(gs[i]);
          if (linear == nullptr || i + 1 >= gs.size()) {
            return {nullptr, 0};
          }
          size_t count = 0;
          if (detail::basic_as<AddExtraInput>(gs[i + 1]) != nullptr) {
            count = 2;
          } else if (const Bias* bias = detail::basic_as<Bias>(gs[i + 1]);
                     bias != nullptr && i + 2 < gs.size() && detail::basic_as<AddExtraInput>(gs[i + 2]) != nullptr &&
                     bias->features() == linear->out_features() && detail::same_kind(bias->bias(), linear->weight())) {
            count = 3;
          }
          if (count == 0) {
            return {nullptr, 0};
          }
          return {std::make_shared<ForwardLinearBiasAdd>(detail::collect_ops(gs, i, count)), count};
        });
  };
}

FusionFn forward_linear_scale_add_fusion() {
  return [](const std::vector<FusedOpPtr>& groups, const FusionContext& context) {
    return apply_pattern(
        groups, context,
        [](const std::vector<FusedOpPtr>& gs, size_t i, const FusionContext& /*ctx*/) -> std::pair<FusedOpPtr, size_t> {
          if (!detail::basic_run(gs, i, 3) || detail::basic_as<Linear>(gs[i]) == nullptr ||
              detail::basic_as<ConstantScale>(gs[i + 1]) == nullptr ||
              detail::basic_as<AddExtraInput>(gs[i + 2]) == nullptr) {
            return {nullptr, 0};
          }
          return {std::make_shared<ForwardLinearScaleAdd>(detail::collect_ops(gs, i, 3)), 3};
        });
  };
}

}  // namespace gradfuzz::ops
