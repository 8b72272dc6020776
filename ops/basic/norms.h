#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "ops/basic_op.h"

namespace gradfuzz::ops {

/// Options of RMSNorm and LayerNorm over `features` (TE's te.ops.RMSNorm / LayerNorm):
/// `eps` inside the square root, and `zero_centered_gamma`: the gamma parameter w is
/// stored zero-centred and the effective scale is (1 + w), as TE computes it (in float32
/// for float16/bfloat16). The gradient w.r.t. w is the gradient w.r.t. the effective scale.
struct NormOptions {
  explicit NormOptions(int64_t features) : features_(features) {}
  NormOptions& eps(double value) {
    eps_ = value;
    return *this;
  }
  NormOptions& zero_centered_gamma(bool on) {
    zero_centered_gamma_ = on;
    return *this;
  }
  int64_t features() const { return features_; }
  double eps() const { return eps_; }
  bool zero_centered_gamma() const { return zero_centered_gamma_; }

 private:
  int64_t features_;
  double eps_ = 1e-5;
  bool zero_centered_gamma_ = false;
};

/// `y = x / rms(x) · γ`, rms(x) = sqrt(mean_j x² + eps), γ = gamma or, with
/// zero_centered_gamma, 1 + gamma. Params: gamma [n] (non-zero; zero-centred: the default
/// effective scale minus 1, so both forms start as the same function). Constructor throws
/// InvalidArgumentError for features < 1 or eps <= 0.
///
/// ctx layout: saved = {input [rows, n], rstd [rows]}; rstd = 1/rms in float32 for
///             float16/bfloat16 inputs, else in the input's dtype; saved_sizes = {}.
class RMSNorm final : public BasicOp {
 public:
  explicit RMSNorm(const NormOptions& options, const at::TensorOptions& tensor_options = {});
  explicit RMSNorm(int64_t features, double eps = 1e-5, const at::TensorOptions& tensor_options = {})
      : RMSNorm(NormOptions(features).eps(eps), tensor_options) {}
  std::vector<at::Tensor> parameters() const override { return {gamma_}; }
  /// Gamma [n] as stored (zero-centred with zero_centered_gamma); shares storage with the op.
  const at::Tensor& gamma() const { return gamma_; }
  /// The scale the math uses, γ [n] in `math` dtype: gamma, or 1 + gamma (added in `math`).
  at::Tensor effective_gamma(at::ScalarType math) const;
  const NormOptions& options() const { return options_; }
  double eps() const { return options_.eps(); }
  int64_t features() const { return options_.features(); }
  bool zero_centered_gamma() const { return options_.zero_centered_gamma(); }

  /// Hand-written forward math: (y, rstd) for x [rows, n] and the effective scale γ [n]
  /// (effective_gamma()); y in x's dtype.
  static std::pair<at::Tensor, at::Tensor> forward_math(const at::Tensor& x, const at::Tensor& gamma_eff, double eps);
  /// Hand-written backward math: (grad_input [rows, n], grad γ [n] in float of the math
  /// dtype) from the saved x and rstd, the effective scale γ [n] and grad_output [rows, n].
  static std::pair<at::Tensor, at::Tensor> backward_math(const at::Tensor& x, const at::Tensor& rstd,
                                                         const at::Tensor& gamma_eff, const at::Tensor& grad_output);

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  NormOptions options_;
  at::Tensor gamma_;
};

/// Standard layer norm over the last dim: `y = (x - μ)·rstd·γ + β`, rstd = 1/sqrt(var + eps)
/// (biased variance), γ = gamma or, with zero_centered_gamma, 1 + gamma. Params: gamma,
/// beta [n] (gamma initialised as RMSNorm's). Constructor throws as RMSNorm's.
///
/// ctx layout: saved = {input [rows, n], mean [rows], rstd [rows]}; the statistics in float32
///             for float16/bfloat16 inputs, else in the input's dtype; saved_sizes = {}.
class LayerNorm final : public BasicOp {
 public:
  explicit LayerNorm(const NormOptions& options, const at::TensorOptions& tensor_options = {});
  explicit LayerNorm(int64_t features, double eps = 1e-5, const at::TensorOptions& tensor_options = {})
      : LayerNorm(NormOptions(features).eps(eps), tensor_options) {}
  std::vector<at::Tensor> parameters() const override { return {gamma_, beta_}; }
  /// Gamma [n] as stored (zero-centred with zero_centered_gamma); shares storage with the op.
  const at::Tensor& gamma() const { return gamma_; }
  /// Beta [n]; shares storage with the op.
  const at::Tensor& beta() const { return beta_; }
  /// The scale the math uses, γ [n] in `math` dtype: gamma, or 1 + gamma (added in `math`).
  at::Tensor effective_gamma(at::ScalarType math) const;
  const NormOptions& options() const { return options_; }
  double eps() const { return options_.eps(); }
  int64_t features() const { return options_.features(); }
  bool zero_centered_gamma() const { return options_.zero_centered_gamma(); }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  NormOptions options_;
  at::Tensor gamma_;
  at::Tensor beta_;
};

}  // namespace gradfuzz::ops
