#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "ops/basic_op.h"

namespace gradfuzz::ops {

/// Mixture-of-experts dispatch. Extra input slot 0 = router logits [rows, G] (public by
/// default). Each row goes to group argmax(logits[r]); rows are reordered stably by group.
/// Extra outputs: 0 = split sizes (int64 [G]), 1 = token probs [rows] (softmax(logits)[row,
/// group] in the new order, a fresh tensor in the logits' dtype, differentiable w.r.t. the
/// logits), 2 = routing map (int64 [rows], map[i] = original row of new row i).
/// `y = x[map]`. Backward: dx[map[i]] = g[i]; d logits from the probs gradient only when
/// ctx.wants_grad(0) and that gradient is defined (else undefined). Forward throws
/// InvalidArgumentError when the logits are not [rows, G].
///
/// ctx layout: saved = {routing map int64 [rows], softmax probabilities [rows, G] in the
///             original row order (float32 for float16/bfloat16 logits, else their dtype),
///             group index int64 [rows] in the original row order}; saved_sizes = {logits dtype
///             as int64 (c10::ScalarType)}.
class Dispatch final : public BasicOp {
 public:
  explicit Dispatch(int64_t groups);
  int64_t num_extra_inputs() const override { return 1; }
  int64_t num_extra_outputs() const override { return 3; }
  int64_t groups() const { return groups_; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  int64_t groups_;
};

/// Undoes Dispatch's reordering: extra input slot 0 = routing map (int64 [rows]);
/// `y[map[i]] = x[i]`. Backward: dx = g[map]; the map never gets a gradient. Forward throws
/// InvalidArgumentError when the map is not an integer [rows] tensor.
///
/// ctx layout: saved = {routing map int64 [rows]}; saved_sizes = {}.
class Combine final : public BasicOp {
 public:
  Combine() : BasicOp("Combine") {}
  int64_t num_extra_inputs() const override { return 1; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();
};

}  // namespace gradfuzz::ops
