#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"
#include "oracle/tolerances.h"

namespace gradfuzz::oracle {

// The case's value types (harness/), used throughout this folder.
using harness::CaseSpec;
using harness::Finding;
using harness::FuserPlans;
using harness::PathRun;
using harness::PlanGroup;
using harness::RepeatCall;
using harness::VerdictKind;

/// What one compared tensor may be off by from the float64 reference. Element k of `got`
/// passes when both values are finite (or the allowance there is infinite: the case's dtype
/// itself cannot represent the value) and
///   |got_k - e_k| <= atol + rtol * (rms(e) + |e_k|) + allowance_k,
/// and the tensor as a whole when ||got - e||_2 over its finite elements <= norm_bound.
struct TensorBound {
  double atol = 0;
  double rtol = 0;
  /// Per element, >= 0, float64 CPU of the tensor's shape; undefined: none.
  at::Tensor allowance;
  double norm_bound = std::numeric_limits<double>::infinity();
};

/// The bounds of every compared tensor of a case, by tensor name ("output",
/// "grad_param[2].Linear[0]", "grad_channel[c3]"); a tensor without an entry gets `fallback`.
struct CaseBounds {
  Tolerance fallback;
  std::map<std::string, TensorBound> tensors;
  TensorBound bound(const std::string& tensor) const;
};

/// Compares tensors and records every failure as a Finding with its worst element. The
/// common case (within bounds) is one loop over float64 host copies.
class Comparer {
 public:
  Comparer(std::vector<Finding>& findings, std::vector<std::string>& notes) : findings_(findings), notes_(notes) {}

  /// Compares `got` against `expected` under `bound`. For gradients an undefined tensor
  /// means "none": none where the expected gradient is non-zero is a missing gradient; a
  /// gradient where none is expected must be zero.
  void compare(const std::string& path_pair, const std::string& tensor, const std::string& role,
               const at::Tensor& expected, const at::Tensor& got, bool gradient, const TensorBound& bound);

 private:
  std::vector<Finding>& findings_;
  std::vector<std::string>& notes_;
};

/// One tensor the oracle compares: its name and role, the expected and the path's value,
/// whether it is a gradient.
struct ComparedTensor {
  std::string name;
  std::string role;
  at::Tensor expected;
  at::Tensor got;
  bool gradient = false;
};

/// Every tensor compare_paths compares, in order: outputs, grad_input, every parameter
/// gradient, every public extra input gradient, and the channel gradients the expected side
/// has (and `got` exposes, unless got_exposes_all_channels: a backend that does not expose a
/// channel's gradient is not judged on it).
std::vector<ComparedTensor> compared_tensors(const CaseSpec& spec, const PathRun& expected, const PathRun& got,
                                             bool got_exposes_all_channels = true);

/// The name of a trace entry's tensor (harness::TraceEntry): "trace.forward[k]" for the main
/// output of op k (a forward group [b, e) hands on op e-1's), "trace.backward[k]" for the
/// gradient of op k's main input (a backward group [b, e) returns op b's).
std::string trace_name(const harness::TraceEntry& entry);
/// The name of one of its extras: "trace.forward[k].extra_output[s]" (op k's extra output s),
/// "trace.backward[k].grad_extra_input[s]" (the gradient op k returned for its extra input s).
std::string trace_name(const harness::TraceEntry& entry, const harness::TraceEntry::Extra& extra);

/// Every trace tensor of `run` by trace_name (entries without a tensor left out). Not compared
/// tensors: they localise a failure (oracle/divergence.h), and are bounded like the others.
std::map<std::string, at::Tensor> trace_tensors(const PathRun& run);

/// The expected side's tensors by name (compared_tensors of `run` against itself), and its
/// trace tensors when it has a trace.
std::map<std::string, at::Tensor> tensors_by_name(const CaseSpec& spec, const PathRun& run);

/// Compares every tensor of compared_tensors(spec, expected, got) under `bounds`.
void compare_paths(const std::string& path_pair, const CaseSpec& spec, const PathRun& expected, const PathRun& got,
                   const CaseBounds& bounds, Comparer& comparer, bool got_exposes_all_channels = true);

/// ||got - expected||_2 over the elements finite on both sides (0 for undefined tensors; an
/// undefined `got` counts as zeros).
double error_norm(const at::Tensor& expected, const at::Tensor& got);

/// What call `call` of a repeat (CaseSpec::repeat_calls) must give, from the first call's
/// float64 reference (the values are the same): its outputs; unless the call is no_grad, the
/// parameter and extra-input gradients, and `grad_input` (the reference's input gradient,
/// taken even where the first call does not want it) when the call's input requires grad.
/// No channel gradients (those are judged on the first call).
PathRun expected_for_call(const PathRun& reference, const at::Tensor& grad_input, const RepeatCall& call);

/// Records a finding (role "plan") for each fuser whose plan in a repeat call differs from
/// the plan a fresh Sequential built for that call, with both plans in its note.
void compare_plans(const PathRun& repeat, std::vector<Finding>& findings);
/// Records a finding (role "eval_graph") for each output of an evaluation pass (`repeat`, a
/// no_grad or inference_mode call) that carries an autograd graph (PathRun::graph_outputs).
void check_eval_graph(const CaseSpec& spec, const PathRun& repeat, std::vector<Finding>& findings);
/// Records a finding (role "fp8_state") for each violation of delayed scaling's documented
/// rule the backend judged in `run` (PathRun::fp8_state_violations), signed by its op's name,
/// the quantizer's pass and the rule's part ("forward.rule", "backward.update", "checkpoint").
void check_fp8_state(const CaseSpec& spec, const PathRun& run, std::vector<Finding>& findings);

/// Whether every output and gradient of a path is finite.
bool all_finite(const PathRun& run);

/// Records a kModifiedInput finding for each caller-owned tensor `run` changed.
void check_caller_tensors(const PathRun& run, std::vector<Finding>& findings);

}  // namespace gradfuzz::oracle
