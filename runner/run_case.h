#pragma once

// One case through a backend's paths and the oracle (run_case), and what the oracle expects
// of a case's paths (judging_expectation). Its knobs are runner/run_options.h; the case as
// prepared (PreparedCase, prepare_case, reference_error_kind), runner/reference_set.h.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "harness/builder.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "oracle/oracle.h"
#include "runner/reference_set.h"
#include "runner/run_options.h"

namespace gradfuzz::runner {

// The case's value types (harness/), used throughout this folder.
using backends::Backend;
using harness::BackendCapabilities;
using harness::BuiltCase;
using harness::CasePlan;
using harness::CaseResult;
using harness::CaseSpec;
using harness::CaseTensors;
using harness::Finding;
using harness::PathRequest;
using harness::PathRun;
using harness::PathStatus;
using harness::RepeatCall;
using harness::VerdictKind;

/// Whether the case asks for an error (invalid-configuration knobs or a static wiring
/// problem): only then is "every path raised the same error" a pass.
bool intends_error(const CaseSpec& spec);

/// Runs `spec` through `backend`'s paths (fused, unfused, and the single-pass ones when they
/// differ) and the float64 reference, and yields every finding (fuzzer.md "Paths and
/// oracle"), in named stages: prepare (plan, values, reference ops), run the paths, the
/// reference, judge (errors and locks, every path that ran against the reference, caller
/// tensors, repeat calls and their plans, the fused path against the unfused one; for a
/// non-float64 case that fails the first check, the low-precision rule's evidence: rounding
/// baseline, input sensitivity, kinks), finite differences (small float64 cases), confirm (a
/// note per low-precision finding on whether it persists in the widest dtype), signatures.
/// Value comparisons go on after another path raised or wrote a caller tensor. A backend
/// crash or time-out is a `crash` / `timeout` finding; a valid case the backend declines is
/// `unsupported`. Only internal assertion failures (std::logic_error, std::invalid_argument
/// for a CUDA case without CUDA) and BackendUnavailable propagate. Invalid configurations
/// that raise the same error kind in every path pass; one that raises nowhere is a finding.
CaseResult run_case(const CaseSpec& spec, Backend& backend, const RunOptions& options = {});
/// run_case on the model backend (one per thread).
CaseResult run_case(const CaseSpec& spec, const RunOptions& options = {});

/// The bounds the oracle holds every path of `spec` to (exported scripts carry them): the
/// static tolerances for float64, the low-precision rule with its evidence (rounding
/// baseline, input sensitivity, kinks) otherwise, for every tensor the reference computes.
/// nullopt when the case cannot be built or its reference raises.
std::optional<oracle::CaseBounds> judging_bounds(const CaseSpec& spec, const RunOptions& options = {});

/// What the oracle expects of one path whose fused ops quantize elsewhere than its basic ops
/// (runner/quantization_points.h): the bounds, expected tensors and repeat calls' expected
/// tensors of the reference with that path's quantization points (its ReferenceSet in
/// run_case), which it is judged against instead of the basic ops' reference.
struct PathExpectation {
  /// The quantization points, described (ops::QuantizationPoints::describe).
  std::string points;
  std::optional<oracle::CaseBounds> bounds;
  std::map<std::string, at::Tensor> expected;
  std::vector<std::map<std::string, at::Tensor>> repeat_expected;
};

/// What the oracle expects of every path of a case: its bounds and, where the reference
/// quantizes (an FP8 recipe, an activation caching its input in FP8), the float64
/// quantize-dequantize reference's own values, which a script cannot recompute from the
/// catalog's high-precision math (exported scripts ship them); for a distributed case the
/// reference's values too (its script judges the ranks' results put together with them).
struct Expectation {
  std::optional<oracle::CaseBounds> bounds;
  bool quantized = false;
  /// With `quantized`: the first call's expected tensors by name, then each repeat call's
  /// (delayed scaling: the scales the calls before it left), on the CPU.
  std::map<std::string, at::Tensor> expected;
  std::vector<std::map<std::string, at::Tensor>> repeat_expected;
  /// By path name: the paths of `paths` (judging_expectation) whose quantization points are
  /// not the basic ops' (absent: the path is held to the fields above).
  std::map<std::string, PathExpectation> paths;
};
/// `paths`: the paths a script runs (name, fusions of the target backend). Under a recipe,
/// each one's quantization points come from the fusion plans of the model's fuser (the
/// model of te.ops' fuser, ops/fuser.h) for its fusions: the export does not run the target,
/// so these are the plans the target is expected to report (the fused groups a path's plans
/// report are what replay reads, runner/quantization_points.h). A non-distributed case only.
/// `target`: the capabilities of the backend the script is for, of which the FP8 fields
/// (fp8_reference_exact, fp8_gemm_accumulation) decide the FP8 evidence as replay on that
/// backend does (an H200's TE: the tight rule with its GEMMs' accumulation term); null: the
/// model's (exact FP8 GEMMs).
Expectation judging_expectation(const CaseSpec& spec, const RunOptions& options = {},
                                const std::vector<PathRequest>& paths = {},
                                const BackendCapabilities* target = nullptr);

}  // namespace gradfuzz::runner
