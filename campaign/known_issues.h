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
#include "harness/case_spec.h"

namespace gradfuzz::campaign {

/// Version of the known-issues file format (docs/KNOWN.md).
inline constexpr int kKnownIssuesSchemaVersion = 1;

/// What a known issue's case-level match fields (recipe, recipe_options, dtype) read: the
/// dtype and recipe of the case a finding came from. From the case itself (campaign, replay,
/// selftest) or from a report's record of it (report merge and diff), where older reports
/// lack them: then a case-level field does not hold, so the finding stays new.
struct CaseFacts {
  /// The case's dtype ("float32"); empty when not recorded.
  std::string dtype;
  /// The case's recipe; nullopt: the case ran without one.
  std::optional<harness::RecipeSpec> recipe;
  /// False when the record does not say which recipe the case ran under.
  bool recipe_recorded = true;
  /// The case's op types (each once, the Boundary left out).
  std::vector<std::string> ops;
  /// False when the record does not say which ops the case has.
  bool ops_recorded = true;
  /// The dtype and recipe of `spec`.
  static CaseFacts of(const harness::CaseSpec& spec);
};

/// One `recipe_options` condition, "key=value" or "key=v1|v2": the case's recipe has option
/// `key` (or its fp8_format, for key "fp8_format") with one of `values`.
struct RecipeOptionCondition {
  std::string key;
  std::vector<std::string> values;
  /// As written in the file (what known_issues_to_json writes back).
  std::string text;
};

/// What a known issue is, and the evidence for it (docs/KNOWN.md, `basis`): one of three kinds,
/// each with the status it goes with.
struct KnownBasis {
  /// "documented" (the backend documents the behaviour: its doc string, docs or a test of
  /// its own show it), "defect" (the backend is wrong by its own documentation, tests or
  /// design) or "stricter-rule" (the backend behaves as it means to; gradfuzz's runtime spec,
  /// ../shared/spec/runtime.md, asks for more than the backend promises).
  std::string kind;
  /// Where in the backend it shows: file:line of the release, a doc string, a test's name, a PR.
  std::string evidence;
  /// For a defect: the path, relative to the repository root, of the test in the backend's
  /// own style that fails on the release with the defect; empty until it is written.
  std::string upstream_test;
  /// The upstream issue or pull request that reports, documents or fixes it; empty if none.
  std::string upstream;
};

/// The basis kinds, in the order error messages list them.
const std::vector<std::string>& known_basis_kinds();
/// The status an entry of basis `kind` has ("defect" -> "open-defect", "documented" ->
/// "documented-behaviour", "stricter-rule" -> "stricter-rule"); empty for an unknown kind.
std::string status_for_basis(const std::string& kind);
/// How `known accept` begins the evidence of an entry it writes: nobody has yet read the
/// backend to say what the cluster is (a shipped file has no such entry).
inline constexpr const char* kUnestablishedEvidence = "not established";

/// One known issue: what findings it covers, what it is, and how the generator may steer
/// around it (docs/KNOWN.md). Every `match` field that is set must hold.
struct KnownIssue {
  std::string id;
  /// "open-defect" (a bug of the backend), "documented-behaviour" (the backend documents it,
  /// e.g. TE's in-place ops) or "stricter-rule" (gradfuzz's runtime spec asks for more than
  /// the backend promises). With a basis, the status its kind goes with.
  std::string status;
  std::string link;
  std::string note;
  /// What the entry is and the evidence; optional in the format (an entry `known accept`
  /// wrote has one saying it is not established yet), present in every shipped entry.
  std::optional<KnownBasis> basis;

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
  /// Or any one of these exactly: the signatures one cause takes (a defect seen at its cause
  /// by a quantized tensor's check and in the values it spoils).
  std::vector<std::string> signatures;
  std::optional<std::string> backend;
  /// Backend versions, ">=2.20,<2.21" (comma-separated bounds, numeric dotted comparison);
  /// compared with the backend's own version (transformer_engine for te, torch for torch).
  std::optional<std::string> versions;

  // Case-level match fields: conditions on the case the finding came from.
  /// The case's recipe name exactly ("DelayedScaling"), or "none" for a case without one.
  std::optional<std::string> recipe;
  /// Conditions that must all hold in the case's recipe (a case without one has none). An
  /// option the case's recipe does not name does not hold (generated cases name every option
  /// they draw): a hand-written case then reports the finding as new rather than hide it.
  std::vector<RecipeOptionCondition> recipe_options;
  /// The case's dtype ("float32").
  std::optional<std::string> dtype;
  /// Op types the case must have, each (anywhere in it): for a defect of one op whose wrong
  /// values show first in another op's tensors (a gradient the op computes for the op before
  /// it is that op's input gradient, so the finding's op is the upstream one).
  std::vector<std::string> case_ops;

  /// Steering: the case feature that triggers the issue ("generator_outputs",
  /// "call_then_bind", "in_place") and the share of cases that may draw it.
  std::optional<std::string> steer_feature;
  double steer_weight = 1;

  /// Whether `finding`, found in a case with `facts` on `backend` at `backend_version`, is
  /// this issue.
  bool matches(const harness::Finding& finding, const CaseFacts& facts, const std::string& backend,
               const std::string& backend_version) const;
  /// Whether a case-level field (recipe, recipe_options, dtype, case_ops) is set: the entry then splits
  /// the cases of one signature into known and new ones (ClusterTable::key).
  bool case_level() const;
};

/// The case features a known issue may steer (the generator draws each in at most `weight`
/// of its cases: generators/case_gen.h GenOptions::feature_weights).
const std::vector<std::string>& steerable_features();

/// A known-issues file (`--known FILE`).
struct KnownIssues {
  std::filesystem::path path;
  std::string description;
  std::vector<KnownIssue> entries;

  /// The first entry matching `finding` of a case with `facts`, or nullptr.
  const KnownIssue* match(const harness::Finding& finding, const CaseFacts& facts, const std::string& backend,
                          const std::string& backend_version) const;
  /// Marks every finding of `result`, the result of running `spec`, that an entry matches
  /// (Finding::known = its id; empty for the others).
  void mark(harness::CaseResult& result, const harness::CaseSpec& spec, const std::string& backend_version) const;
  /// The entry with `id`, or nullptr.
  const KnownIssue* entry(const std::string& id) const;
  /// Feature -> weight from the entries that steer (the smallest weight per feature), for
  /// entries of `backend` (or of no backend).
  std::map<std::string, double> feature_weights(const std::string& backend) const;
};

/// Reads a known-issues file; throws InputError naming the file and the JSON path of the
/// problem (bad JSON, unknown field, a kind, feature, recipe, recipe option or value, or dtype
/// that does not exist, an invalid pattern or version range, a duplicate id, a weight outside
/// [0, 1], a basis of an unknown kind, without evidence, or whose kind the status does not
/// go with).
KnownIssues load_known_issues(const std::filesystem::path& path);
/// Parses a known-issues document; `where` names it in errors.
KnownIssues known_issues_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json known_issues_to_json(const KnownIssues& known);

/// Whether `version` lies in `range` (">=2.20,<2.21", "==2.20.2", "<3"). Throws
/// std::invalid_argument for a malformed range.
bool version_in_range(const std::string& version, const std::string& range);

}  // namespace gradfuzz::campaign
