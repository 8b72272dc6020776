#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace gradfuzz::reports {

/// What a maintainer pastes into an issue for one cluster of a report (`gradfuzz report
/// upstream`): the README.md beside its upstream test.
struct UpstreamIssue {
  /// A directory name for the cluster: its diagnosis and root-cause key, file-system safe
  /// ("fused-only-BackwardLinearAdd-grad_param").
  std::string folder;
  /// One line: what is wrong, where, under which conditions.
  std::string title;
  /// The README.md text: title, versions, what is wrong with observed and expected numbers,
  /// the diagnosis and first divergence, the confirmation table, the suspected source
  /// location, and the test.
  std::string readme;
};

/// Whether a finding of a checked report is one to file: new (no known entry), confirmed by
/// its alternative runs, and not a documented cause's consequence.
bool is_upstream_candidate(const nlohmann::ordered_json& finding);

/// The issue text of `finding`, a finding of the checked report `report`, whose upstream
/// test `test_file` (a file name) holds `test_text`; `source`: where in the framework the first
/// divergence's class is defined (empty: unknown).
UpstreamIssue upstream_issue(const nlohmann::ordered_json& report, const nlohmann::ordered_json& finding,
                             const std::string& test_file, const std::string& test_text, const std::string& source);

}  // namespace gradfuzz::reports
