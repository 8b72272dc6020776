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

/// What an activation keeps of its input for backward: the input itself, or (TE's
/// cache_quantized_input=1) its FP8 E4M3 current-scaling quantize-dequantize, so the backward
/// evaluates the derivative at dq(Q(x)) while the forward used x (activation.py, swiglu.py:
/// op_forward), with or without a recipe.
enum class InputCache { kHighPrecision, kQuantized };

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
/// What cache_quantized_input saves: x quantized to FP8 E4M3 with one current scale for the
/// whole tensor (448 / amax in fp32, 1 for an amax of 0 or inf, the fp32 product saturated and
/// rounded to nearest even on the E4M3 grid) and dequantized with the fp32 reciprocal scale,
/// in x's dtype (the product in float64 for float64 x, else in float32). Same shape as x.
at::Tensor cached_input(const at::Tensor& x);

}  // namespace activation_math

/// Elementwise ReLU / GELU (tanh form) / SReLU (relu(x)²); with InputCache::kQuantized the
/// backward's derivative is taken at activation_math::cached_input(x).
///
/// ctx layout: saved = {input, or cached_input(input) with kQuantized}; saved_sizes = {}.
/// Backward: dx = g·act'(saved).
class Activation : public BasicOp {
 public:
  explicit Activation(ActivationKind kind, InputCache cache = InputCache::kHighPrecision);
  ActivationKind kind() const { return kind_; }
  InputCache input_cache() const { return cache_; }
  /// Fills ctx exactly as forward_impl does (for forward-only fused ops), the input cached as
  /// this op caches it.
  void save_context(OpContext& ctx, const at::Tensor& input) const;
  /// activation.py: _ActivationOperation.op_backward casts dx with the previous op's
  /// grad_output quantizer, whatever the recipe's backward_override.
  bool casts_grad_input_for_previous_op(const QuantRecipe& recipe) const override;

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  ActivationKind kind_;
  InputCache cache_;
};

/// `y = relu(x)`.
class ReLU final : public Activation {
 public:
  explicit ReLU(InputCache cache = InputCache::kHighPrecision) : Activation(ActivationKind::kReLU, cache) {}
};

/// `y = gelu_tanh(x)` = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
class GELU final : public Activation {
 public:
  explicit GELU(InputCache cache = InputCache::kHighPrecision) : Activation(ActivationKind::kGELU, cache) {}
};

/// `y = relu(x)²`.
class SReLU final : public Activation {
 public:
  explicit SReLU(InputCache cache = InputCache::kHighPrecision) : Activation(ActivationKind::kSReLU, cache) {}
};

/// `y = silu(a)·b` with a, b the halves of x [rows, 2n] -> y [rows, n]; with interleave
/// k > 0 the features alternate k-wide a and b blocks (TE's `glu_interleave_size`), as in
/// ScaledSwiGLU. Constructor throws InvalidArgumentError for k < 0; forward throws on an odd
/// feature count or one that 2k does not divide. With InputCache::kQuantized both halves of
/// the backward come from activation_math::cached_input(x) (quantized before deinterleaving).
///
/// ctx layout: saved = {input [rows, 2n], or cached_input(input) with kQuantized}; saved_sizes = {}.
class SwiGLU final : public BasicOp {
 public:
  explicit SwiGLU(int64_t interleave = 0, InputCache cache = InputCache::kHighPrecision);
  int64_t interleave() const { return interleave_; }
  InputCache input_cache() const { return cache_; }
  /// swiglu.py: SwiGLU.op_backward casts dx with the previous op's grad_output quantizer,
  /// except with glu_interleave_size (interleave > 0), where it drops the quantizer.
  bool casts_grad_input_for_previous_op(const QuantRecipe& recipe) const override;

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  int64_t interleave_;
  InputCache cache_;
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
