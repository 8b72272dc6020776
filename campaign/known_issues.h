#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "harness/case_result.h"

namespace gradfuzz::campaign {

/// Version of the known-issues file format (docs/KNOWN.md).
inline constexpr int kKnownIssuesSchemaVersion = 1;

/// One known issue: what findings it covers, what it is, and how the generator may steer
/// around it (docs/KNOWN.md). Every `match` field that is set must hold.
struct KnownIssue {
  std::string id;
  /// "open-defect" (a bug of the backend, reported upstream) or "documented-behaviour"
  /// (the backend documents it, e.g. TE's in-place ops).
  std::string status;
  std::string link;
  std::string note;

  // Match fields.
  std::optional<harness::VerdictKind> kind;
  /// The finding's op (oracle/signature.h: the class that raised, the op that wrote, the
  /// fused op nearest to a wrong value), exactly.
  std::optional<std::string> op;
  /// Flags that must all be among the finding's options ("in_place=1").
  std::vector<std::string> options;
  std::optional<std::string> error_kind;
  /// ECMAScript pattern searched in the finding's message (compiled once, in message_pattern).
  std::optional<std::string> message;
  std::shared_ptr<const std::regex> message_pattern;
  std::optional<std::string> role;
  std::optional<std::string> phase;
  /// The finding's signature exactly (what `known accept` writes).
  std::optional<std::string> signature;
  std::optional<std::string> backend;
  /// Backend versions, ">=2.20,<2.21" (comma-separated bounds, numeric dotted comparison);
  /// compared with the backend's own version (transformer_engine for te, torch for torch).
  std::optional<std::string> versions;

  /// Steering: the case feature that triggers the issue ("generator_outputs",
  /// "call_then_bind", "in_place") and the share of cases that may draw it.
  std::optional<std::string> steer_feature;
  double steer_weight = 1;

  /// Whether `finding`, found on `backend` at `backend_version`, is this issue.
  bool matches(const harness::Finding& finding, const std::string& backend, const std::string& backend_version) const;
};

/// The case features a known issue may steer (the generator draws each in at most `weight`
/// of its cases: generators/case_gen.h GenOptions::feature_weights).
const std::vector<std::string>& steerable_features();

/// A known-issues file (`--known FILE`).
struct KnownIssues {
  std::filesystem::path path;
  std::string description;
  std::vector<KnownIssue> entries;

  /// The first entry matching `finding`, or nullptr.
  const KnownIssue* match(const harness::Finding& finding, const std::string& backend,
                          const std::string& backend_version) const;
  /// Marks every finding of `result` that an entry matches (Finding::known = its id).
  void mark(harness::CaseResult& result, const std::string& backend_version) const;
  /// The entry with `id`, or nullptr.
  const KnownIssue* entry(const std::string& id) const;
  /// Feature -> weight from the entries that steer (the smallest weight per feature), for
  /// entries of `backend` (or of no backend).
  std::map<std::string, double> feature_weights(const std::string& backend) const;
};

/// Reads a known-issues file; throws InputError naming the file and the JSON path of the
/// problem (bad JSON, unknown field, a kind or feature that does not exist, an invalid
/// pattern or version range, a duplicate id, a weight outside [0, 1]).
KnownIssues load_known_issues(const std::filesystem::path& path);
/// Parses a known-issues document; `where` names it in errors.
KnownIssues known_issues_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json known_issues_to_json(const KnownIssues& known);

/// Whether `version` lies in `range` (">=2.20,<2.21", "==2.20.2", "<3"). Throws
/// std::invalid_argument for a malformed range.
bool version_in_range(const std::string& version, const std::string& range);

}  // namespace gradfuzz::campaign
