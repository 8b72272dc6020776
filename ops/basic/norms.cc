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

}  // namespace

// ---------------------------------------------------------------------------------------
// RMSNorm

RMSNorm::RMSNorm(int64_t features, double eps, const at::TensorOptions& tensor_options)
    : BasicOp("RMSNorm"), features_(features), eps_(eps) {
  check_norm_args(type(), features_, eps_);
  gamma_ = detail::deterministic_param({features_}, tensor_options, detail::kParamSeed ^ 0x55, 0.5, 1.0)
               .requires_grad_(true);
}

std::pair<at::Tensor, at::Tensor> RMSNorm::forward_math(const at::Tensor& x, const at::Tensor& gamma, double eps) {
  const at::ScalarType math = detail::opmath_type(x);
  const at::Tensor xf = x.to(math);
  at::Tensor rstd = at::rsqrt((xf * xf).mean(-1) + eps);
  at::Tensor y = (xf * rstd.unsqueeze(-1) * gamma.to(math)).to(x.scalar_type());
  return {y, rstd};
}

std::pair<at::Tensor, at::Tensor> RMSNorm::backward_math(const at::Tensor& x, const at::Tensor& rstd,
                                                         const at::Tensor& gamma, const at::Tensor& grad_output) {
  const at::ScalarType math = detail::opmath_type(x);
  const at::Tensor xf = x.to(math);
  const at::Tensor gf = grad_output.to(math);
  const at::Tensor r = rstd.to(math).unsqueeze(-1);
  const at::Tensor x_hat = xf * r;
  const int64_t n = x.size(-1);
  // Σ_rows grad_output [rows, n] ⊙ x̂ [rows, n] -> grad_gamma [n]
  at::Tensor grad_gamma = (gf * x_hat).reshape({-1, n}).sum(0).to(gamma.scalar_type());
  // dx = rstd·(dx̂ - x̂·mean_j(dx̂·x̂)), dx̂ = g·γ  ([rows, n] -> [rows, n])
  const at::Tensor grad_x_hat = gf * gamma.to(math);
  at::Tensor grad_input = r * (grad_x_hat - x_hat * (grad_x_hat * x_hat).mean(-1, /*keepdim=*/true));
  return {grad_input.to(grad_output.scalar_type()), grad_gamma};
}

ForwardResult RMSNorm::forward_impl(OpContext& ctx, const at::Tensor& input,
                                    const std::vector<at::Tensor>& /*extra_inputs*/) const {
  detail::check_features(type(), "input", input, features_);
  auto [output, rstd] = forward_math(input, gamma_, eps_);
  ctx.saved = {input, rstd};
  ctx.saved_sizes.clear();
  return {output, pack({})};
}

BackwardResult RMSNorm::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                      const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  auto [grad_input, grad_gamma] = backward_math(ctx.saved.at(0), ctx.saved.at(1), gamma_, grad_output);
  return {grad_input, {grad_gamma}, pack({})};
}

ReferenceResult RMSNorm::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                        const std::vector<at::Tensor>& params) const {
  detail::check_features(type(), "input", input, features_);
  const at::Tensor rms = at::sqrt(at::mean(at::square(input), {-1}, /*keepdim=*/true) + eps_);
  return {input / rms * params.at(0), {}};
}

// ---------------------------------------------------------------------------------------
// LayerNorm

LayerNorm::LayerNorm(int64_t features, double eps, const at::TensorOptions& tensor_options)
    : BasicOp("LayerNorm"), features_(features), eps_(eps) {
  check_norm_args(type(), features_, eps_);
  gamma_ = detail::deterministic_param({features_}, tensor_options, detail::kParamSeed ^ 0x66, 0.5, 1.0)
               .requires_grad_(true);
  beta_ = detail::deterministic_param({features_}, tensor_options, detail::kParamSeed ^ 0x77, 0.5)
              .requires_grad_(true);
}

ForwardResult LayerNorm::forward_impl(OpContext& ctx, const at::Tensor& input,
                                      const std::vector<at::Tensor>& /*extra_inputs*/) const {
  detail::check_features(type(), "input", input, features_);
  const at::ScalarType math = detail::opmath_type(input);
  const at::Tensor xf = input.to(math);
  at::Tensor mean = xf.mean(-1);
  const at::Tensor centered = xf - mean.unsqueeze(-1);
  at::Tensor rstd = at::rsqrt((centered * centered).mean(-1) + eps_);
  at::Tensor output = (centered * rstd.unsqueeze(-1) * gamma_.to(math) + beta_.to(math)).to(input.scalar_type());
  ctx.saved = {input, mean, rstd};
  ctx.saved_sizes.clear();
  return {output, pack({})};
}

BackwardResult LayerNorm::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                        const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  const at::Tensor& input = ctx.saved.at(0);
  const at::ScalarType math = detail::opmath_type(input);
  const at::Tensor r = ctx.saved.at(2).to(math).unsqueeze(-1);
  const at::Tensor x_hat = (input.to(math) - ctx.saved.at(1).to(math).unsqueeze(-1)) * r;
  const at::Tensor gf = grad_output.to(math);
  // Σ_rows grad_output ⊙ x̂ -> grad_gamma [n]; Σ_rows grad_output -> grad_beta [n]
  at::Tensor grad_gamma = (gf * x_hat).reshape({-1, features_}).sum(0).to(gamma_.scalar_type());
  at::Tensor grad_beta = gf.reshape({-1, features_}).sum(0).to(beta_.scalar_type());
  // dx = rstd·(dx̂ - mean_j dx̂ - x̂·mean_j(dx̂·x̂)), dx̂ = g·γ  ([rows, n] -> [rows, n])
  const at::Tensor grad_x_hat = gf * gamma_.to(math);
  at::Tensor grad_input = r * (grad_x_hat - grad_x_hat.mean(-1, /*keepdim=*/true) -
                               x_hat * (grad_x_hat * x_hat).mean(-1, /*keepdim=*/true));
  return {grad_input.to(grad_output.scalar_type()), {grad_gamma, grad_beta}, pack({})};
}

ReferenceResult LayerNorm::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                          const std::vector<at::Tensor>& params) const {
  detail::check_features(type(), "input", input, features_);
  return {at::layer_norm(input, {features_}, params.at(0), params.at(1), eps_), {}};
}

}  // namespace gradfuzz::ops
