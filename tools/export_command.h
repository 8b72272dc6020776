#pragma once

// `gradfuzz export`: a case as a standalone test for the real framework, and the upstream
// test `gradfuzz report upstream` writes per cluster. Internal to gradfuzz_cli (tools/cli.cc).

#include <iosfwd>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "tools/report_tool.h"

namespace CLI {
class App;
}  // namespace CLI

namespace gradfuzz::tools::detail {

struct Flags;

/// `gradfuzz export CASE (--python | --upstream) [-o FILE]`.
int cmd_export(const Flags& f, const CLI::App& sub, std::ostream& out, std::ostream& err);

/// The upstream test of `cluster` (a finding of a report, whose record is the finding: no
/// replay on the target) for `target`, written to `test_path`; the export's notes also go to
/// `notes` (tools/report_tool.h: UpstreamExporter).
UpstreamTest export_upstream_test(const Flags& f, const nlohmann::ordered_json& cluster, const std::string& target,
                                  const std::string& test_path, std::ostream& notes);

}  // namespace gradfuzz::tools::detail
