#include "ops/basic/norms.h"

#include <ATen/ATen.h>

#include <string>

#include "ops/basic/linear.h"
#include "ops/errors.h"

namespace gradfuzz::ops {

namespace {

void check_norm_args(const std::string& op, int64_t features, double eps) {
  if (features < 1) {
    throw InvalidArgumentError(op + ": features must be >= 1, got " + std::to_string(features));
  }
  if (!(eps > 0.0)) {
    throw InvalidArgumentError(op + ": eps must be > 0, got " + std::to_string(eps));
  }
}

/// Initial gamma of both norms: the direct form draws scales around 1; the zero-centred
/// form stores the same scales minus 1 (TE's zero_centered_gamma starts from zeros, but a
/// zero parameter would hide a forgotten "+ 1" less well than a non-zero one).
at::Tensor initial_gamma(const NormOptions& options, const at::TensorOptions& tensor_options, uint64_t seed) {
  return detail::deterministic_param({options.features()}, tensor_options, seed, 0.5,
                                     options.zero_centered_gamma() ? 0.0 : 1.0)
      .requires_grad_(true);
}

/// gamma in `math`, plus 1 when zero-centred: added after the cast, as TE's kernels add it
/// in float32 (a float16/bfloat16 1 + gamma would round).
at::Tensor effective_gamma_of(const at::Tensor& gamma, const NormOptions& options, at::ScalarType math) {
  const at::Tensor g = gamma.to(math);
  return options.zero_centered_gamma() ? g + 1.0 : g;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// RMSNorm

RMSNorm::RMSNorm(const NormOptions& options, const at::TensorOptions& tensor_options)
    : BasicOp("RMSNorm"), options_(options) {
  check_norm_args(type(), options_.features(), options_.eps());
  gamma_ = initial_gamma(options_, tensor_options, detail::kParamSeed ^ 0x55);
}

at::Tensor RMSNorm::effective_gamma(at::ScalarType math) const { return effective_gamma_of(gamma_, options_, math); }

std::pair<at::Tensor, at::Tensor> RMSNorm::forward_math(const at::Tensor& x, const at::Tensor& gamma_eff, double eps) {
  const at::ScalarType math = detail::opmath_type(x);
  const at::Tensor xf = x.to(math);
  at::Tensor rstd = at::rsqrt((xf * xf).mean(-1) + eps);
  at::Tensor y = (xf * rstd.unsqueeze(-1) * gamma_eff.to(math)).to(x.scalar_type());
  return {y, rstd};
}

std::pair<at::Tensor, at::Tensor> RMSNorm::backward_math(const at::Tensor& x, const at::Tensor& rstd,
                                                         const at::Tensor& gamma_eff, const at::Tensor& grad_output) {
  const at::ScalarType math = detail::opmath_type(x);
  const at::Tensor xf = x.to(math);
  const at::Tensor gf = grad_output.to(math);
  const at::Tensor r = rstd.to(math).unsqueeze(-1);
  const at::Tensor x_hat = xf * r;
  const int64_t n = x.size(-1);
  // Σ_rows grad_output [rows, n] ⊙ x̂ [rows, n] -> grad γ [n] (= grad gamma: dγ/dgamma = 1)
  at::Tensor grad_gamma = (gf * x_hat).reshape({-1, n}).sum(0);
  // dx = rstd·(dx̂ - x̂·mean_j(dx̂·x̂)), dx̂ = g·γ  ([rows, n] -> [rows, n])
  const at::Tensor grad_x_hat = gf * gamma_eff.to(math);
  at::Tensor grad_input = r * (grad_x_hat - x_hat * (grad_x_hat * x_hat).mean(-1, /*keepdim=*/true));
  return {grad_input.to(grad_output.scalar_type()), grad_gamma};
}

ForwardResult RMSNorm::forward_impl(OpContext& ctx, const at::Tensor& input,
                                    const std::vector<at::Tensor>& /*extra_inputs*/) const {
  detail::check_features(type(), "input", input, features());
  auto [output, rstd] = forward_math(input, effective_gamma(detail::opmath_type(input)), eps());
  ctx.saved = {input, rstd};
  ctx.saved_sizes.clear();
  return {output, pack({})};
}

BackwardResult RMSNorm::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                      const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  const at::Tensor& input = ctx.saved.at(0);
  auto [grad_input, grad_gamma] =
      backward_math(input, ctx.saved.at(1), effective_gamma(detail::opmath_type(input)), grad_output);
  return {grad_input, {grad_gamma.to(gamma_.scalar_type())}, pack({})};
}

ReferenceResult RMSNorm::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                        const std::vector<at::Tensor>& params) const {
  detail::check_features(type(), "input", input, features());
  const at::Tensor rms = at::sqrt(at::mean(at::square(input), {-1}, /*keepdim=*/true) + eps());
  // TE's definition (rmsnorm.py, op_onnx_forward): weight + 1 when zero-centred.
  const at::Tensor scale = zero_centered_gamma() ? params.at(0) + 1 : params.at(0);
  return {input / rms * scale, {}};
}

// ---------------------------------------------------------------------------------------
// LayerNorm

LayerNorm::LayerNorm(const NormOptions& options, const at::TensorOptions& tensor_options)
    : BasicOp("LayerNorm"), options_(options) {
  check_norm_args(type(), options_.features(), options_.eps());
  gamma_ = initial_gamma(options_, tensor_options, detail::kParamSeed ^ 0x66);
  beta_ = detail::deterministic_param({options_.features()}, tensor_options, detail::kParamSeed ^ 0x77, 0.5)
              .requires_grad_(true);
}

at::Tensor LayerNorm::effective_gamma(at::ScalarType math) const { return effective_gamma_of(gamma_, options_, math); }

ForwardResult LayerNorm::forward_impl(OpContext& ctx, const at::Tensor& input,
                                      const std::vector<at::Tensor>& /*extra_inputs*/) const {
  detail::check_features(type(), "input", input, features());
  const at::ScalarType math = detail::opmath_type(input);
  const at::Tensor xf = input.to(math);
  at::Tensor mean = xf.mean(-1);
  const at::Tensor centered = xf - mean.unsqueeze(-1);
  at::Tensor rstd = at::rsqrt((centered * centered).mean(-1) + eps());
  at::Tensor output = (centered * rstd.unsqueeze(-1) * effective_gamma(math) + beta_.to(math)).to(input.scalar_type());
  ctx.saved = {input, mean, rstd};
  ctx.saved_sizes.clear();
  return {output, pack({})};
}

BackwardResult LayerNorm::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                        const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  const at::Tensor& input = ctx.saved.at(0);
  const int64_t n = features();
  const at::ScalarType math = detail::opmath_type(input);
  const at::Tensor r = ctx.saved.at(2).to(math).unsqueeze(-1);
  const at::Tensor x_hat = (input.to(math) - ctx.saved.at(1).to(math).unsqueeze(-1)) * r;
  const at::Tensor gf = grad_output.to(math);
  // Σ_rows grad_output ⊙ x̂ -> grad_gamma [n] (dγ/dgamma = 1 in both forms); Σ_rows grad_output -> grad_beta [n]
  at::Tensor grad_gamma = (gf * x_hat).reshape({-1, n}).sum(0).to(gamma_.scalar_type());
  at::Tensor grad_beta = gf.reshape({-1, n}).sum(0).to(beta_.scalar_type());
  // dx = rstd·(dx̂ - mean_j dx̂ - x̂·mean_j(dx̂·x̂)), dx̂ = g·γ  ([rows, n] -> [rows, n])
  const at::Tensor grad_x_hat = gf * effective_gamma(math);
  at::Tensor grad_input = r * (grad_x_hat - grad_x_hat.mean(-1, /*keepdim=*/true) -
                               x_hat * (grad_x_hat * x_hat).mean(-1, /*keepdim=*/true));
  return {grad_input.to(grad_output.scalar_type()), {grad_gamma, grad_beta}, pack({})};
}

ReferenceResult LayerNorm::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                          const std::vector<at::Tensor>& params) const {
  detail::check_features(type(), "input", input, features());
  // TE's definition (layer_norm.py, op_onnx_forward): weight + 1 when zero-centred.
  const at::Tensor weight = zero_centered_gamma() ? params.at(0) + 1 : params.at(0);
  return {at::layer_norm(input, {features()}, weight, params.at(1), eps()), {}};
}

}  // namespace gradfuzz::ops
