#pragma once

#include <string>
#include <vector>

#include "reports/reporter.h"

namespace gradfuzz::reports {

/// Name, version (the CMake project version) and git SHA of this build (the SHA is taken
/// at configure time; "unknown" when the source was not a git checkout).
ToolInfo build_tool_info();

/// TORCH_VERSION of the LibTorch headers this build used ("2.11.0").
std::string torch_version();

/// Coverage names with every catalog op (ops::OpRegistry::catalog().names()) and every
/// catalog fusion (ops::FusionRegistry::catalog().names()), plus the given feature names
/// (fuzzer.md coverage.features; the caller passes generators::coverage_feature_names(),
/// since reports/ does not depend on generators/).
CoverageNames catalog_coverage_names(std::vector<std::string> feature_names);

/// Current UTC time as ISO 8601 ("2024-05-01T12:00:00Z").
std::string utc_now_iso8601();

}  // namespace gradfuzz::reports
