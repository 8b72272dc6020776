#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/builder.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"

namespace gradfuzz::harness {

/// Knobs of run_case; the defaults are what the fuzzer uses.
struct RunOptions {
  /// Run the unfused path (runtime without fusions) and compare it too. Skipped, as a repeat,
  /// for a case whose fused path ran without error and without any fused group.
  bool run_unfused = true;
  /// Compare fused against unfused directly when both ran without error.
  bool compare_fused_unfused = true;
  /// Check the reference gradient against central finite differences for small float64
  /// cases ("reference~finite_difference").
  bool finite_differences = true;
  /// Largest total element count (main input + parameters + public floating extra inputs)
  /// for which finite differences run.
  int64_t finite_difference_max_elements = 128;
  /// Random directions per finite-difference check (two reference forwards each). One
  /// direction drawn over every leaf at once already tests every gradient (a wrong one
  /// changes the directional derivative with probability 1); more cost two forwards each.
  int64_t finite_difference_directions = 1;
};

/// Whether the case asks for an error (invalid-configuration knobs or a static wiring
/// problem): only then is "every path raised the same error" a pass.
bool intends_error(const CaseSpec& spec);

/// Runs `spec` through the fused, unfused and reference paths (fuzzer.md "Paths and
/// oracle") and compares outputs, public extra outputs and every gradient. Runtime errors
/// (gradfuzz::Error, c10::Error, std::exception) become verdicts; only internal assertion
/// failures (std::logic_error, std::invalid_argument for a CUDA case without CUDA)
/// propagate. Invalid configurations that raise the same error kind in every path pass.
CaseResult run_case(const CaseSpec& spec, const RunOptions& options = {});

/// Coverage features that `spec` exercises statically (fuzzer.md coverage.features names,
/// all but same_fusion_channel, which needs the fused plans).
std::vector<std::string> static_features(const CaseSpec& spec, const CasePlan& plan);

}  // namespace gradfuzz::harness
