#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "ops/basic_op.h"

namespace gradfuzz::ops {

/// `y = x / rms(x) · γ`, rms(x) = sqrt(mean_j x² + eps). Params: gamma [n] (non-zero).
///
/// ctx layout: saved = {input [rows, n], rstd [rows]}; rstd = 1/rms in float32 for
///             float16/bfloat16 inputs, else in the input's dtype; saved_sizes = {}.
class RMSNorm final : public BasicOp {
 public:
  explicit RMSNorm(int64_t features, double eps = 1e-5, const at::TensorOptions& tensor_options = {});
  std::vector<at::Tensor> parameters() const override { return {gamma_}; }
  /// Gamma [n]; shares storage with the op.
  const at::Tensor& gamma() const { return gamma_; }
  double eps() const { return eps_; }
  int64_t features() const { return features_; }

  /// Hand-written forward math: (y, rstd) for x [rows, n] and gamma [n]; y in x's dtype.
  static std::pair<at::Tensor, at::Tensor> forward_math(const at::Tensor& x, const at::Tensor& gamma,
                                                         double eps);
  /// Hand-written backward math: (grad_input [rows, n], grad_gamma [n]) from the saved
  /// x and rstd and grad_output [rows, n].
  static std::pair<at::Tensor, at::Tensor> backward_math(const at::Tensor& x, const at::Tensor& rstd,
                                                          const at::Tensor& gamma,
                                                          const at::Tensor& grad_output);

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  int64_t features_;
  double eps_;
  at::Tensor gamma_;
};

/// Standard layer norm over the last dim: `y = (x - μ)·rstd·γ + β`. Params: gamma, beta [n].
///
/// ctx layout: saved = {input [rows, n], mean [rows], rstd [rows]}; the statistics in float32
///             for float16/bfloat16 inputs, else in the input's dtype; saved_sizes = {}.
class LayerNorm final : public BasicOp {
 public:
  explicit LayerNorm(int64_t features, double eps = 1e-5, const at::TensorOptions& tensor_options = {});
  std::vector<at::Tensor> parameters() const override { return {gamma_, beta_}; }
  /// Gamma [n]; shares storage with the op.
  const at::Tensor& gamma() const { return gamma_; }
  /// Beta [n]; shares storage with the op.
  const at::Tensor& beta() const { return beta_; }
  double eps() const { return eps_; }
  int64_t features() const { return features_; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  int64_t features_;
  double eps_;
  at::Tensor gamma_;
  at::Tensor beta_;
};

}  // namespace gradfuzz::ops
