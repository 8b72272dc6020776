#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"
#include "oracle/tolerances.h"

namespace gradfuzz::oracle {

// The case's value types (harness/), used throughout this folder.
using harness::CaseSpec;
using harness::FuserPlans;
using harness::PathRun;
using harness::PlanGroup;
using harness::RepeatCall;
using harness::TensorMismatch;
using harness::VerdictKind;

/// How much of a low-precision case's own rounding a path may add, per element
/// (fuzzer.md "Paths and oracle"; the reasoning is in oracle.cc).
struct RoundingAllowance {
  /// Each element may be off by this many times the rounding baseline's error there ...
  double factor = 16;
  /// ... but never by more than this fraction of max(|expected_k|, rms(expected)).
  double cap = 0.25;
};

/// Compares the tensors of a case and records every failure with its full detail. Within
/// tolerance means, for every element k, all finite and
///   |got_k - expected_k| <= atol + rtol * (rms(expected) + |expected_k|)
///                           + min(factor * rounding_k, cap * max(|expected_k|, rms(expected)))
/// where rounding_k = |baseline_k - reference_k| (the case's dtype's own error at k; zero
/// without a baseline). The common case (within tolerance) is one loop over float64 host
/// copies; only a failing tensor pays for the detailed examination.
class Comparer {
 public:
  Comparer(std::vector<TensorMismatch>& details, std::vector<std::string>& notes, RoundingAllowance allowance = {})
      : details_(details), notes_(notes), allowance_(allowance) {}

  /// Compares `got` against `expected`. For gradients an undefined tensor means "none":
  /// none where the expected gradient is non-zero is a missing gradient; a gradient where
  /// none is expected must be zero. `rounding` (optional, same shape) is |baseline - reference|.
  void compare(const std::string& path_pair, const std::string& tensor, const std::string& role,
               const at::Tensor& expected, const at::Tensor& got, bool gradient, const Tolerance& tolerance,
               const at::Tensor& rounding = at::Tensor());

 private:
  std::vector<TensorMismatch>& details_;
  std::vector<std::string>& notes_;
  RoundingAllowance allowance_;
};

/// The per-element rounding error of `baseline` against `reference` for every tensor the
/// oracle compares, laid out like a PathRun (undefined where either side lacks the tensor or
/// the baseline is not finite there: a non-finite baseline grants nothing).
PathRun rounding_errors(const PathRun& reference, const PathRun& baseline);

/// Compares every tensor of `got` against `expected`: outputs, grad_input, every parameter
/// gradient, every public extra input gradient, and the channel gradients the expected side
/// has (and `got` exposes: a backend that does not expose a channel's gradient is not
/// judged on it). `rounding` (optional) holds per-element rounding errors (rounding_errors()).
void compare_paths(const std::string& path_pair, const CaseSpec& spec, const PathRun& expected, const PathRun& got,
                   const Tolerance& tolerance, Comparer& comparer, const PathRun* rounding = nullptr,
                   bool got_exposes_all_channels = true);

/// What call `call` of a repeat (CaseSpec::repeat_calls) must give, from the first call's
/// float64 reference (the values are the same): its outputs; unless the call is no_grad, the
/// parameter and extra-input gradients, and `grad_input` (the reference's input gradient,
/// taken even where the first call does not want it) when the call's input requires grad.
/// No channel gradients (those are judged on the first call).
PathRun expected_for_call(const PathRun& reference, const at::Tensor& grad_input, const RepeatCall& call);

/// Records a detail (role "plan") for each fuser whose plan in a repeat call differs from
/// the plan a fresh Sequential built for that call, with a note showing both.
void compare_plans(const PathRun& repeat, std::vector<TensorMismatch>& details, std::vector<std::string>& notes);

/// Whether every output and gradient of a path is finite.
bool all_finite(const PathRun& run);

/// Records a kModifiedInput detail for each caller-owned tensor `run` changed.
void check_caller_tensors(const PathRun& run, std::vector<TensorMismatch>& details);

}  // namespace gradfuzz::oracle
