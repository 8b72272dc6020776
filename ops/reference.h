#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "ops/sequential.h"

namespace gradfuzz::ops {

/// Gradients from the reference path (float64 CPU). Undefined where the corresponding
/// tensor does not require grad or the loss does not depend on it.
struct ReferenceGradients {
  at::Tensor grad_input;
  /// Per basic op of the Sequential (in module order, plain modules skipped), per parameter.
  std::vector<std::vector<at::Tensor>> grad_params;
  /// Per public extra input, in the Sequential's order.
  std::vector<at::Tensor> grad_extra_inputs;
  /// Per fuser, channel name -> gradient of the produced tensor (floating channels whose
  /// value requires grad only).
  std::vector<std::map<std::string, at::Tensor>> channel_grads;
};

/// Plain-autograd evaluator over the same ops and wiring as a Sequential (runtime.md
/// section 10): each op's reference implementation on float64 copies of its parameters,
/// channels wired by name, no fuser and no custom autograd function.
class ReferenceEvaluator {
 public:
  /// Validates wiring with the same rules and errors as the fuser; copies parameters (their
  /// requires_grad flags included) to float64 CPU leaves.
  /// `compute_dtype` other than float64 gives the same plain-autograd math rounded like a
  /// straightforward implementation in that dtype: the harness uses it to measure how much
  /// rounding error a case's dtype itself causes.
  /// `device`: where the reference computes (the CPU, or the case's GPU for cases too large
  /// for a float64 CPU evaluation); its outputs and gradients live there.
  explicit ReferenceEvaluator(const Sequential& sequential, at::ScalarType compute_dtype = at::kDouble,
                              at::Device device = at::kCPU);

  /// Main output then public extra outputs on the evaluator's device. Inputs are copied to compute-dtype
  /// CPU leaves with the same requires_grad (integer tensors stay integer). Under grad mode
  /// (the default) it records the graph backward() needs; under no_grad it only evaluates.
  std::vector<at::Tensor> forward(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs);
  /// Gradients of sum_i <outputs_i, cotangents_i>; call once after forward.
  ReferenceGradients backward(const std::vector<at::Tensor>& cotangents);

  /// Per fuser, channel name -> value (after forward).
  const std::vector<std::map<std::string, at::Tensor>>& channel_values() const { return channel_values_; }

 private:
  const Sequential& sequential_;
  at::ScalarType compute_dtype_;
  at::Device device_;
  std::vector<std::vector<at::Tensor>> params_;
  at::Tensor input_;
  std::vector<at::Tensor> extra_inputs_;
  std::vector<at::Tensor> outputs_;
  std::vector<std::map<std::string, at::Tensor>> channel_values_;
};

}  // namespace gradfuzz::ops
