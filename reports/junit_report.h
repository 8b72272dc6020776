#pragma once

#include <nlohmann/json.hpp>
#include <ostream>

namespace gradfuzz::reports {

/// Writes a JUnit XML document of a checked report (check_report) for CI dashboards: one
/// <testsuite> named `gradfuzz.<command>` with the run's context as properties, and
/// - for fuzz, replay and merged reports: one failing <testcase> per finding cluster (name:
///   the cluster key; failure message: signature, count and reproduce line; body: kind,
///   count, case file, examples, fault, details, error and reproduce line), or one passing
///   summary testcase when there is none;
/// - for selftest reports: one testcase per fault, failing when its selftest failed (the
///   command's exit status follows those, not the findings, which selftest expects); the
///   clusters are listed in the suite's <system-out>.
/// Every text is escaped, so any string in the report gives well-formed XML.
void write_junit(const nlohmann::ordered_json& report, std::ostream& out);

}  // namespace gradfuzz::reports
