#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/basic_op.h"

namespace gradfuzz::ops {

/// Options of GroupedLinear: G groups, in -> out features, optional bias [G, out] and
/// optional per-row bias scale (scale_bias, requires bias).
struct GroupedLinearOptions {
  GroupedLinearOptions(int64_t groups, int64_t in_features, int64_t out_features)
      : groups_(groups), in_(in_features), out_(out_features) {}
  GroupedLinearOptions& bias(bool on) {
    bias_ = on;
    return *this;
  }
  GroupedLinearOptions& scale_bias(bool on) {
    scale_bias_ = on;
    return *this;
  }
  int64_t groups() const { return groups_; }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  bool bias() const { return bias_; }
  bool scale_bias() const { return scale_bias_; }

 private:
  int64_t groups_;
  int64_t in_;
  int64_t out_;
  bool bias_ = true;
  bool scale_bias_ = false;
};

/// Validates split sizes against the group count and row count and returns them on the host.
/// Throws InvalidArgumentError ("<op> slot 0: split sizes must sum to rows=12, got 10"; also
/// for an undefined tensor, a non-integer dtype, numel != groups or a negative entry).
/// Shared by the fused path, the reference path and fused ops (validation, not math).
std::vector<int64_t> check_split_sizes(const std::string& op, const at::Tensor& split_sizes, int64_t groups,
                                       int64_t rows);

/// Rows split into G consecutive groups (split sizes, extra input slot 0; zeros allowed):
/// `y_r = x_r W_gᵀ + b_g`, or with scale_bias `x_r W_gᵀ + b_g·s[r]` with scales [rows] in
/// extra input slot 1. Params: weights [G, out, in], then bias [G, out] when bias.
/// Constructor throws InvalidArgumentError for sizes < 1 or scale_bias without bias.
/// Backward: d scales[r] = g_r · b_g only when ctx.wants_grad(1) (slot 0 instead under the
/// kScaleBiasGrad fault); split sizes never get a gradient.
///
/// ctx layout: saved = {input [rows, in]} plus, with scale_bias, {scales [rows] (as passed)};
///             saved_sizes = the G host split sizes.
class GroupedLinear final : public BasicOp {
 public:
  explicit GroupedLinear(const GroupedLinearOptions& options, const at::TensorOptions& tensor_options = {});
  int64_t num_extra_inputs() const override { return options_.scale_bias() ? 2 : 1; }
  std::vector<at::Tensor> parameters() const override;
  const GroupedLinearOptions& options() const { return options_; }
  /// Weights [G, out, in]; shares storage with the op.
  const at::Tensor& weight() const { return weight_; }
  /// Bias [G, out], undefined without bias; shares storage with the op.
  const at::Tensor& bias() const { return bias_; }
  /// Fills ctx exactly as forward_impl does (for forward-only fused ops); `scales` is
  /// ignored without scale_bias.
  void save_context(OpContext& ctx, const at::Tensor& input, const std::vector<int64_t>& split_sizes,
                    const at::Tensor& scales) const;

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  /// Validated extra inputs: split sizes read to the host, and the scales (undefined
  /// without scale_bias). Both paths validate alike, so they raise the same errors.
  struct CheckedInputs {
    std::vector<int64_t> split_sizes;
    at::Tensor scales;
  };
  CheckedInputs check_inputs(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs) const;

  GroupedLinearOptions options_;
  at::Tensor weight_;
  at::Tensor bias_;
};

}  // namespace gradfuzz::ops
