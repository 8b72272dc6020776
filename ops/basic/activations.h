#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/basic_op.h"

namespace gradfuzz::ops {

/// The elementwise activations (fused ops dispatch on this).
enum class ActivationKind { kReLU, kGELU, kSReLU };

/// Catalog name of an activation ("ReLU", "GELU", "SReLU").
const char* activation_name(ActivationKind kind);

/// Hand-written elementwise math shared by the activation ops and the fused ops.
/// Reduced-precision inputs are computed in float32 and cast back to x's dtype.
namespace activation_math {

/// act(x) for ReLU, GELU (tanh form) or SReLU (relu(x)²); same shape and dtype as x.
at::Tensor forward(ActivationKind kind, const at::Tensor& x);
/// grad_output · act'(x); x and grad_output have the same shape; result in grad_output's dtype.
at::Tensor backward(ActivationKind kind, const at::Tensor& x, const at::Tensor& grad_output);

/// Splits x [rows, 2n] into the GLU halves a, b [rows, n]: with interleave k = 0 the first and
/// second halves, with k > 0 alternating k-wide a and b blocks. Returns (possibly strided) views.
std::pair<at::Tensor, at::Tensor> glu_split(const at::Tensor& x, int64_t interleave);
/// Inverse of glu_split: assembles [rows, 2n] from grad_a, grad_b [rows, n].
at::Tensor glu_merge(const at::Tensor& grad_a, const at::Tensor& grad_b, int64_t interleave);
/// silu(a)·b for x [rows, 2n] -> [rows, n], in x's dtype.
at::Tensor swiglu_forward(const at::Tensor& x, int64_t interleave);
/// Gradient of silu(a)·b: grad_output [rows, n] -> grad_input [rows, 2n] (grad_output's dtype).
at::Tensor swiglu_backward(const at::Tensor& x, const at::Tensor& grad_output, int64_t interleave);
/// Throws InvalidArgumentError unless features is even and, for k > 0, (2k) divides it.
void check_glu_features(const std::string& op, int64_t features, int64_t interleave);

}  // namespace activation_math

/// Elementwise ReLU / GELU (tanh form) / SReLU (relu(x)²).
///
/// ctx layout: saved = {input}; saved_sizes = {}. Backward: dx = g·act'(x).
class Activation : public BasicOp {
 public:
  explicit Activation(ActivationKind kind);
  ActivationKind kind() const { return kind_; }
  /// Fills ctx exactly as forward_impl does (for forward-only fused ops).
  static void save_context(OpContext& ctx, const at::Tensor& input);

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  ActivationKind kind_;
};

/// `y = relu(x)`.
class ReLU final : public Activation {
 public:
  ReLU() : Activation(ActivationKind::kReLU) {}
};

/// `y = gelu_tanh(x)` = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
class GELU final : public Activation {
 public:
  GELU() : Activation(ActivationKind::kGELU) {}
};

/// `y = relu(x)²`.
class SReLU final : public Activation {
 public:
  SReLU() : Activation(ActivationKind::kSReLU) {}
};

/// `y = silu(a)·b` with a, b the halves of x [rows, 2n] -> y [rows, n]; with interleave
/// k > 0 the features alternate k-wide a and b blocks (TE's `glu_interleave_size`), as in
/// ScaledSwiGLU. Constructor throws InvalidArgumentError for k < 0; forward throws on an odd
/// feature count or one that 2k does not divide.
///
/// ctx layout: saved = {input [rows, 2n]}; saved_sizes = {}.
class SwiGLU final : public BasicOp {
 public:
  explicit SwiGLU(int64_t interleave = 0);
  int64_t interleave() const { return interleave_; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  int64_t interleave_;
};

/// `y = silu(a)·b·s[r]`; extra input slot 0 = scales [rows]. With interleave k > 0 the
/// features alternate k-wide a and b blocks. Constructor throws InvalidArgumentError for
/// k < 0; forward throws when the feature count does not fit.
/// Backward: dx via silu'(a), d scales[r] = Σ_j g·silu(a)·b, computed only when
/// ctx.wants_grad(0) (else undefined), returned in the scales' dtype.
///
/// ctx layout: saved = {input [rows, 2n], scales [rows] (as passed)}; saved_sizes = {}.
class ScaledSwiGLU final : public BasicOp {
 public:
  explicit ScaledSwiGLU(int64_t interleave = 0);
  int64_t num_extra_inputs() const override { return 1; }
  int64_t interleave() const { return interleave_; }
  /// Fills ctx exactly as forward_impl does (for forward-only fused ops).
  static void save_context(OpContext& ctx, const at::Tensor& input, const at::Tensor& scales);

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  int64_t interleave_;
};

/// `y = relu(x)²·s[r]`; extra input slot 0 = scales [rows]. d scales[r] = Σ_j g·relu(x)²,
/// only when ctx.wants_grad(0) (else undefined).
///
/// ctx layout: saved = {input [rows, n], scales [rows] (as passed)}; saved_sizes = {}.
class ScaledSReLU final : public BasicOp {
 public:
  ScaledSReLU() : BasicOp("ScaledSReLU") {}
  int64_t num_extra_inputs() const override { return 1; }
  /// Fills ctx exactly as forward_impl does (for forward-only fused ops).
  static void save_context(OpContext& ctx, const at::Tensor& input, const at::Tensor& scales);

 protected:
  GRADFUZZ_BASIC_OP_IMPL();
};

}  // namespace gradfuzz::ops
