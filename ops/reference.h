#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "ops/quantization.h"
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
  /// With ReferenceEvaluator::set_trace: per basic op (module index), the gradient of its main
  /// input (absent where that input needs none), and per (module index, slot) the gradient of
  /// that op's extra input, its own share where a channel has several consumers.
  std::map<int64_t, at::Tensor> grad_op_inputs;
  std::map<std::pair<int64_t, int64_t>, at::Tensor> grad_op_extra_inputs;
};

/// The non-differentiable points a reference evaluation passes near, and the branch each op
/// takes there (the low-precision oracle, oracle/rounding.h: an element whose reference lies
/// within rounding distance of a kink may be on the other side in a path, legitimately). A
/// reference op with kinks (ReLU at 0, Dispatch's argmax between the two largest logits)
/// records a signed distance per element through kink_probe() and takes the other branch
/// where the probe's flip mask says so.
class KinkProbe {
 public:
  /// One op's kinks: its module index and the distance of each element from its kink
  /// (ReLU: the pre-activation; Dispatch: top-1 minus top-2 logit per row), detached.
  struct Site {
    int64_t op = 0;
    at::Tensor distance;
  };
  /// Called by reference ops: records `distance` for the op being evaluated and returns its
  /// flip mask (bool, the shape of `distance`), undefined when none is set.
  at::Tensor record(const at::Tensor& distance);
  /// Elements of module `op` that must take the other branch in the next evaluation.
  void set_flip(int64_t op, at::Tensor mask) { flips_[op] = std::move(mask); }
  const std::vector<Site>& sites() const { return sites_; }
  /// Set by the evaluator around each op's reference call.
  void set_current_op(int64_t op) { current_op_ = op; }

 private:
  int64_t current_op_ = -1;
  std::vector<Site> sites_;
  std::map<int64_t, at::Tensor> flips_;
};

/// The probe of the reference evaluation running on this thread, or nullptr.
KinkProbe* kink_probe();

/// Plain-autograd evaluator over the same ops and wiring as a Sequential (runtime.md
/// section 10): each op's reference implementation on float64 copies of its parameters,
/// channels wired by name, no fuser and no custom autograd function. Under an FP8 recipe
/// (set_quantization) the quantized ops add gradient hooks that quantize-dequantize their
/// incoming gradient (ops/quantization.h), still plain autograd.
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

  /// Records kinks into `probe` (and applies its flips) in the next forward; nullptr: none.
  void set_kink_probe(KinkProbe* probe) { probe_ = probe; }
  /// Rounds like an implementation that rounds each op's results once more, in a float64
  /// evaluation: every floating output of every op (and plain module) is multiplied by
  /// (1 + relative * xi) in the next forward, and the gradient flowing back into it by
  /// (1 + relative * xi'), xi and xi' uniform in [-1, 1] drawn from `generator` (held, not
  /// owned; it must outlive the next forward). The low-precision rule (oracle/rounding.h)
  /// measures with it what a path's own order of rounding may move each element by, where the
  /// rounding baseline happens to be exact. relative = 0 (the default): no noise.
  void set_output_noise(double relative, at::Generator* generator) {
    noise_relative_ = relative;
    noise_generator_ = generator;
  }
  /// Quantizes as `quantization` says in the next forwards and backwards (held, not owned;
  /// it must outlive them): the module index is set before each op's reference call, and
  /// after_forward (with the grad mode the forward ran in) and after_backward are called at
  /// the end of each. nullptr: no recipe (cache_quantized_input still quantizes, unjittered).
  void set_quantization(ReferenceQuantization* quantization) { quantization_ = quantization; }

  /// Per fuser, channel name -> value (after forward).
  const std::vector<std::map<std::string, at::Tensor>>& channel_values() const { return channel_values_; }

  /// Records, in the next forward, every basic op's main input and output (op_outputs) and, in
  /// the backward after it, the gradient of each op's main input (grad_op_inputs): the
  /// reference's side of a traced path (harness::TraceEntry).
  void set_trace(bool on) { trace_ = on; }
  /// Per basic op (module index), its main output (after set_trace's forward), and per
  /// (module index, slot) its extra outputs.
  const std::map<int64_t, at::Tensor>& op_outputs() const { return op_outputs_; }
  const std::map<std::pair<int64_t, int64_t>, at::Tensor>& op_extra_outputs() const { return op_extra_outputs_; }

 private:
  const Sequential& sequential_;
  at::ScalarType compute_dtype_;
  at::Device device_;
  std::vector<std::vector<at::Tensor>> params_;
  at::Tensor input_;
  std::vector<at::Tensor> extra_inputs_;
  std::vector<at::Tensor> outputs_;
  std::vector<std::map<std::string, at::Tensor>> channel_values_;
  KinkProbe* probe_ = nullptr;
  ReferenceQuantization* quantization_ = nullptr;
  double noise_relative_ = 0;
  at::Generator* noise_generator_ = nullptr;
  bool trace_ = false;
  std::map<int64_t, at::Tensor> op_inputs_;
  std::map<int64_t, at::Tensor> op_outputs_;
  std::map<std::pair<int64_t, int64_t>, at::Tensor> op_extra_inputs_;
  std::map<std::pair<int64_t, int64_t>, at::Tensor> op_extra_outputs_;

  /// `t` with set_output_noise's forward noise applied and its backward noise hooked.
  at::Tensor with_noise(const at::Tensor& t) const;
};

}  // namespace gradfuzz::ops
