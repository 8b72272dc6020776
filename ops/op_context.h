#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace gradfuzz::ops {

/// Per forward call and per basic op: what backward needs and what the fuser decided.
/// Fused ops that stand in for a basic op in one pass only must fill (forward-only) or
/// accept (backward-only) exactly the layout that the basic op documents for `saved`.
struct OpContext {
  /// Whether this op's backward runs at all (runtime.md section 4).
  bool requires_backward = false;
  /// Per extra input slot: whether a gradient is wanted. Ops decide from this flag,
  /// never from requires_grad() of a tensor created inside the fused forward.
  std::vector<bool> grad_wanted;
  /// Per extra output slot: whether anyone outside the running group reads it (public,
  /// or a consumer in another group). A fused op may return undefined when false.
  std::vector<bool> output_needed;
  /// Tensors saved for backward, in the op's documented order.
  std::vector<at::Tensor> saved;
  /// Sizes saved for backward (shapes of inputs the op does not keep).
  std::vector<int64_t> saved_sizes;

  bool wants_grad(size_t slot) const { return slot < grad_wanted.size() && grad_wanted[slot]; }
};

}  // namespace gradfuzz::ops
