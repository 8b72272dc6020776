#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "harness/case_spec.h"

namespace gradfuzz::reports {

/// A report document that cannot be read or does not have the shape of fuzzer.md
/// "Reports". The message starts with the file name and, for a bad value, its JSON
/// path: `last.json: /summary/cases_run: expected a non-negative integer, got string "x"`.
class ReportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Deepest nesting of a report document: a report nests about 6 deep; a deeper file is not
/// a report, and refusing it before parsing keeps the parser's recursion off the stack limit.
inline constexpr int64_t kMaxReportDepth = 64;

/// Checks that `doc` is a report document of schema kReportSchemaVersion with every field
/// that merge, diff and the JUnit and HTML writers read (extra fields are allowed). Values a
/// finding's details hold as null (NaN and infinite errors are written so) are accepted.
/// Throws ReportError "<name>: <json path>: ..." at the first problem.
void check_report(const nlohmann::ordered_json& doc, const std::string& name);

/// Parses `text` (the contents of the file `name`) and check_report()s it. Throws
/// ReportError naming the file for text that is not JSON, nests deeper than
/// kMaxReportDepth, or is not a report.
nlohmann::ordered_json parse_report(const std::string& text, const std::string& name);

/// Reads the file at `path` and parse_report()s it. Throws ReportError naming the file when
/// it cannot be read (missing, a directory, unreadable).
nlohmann::ordered_json load_report(const std::string& path);

/// Cluster key of a finding of a checked report: its `cluster` when present (a cluster
/// key that is not just the signature, e.g. "...|persists-without-fault"), else its
/// `signature`.
std::string cluster_key(const nlohmann::ordered_json& finding);

/// The recipe a finding of a checked report records for its saved case: nullopt when the
/// report does not record it (older reports, a finding without its case's dtype), else the
/// recipe (an empty optional: the case ran without one).
std::optional<std::optional<harness::RecipeSpec>> finding_recipe(const nlohmann::ordered_json& finding);

/// Failing cases counted in a finding's cluster: `count` when present, else 1 (a replay
/// reports each failing file as its own finding, without a count).
int64_t cluster_count(const nlohmann::ordered_json& finding);

}  // namespace gradfuzz::reports
