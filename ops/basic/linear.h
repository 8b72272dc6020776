#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/basic_op.h"

namespace gradfuzz::ops {

namespace detail {

/// Seed of the deterministic parameter initialisation of the basic ops.
inline constexpr uint64_t kParamSeed = 0x9e3779b97f4a7c15ULL;

/// A tensor of `shape` with deterministic values: `center + scale·v` where |v| is in
/// [0.25, 1] with a random sign, drawn in float64 on the CPU from an explicit generator
/// seeded with `seed`, then moved to `options`. Never exactly zero when center is 0.
at::Tensor deterministic_param(at::IntArrayRef shape, const at::TensorOptions& options, uint64_t seed, double scale,
                               double center = 0.0);

/// The float dtype in which reduced-precision math is carried out (float32 for
/// float16/bfloat16, else the tensor's own dtype).
at::ScalarType opmath_type(const at::Tensor& t);

/// Throws InvalidArgumentError "<op>: <what> must have <expected> features, got <got>"
/// unless `x` is at least 1-D with size(-1) == features.
void check_features(const std::string& op, const char* what, const at::Tensor& x, int64_t features);

/// Throws InvalidArgumentError unless `t` is defined, 1-D and has `rows` elements
/// ("<op> slot <slot>: <what> must have shape [rows=R], got [...]").
void check_row_vector(const std::string& op, int64_t slot, const char* what, const at::Tensor& t, int64_t rows);

}  // namespace detail

/// Options of Linear: `y = x Wᵀ`, weight [out, in].
struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features) : in_(in_features), out_(out_features) {}
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }

 private:
  int64_t in_;
  int64_t out_;
};

/// `y = x Wᵀ`. Params: weight [out, in]. Throws InvalidArgumentError when in or out < 1.
///
/// ctx layout: saved = {input [rows, in]} (as given, any dtype of the weight);
///             saved_sizes = {} .
/// Backward uses weight() directly (not saved).
class Linear final : public BasicOp {
 public:
  explicit Linear(const LinearOptions& options, const at::TensorOptions& tensor_options = {});
  std::vector<at::Tensor> parameters() const override { return {weight_}; }
  /// Weight [out, in]; shares storage with the op.
  const at::Tensor& weight() const { return weight_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  /// Fills ctx exactly as forward_impl does (for forward-only fused ops).
  static void save_context(OpContext& ctx, const at::Tensor& input);
  /// basic_linear.py: BasicLinear.op_forward keeps the previous op's grad_output quantizer as
  /// its grad_input quantizer and _functional_backward writes the dgrad GEMM's output with
  /// it, only under a quantized backward with a Float8Quantizer (DelayedScaling); current and
  /// block scaling raise there instead ("Attempting to generate quantized grad input tensor
  /// with unsupported quantizer").
  bool casts_grad_input_for_previous_op(const QuantRecipe& recipe) const override;

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  int64_t in_;
  int64_t out_;
  at::Tensor weight_;
};

/// `y = x + b`. Params: bias [n], initialised non-zero.
///
/// ctx layout: saved = {}; saved_sizes = {}. Backward: dx = g, dbias = Σ_rows g.
class Bias final : public BasicOp {
 public:
  explicit Bias(int64_t features, const at::TensorOptions& tensor_options = {});
  std::vector<at::Tensor> parameters() const override { return {bias_}; }
  /// Bias [n]; shares storage with the op.
  const at::Tensor& bias() const { return bias_; }
  int64_t features() const { return features_; }
  /// bias.py: Bias.op_backward quantizes dy with the previous op's grad_output quantizer
  /// (tex.bgrad_quantize; db from the unquantized dy), except under a backward_override,
  /// where op_forward drops the quantizer.
  bool casts_grad_input_for_previous_op(const QuantRecipe& recipe) const override;

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  int64_t features_;
  at::Tensor bias_;
};

/// `y = c·x` (catalog attr "scale", default 0.5).
///
/// ctx layout: saved = {}; saved_sizes = {}. Backward: dx = c·g.
class ConstantScale final : public BasicOp {
 public:
  explicit ConstantScale(double scale = 0.5);
  double scale() const { return scale_; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  double scale_;
};

/// `y = x` (the input tensor itself in the fused path).
///
/// ctx layout: saved = {}; saved_sizes = {}. Backward: dx = g.
class Identity final : public BasicOp {
 public:
  Identity() : BasicOp("Identity") {}

 protected:
  GRADFUZZ_BASIC_OP_IMPL();
};

/// `y = x.reshape({-1, features})` (catalog attr "features"). Throws InvalidArgumentError
/// when features < 1, and in forward when features does not divide numel(x).
///
/// ctx layout: saved = {}; saved_sizes = input sizes (all dims).
/// Backward: dx = g.reshape(saved_sizes).
class Reshape final : public BasicOp {
 public:
  explicit Reshape(int64_t features);
  int64_t features() const { return features_; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  int64_t features_;
};

}  // namespace gradfuzz::ops
