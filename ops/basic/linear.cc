#include "ops/basic/linear.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <sstream>

#include "ops/errors.h"
#include "ops/quantization.h"

namespace gradfuzz::ops {

namespace detail {

at::Tensor deterministic_param(at::IntArrayRef shape, const at::TensorOptions& options, uint64_t seed, double scale,
                               double center) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor u = at::rand(shape, gen, at::TensorOptions().dtype(at::kDouble)) * 2.0 - 1.0;
  // Magnitudes in [0.25, 1] keep every entry clearly away from zero.
  at::Tensor sign = at::where(u >= 0, at::ones_like(u), -at::ones_like(u));
  at::Tensor v = sign * (0.25 + 0.75 * u.abs());
  return (v * scale + center).to(options.requires_grad(false)).contiguous();
}

at::ScalarType opmath_type(const at::Tensor& t) {
  const at::ScalarType st = t.scalar_type();
  return (st == at::kHalf || st == at::kBFloat16) ? at::kFloat : st;
}

namespace {
std::string shape_text(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}
}  // namespace

void check_features(const std::string& op, const char* what, const at::Tensor& x, int64_t features) {
  if (!x.defined() || x.dim() < 1 || x.size(-1) != features) {
    throw InvalidArgumentError(op + ": " + what + " must have " + std::to_string(features) +
                               " features (last dim), got shape " +
                               (x.defined() ? shape_text(x) : std::string("<undefined>")));
  }
}

void check_row_vector(const std::string& op, int64_t slot, const char* what, const at::Tensor& t, int64_t rows) {
  if (!t.defined() || t.dim() != 1 || t.size(0) != rows) {
    throw InvalidArgumentError(op + " slot " + std::to_string(slot) + ": " + what +
                               " must have shape [rows=" + std::to_string(rows) + "], got " +
                               (t.defined() ? shape_text(t) : std::string("<undefined>")));
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Linear

Linear::Linear(const LinearOptions& options, const at::TensorOptions& tensor_options)
    : BasicOp("Linear"), in_(options.in()), out_(options.out()) {
  if (in_ < 1 || out_ < 1) {
    throw InvalidArgumentError("Linear: in and out features must be >= 1, got in=" + std::to_string(in_) +
                               ", out=" + std::to_string(out_));
  }
  weight_ = detail::deterministic_param({out_, in_}, tensor_options, detail::kParamSeed ^ 0x11,
                                        1.0 / std::sqrt(static_cast<double>(in_)))
                .requires_grad_(true);
}

void Linear::save_context(OpContext& ctx, const at::Tensor& input) {
  ctx.saved = {input};
  ctx.saved_sizes.clear();
}

bool Linear::casts_grad_input_for_previous_op(const QuantRecipe& recipe) const {
  return recipe.kind == RecipeKind::kDelayedScaling;
}

ForwardResult Linear::forward_impl(OpContext& ctx, const at::Tensor& input,
                                   const std::vector<at::Tensor>& /*extra_inputs*/) const {
  detail::check_features(type(), "input", input, in_);
  save_context(ctx, input);
  // input [.., in] · weightᵀ [in, out] -> [.., out]
  return {at::matmul(input, weight_.t()), pack({})};
}

BackwardResult Linear::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                     const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  const at::Tensor& input = ctx.saved.at(0);
  // grad_output [rows, out] · weight [out, in] -> grad_input [rows, in]
  at::Tensor grad_input = at::matmul(grad_output, weight_);
  // grad_outputᵀ [out, rows] · input [rows, in] -> grad_weight [out, in]
  at::Tensor grad_weight = grad_output.reshape({-1, out_}).t().mm(input.reshape({-1, in_}));
  return {grad_input, {grad_weight}, pack({})};
}

ReferenceResult Linear::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                       const std::vector<at::Tensor>& params) const {
  detail::check_features(type(), "input", input, in_);
  // Under an FP8 recipe: y = dq(Qi(x)) · dq(Qw(W))ᵀ, dy quantized in backward (BasicLinear).
  if (reference_recipe() != nullptr) return {reference_quantized_linear(input, params.at(0), /*group=*/0), {}};
  return {at::linear(input, params.at(0)), {}};
}

// ---------------------------------------------------------------------------------------
// Bias

Bias::Bias(int64_t features, const at::TensorOptions& tensor_options) : BasicOp("Bias"), features_(features) {
  if (features_ < 1) {
    throw InvalidArgumentError("Bias: features must be >= 1, got " + std::to_string(features_));
  }
  bias_ = detail::deterministic_param({features_}, tensor_options, detail::kParamSeed ^ 0x22, 0.5).requires_grad_(true);
}

bool Bias::casts_grad_input_for_previous_op(const QuantRecipe& recipe) const {
  return recipe.backward_override == BackwardOverride::kNone;
}

ForwardResult Bias::forward_impl(OpContext& ctx, const at::Tensor& input,
                                 const std::vector<at::Tensor>& /*extra_inputs*/) const {
  detail::check_features(type(), "input", input, features_);
  ctx.saved.clear();
  ctx.saved_sizes.clear();
  return {input + bias_, pack({})};
}

BackwardResult Bias::backward_impl(OpContext& /*ctx*/, const at::Tensor& grad_output,
                                   const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  // grad_output [rows, n] -> grad_input [rows, n], grad_bias = Σ_rows [n]
  at::Tensor grad_bias = grad_output.reshape({-1, features_}).sum(0);
  return {grad_output, {grad_bias}, pack({})};
}

ReferenceResult Bias::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                     const std::vector<at::Tensor>& params) const {
  detail::check_features(type(), "input", input, features_);
  return {at::add(input, params.at(0).unsqueeze(0)), {}};
}

// ---------------------------------------------------------------------------------------
// ConstantScale

ConstantScale::ConstantScale(double scale) : BasicOp("ConstantScale"), scale_(scale) {}

ForwardResult ConstantScale::forward_impl(OpContext& ctx, const at::Tensor& input,
                                          const std::vector<at::Tensor>& /*extra_inputs*/) const {
  ctx.saved.clear();
  ctx.saved_sizes.clear();
  return {input * scale_, pack({})};
}

BackwardResult ConstantScale::backward_impl(OpContext& /*ctx*/, const at::Tensor& grad_output,
                                            const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  // grad_output [rows, n] -> grad_input = c · grad_output [rows, n]
  return {grad_output * scale_, {}, pack({})};
}

ReferenceResult ConstantScale::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                              const std::vector<at::Tensor>& /*params*/) const {
  const at::Tensor value = at::mul(input, at::scalar_tensor(scale_, input.options()));
  // A fused op applies the scale to the gradient elsewhere (QuantizationPoints: TE's
  // BackwardLinearScale, as the previous Linear's GEMM alpha): the gradient passes through.
  const ReferenceQuantization* quantization = reference_quantization();
  if (quantization != nullptr && quantization->gradient_passthrough(quantization->current_op())) {
    return {value_with_gradient_of(value, input), {}};
  }
  return {value, {}};
}

// ---------------------------------------------------------------------------------------
// Identity

ForwardResult Identity::forward_impl(OpContext& ctx, const at::Tensor& input,
                                     const std::vector<at::Tensor>& /*extra_inputs*/) const {
  ctx.saved.clear();
  ctx.saved_sizes.clear();
  return {input, pack({})};
}

BackwardResult Identity::backward_impl(OpContext& /*ctx*/, const at::Tensor& grad_output,
                                       const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  // grad_output [rows, n] -> grad_input [rows, n]
  return {grad_output, {}, pack({})};
}

ReferenceResult Identity::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                         const std::vector<at::Tensor>& /*params*/) const {
  return {input.view_as(input), {}};
}

// ---------------------------------------------------------------------------------------
// Reshape

namespace {
void check_reshape(const std::string& op, const at::Tensor& input, int64_t features) {
  if (input.numel() % features != 0) {
    throw InvalidArgumentError(op + ": features=" + std::to_string(features) +
                               " must divide numel=" + std::to_string(input.numel()) + " of the input");
  }
}
}  // namespace

Reshape::Reshape(int64_t features) : BasicOp("Reshape"), features_(features) {
  if (features_ < 1) {
    throw InvalidArgumentError("Reshape: features must be >= 1, got " + std::to_string(features_));
  }
}

ForwardResult Reshape::forward_impl(OpContext& ctx, const at::Tensor& input,
                                    const std::vector<at::Tensor>& /*extra_inputs*/) const {
  check_reshape(type(), input, features_);
  ctx.saved.clear();
  ctx.saved_sizes = input.sizes().vec();
  return {input.reshape({-1, features_}), pack({})};
}

BackwardResult Reshape::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                      const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  // grad_output [numel/features, features] -> grad_input [input sizes]
  return {grad_output.reshape(ctx.saved_sizes), {}, pack({})};
}

ReferenceResult Reshape::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                        const std::vector<at::Tensor>& /*params*/) const {
  check_reshape(type(), input, features_);
  return {input.flatten().view({input.numel() / features_, features_}), {}};
}

}  // namespace gradfuzz::ops
