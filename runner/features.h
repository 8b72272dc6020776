#pragma once

// What a case exercises (fuzzer.md coverage.features): the features its spec has, the fused
// groups its fused path's plans show, the fused ops judged on values.

#include <string>
#include <vector>

#include "harness/builder.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"

namespace gradfuzz::runner {

/// Coverage features that `spec` exercises statically (fuzzer.md coverage.features names,
/// all but same_fusion_channel, which needs the fused plans).
std::vector<std::string> static_features(const harness::CaseSpec& spec, const harness::CasePlan& plan);

/// The fused groups that fired in `fused`'s plans, into result.fusions_fired and, per pass,
/// fused_forward and fused_backward (each name once, in order); the same_fusion_channel
/// feature where a group holds both ends of a channel.
void add_plan_coverage(const harness::CaseSpec& spec, const harness::PathRun& fused, harness::CaseResult& result);

/// The fused ops judged on values, once the fused path ran: result.fused_compared gets
/// fused_forward's names, then fused_backward's, each once.
void add_compared_fusions(harness::CaseResult& result);

}  // namespace gradfuzz::runner
