#include "reports/build_info.h"

#include <torch/version.h>

#include <ctime>

#include "ops/fusion_registry.h"
#include "ops/op_registry.h"
#include "reports/git_sha.h"  // generated at configure time (reports/CMakeLists.txt)

namespace gradfuzz::reports {

ToolInfo build_tool_info() {
  ToolInfo info;
  info.name = "gradfuzz";
  info.version = GRADFUZZ_VERSION_STRING;
  info.git_sha = GRADFUZZ_GIT_SHA;
  return info;
}

std::string torch_version() { return TORCH_VERSION; }

CoverageNames catalog_coverage_names(std::vector<std::string> feature_names) {
  CoverageNames names;
  names.ops = ops::OpRegistry::catalog().names();
  names.fusions = ops::FusionRegistry::catalog().names();
  names.features = std::move(feature_names);
  return names;
}

std::string utc_now_iso8601() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace gradfuzz::reports
