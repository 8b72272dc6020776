#pragma once

// Per-path quantization points (docs/BACKENDS.md "Per-path quantization points"): which fused
// ops of a path quantize at another point than its basic ops do, read from the fused groups
// the path's plans report, as ops::QuantizationPoints for the path's float64 reference.

#include <string>
#include <vector>

#include "harness/case_spec.h"
#include "harness/path_run.h"
#include "ops/quantization.h"

namespace gradfuzz::runner {

/// A fused op with a quantization point of its own: its name as a backend's plans report it,
/// the pass its group must be in, and what it changes in the reference of a path where it
/// fired over the spec ops [begin, end) (nothing where the group is not the op's pattern).
struct FusedQuantizationPoint {
  std::string fusion;
  bool backward = true;
  void (*apply)(const harness::CaseSpec& spec, int64_t begin, int64_t end, ops::QuantizationPoints& points);
};

/// The fused ops whose quantization points differ from their basic ops' (TE 2.20.2:
/// BackwardLinearScale, which quantizes the Linear's grad_output before the ConstantScale's
/// scale and applies the scale as the dgrad and wgrad GEMMs' alpha).
const std::vector<FusedQuantizationPoint>& fused_quantization_points();

/// The quantization points of a path that ran under a recipe: those of every fused group of
/// its (first call's) plans listed in fused_quantization_points(). Empty for a path without
/// such a group (an unfused path, a failed one).
ops::QuantizationPoints quantization_points(const harness::CaseSpec& spec, const harness::PathRun& run);

}  // namespace gradfuzz::runner
