#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/case_spec.h"

namespace gradfuzz::generators {

/// fuzzer.md `coverage.features` names, in report order.
const std::vector<std::string>& coverage_feature_names();

/// One contiguous run of modules inside one fuser that has the shape of a catalog fusion's
/// pattern (ops.md "Fused ops"): modules [begin, end).
struct PatternMatch {
  std::string fusion;
  int64_t begin = 0;
  int64_t end = 0;
};

/// Every occurrence of every catalog fusion's pattern (all its matches, overlapping ones
/// included); with `enabled_only`, only fusions listed in spec.fusions. Static: whether the
/// fusion then fires also depends on its preconditions (dtype, grad requirements).
std::vector<PatternMatch> fusion_pattern_matches(const harness::CaseSpec& spec, bool enabled_only);

/// What a case covers, counted statically from the spec (no run needed).
/// ops: occurrences per catalog op name; fusions: enabled pattern matches per fusion name;
/// features: 1 per feature present in the case (definitions in coverage.cc, one per name).
struct StaticCoverage {
  std::map<std::string, int64_t> ops;
  std::map<std::string, int64_t> fusions;
  std::map<std::string, int64_t> features;
  /// Adds every count of `other`.
  void merge(const StaticCoverage& other);
};

/// Static coverage of one valid case (an invalid case yields the counts it can compute).
StaticCoverage static_coverage(const harness::CaseSpec& spec);

}  // namespace gradfuzz::generators
