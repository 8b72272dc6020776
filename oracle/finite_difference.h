#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/builder.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"

namespace gradfuzz::oracle {

// The case's value types (harness/), used throughout this folder.
using harness::BuiltCase;
using harness::CaseSpec;
using harness::CaseTensors;
using harness::Finding;
using harness::PathRun;
using harness::VerdictKind;

/// Knobs of the finite-difference check of the reference.
struct FiniteDifferenceOptions {
  /// Largest total element count (main input + parameters + public floating extra inputs)
  /// for which finite differences run.
  int64_t max_elements = 128;
  /// Random directions per check (two reference forwards each). One direction drawn over
  /// every leaf at once already tests every gradient (a wrong one changes the directional
  /// derivative with probability 1); more cost two forwards each.
  int64_t directions = 1;
};

/// Checks the float64 reference's directional derivatives along random directions (drawn
/// from `generator`) against central differences of the reference forward over `built`
/// (the reference path's ops, whose parameters are perturbed in place and restored).
/// Appends a "reference~finite_difference" mismatch per disagreeing direction and a note.
/// Does nothing for cases above options.max_elements. Throws what the reference raises.
void check_finite_differences(const CaseSpec& spec, const CaseTensors& tensors, const PathRun& reference,
                              const BuiltCase& built, const FiniteDifferenceOptions& options, at::Generator& generator,
                              std::vector<Finding>& details, std::vector<std::string>& notes);

}  // namespace gradfuzz::oracle
