#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "reports/reporter.h"

namespace gradfuzz::reports {

/// Writes the JSON document of fuzzer.md "Reports" to the injected stream at finalize():
/// schema_version, tool, environment, campaign, summary, coverage, findings and, for selftest
/// runs, selftest. Keys keep the order of the spec (context block first). Coverage lists every
/// name of ReportContext::coverage_names (zero counts included) plus any other name a case
/// reported. The stream must outlive the reporter.
class JsonReporter final : public Reporter {
 public:
  explicit JsonReporter(std::ostream& out) : out_(out) {}

  void report_context(const ReportContext& context) override;
  void report_case(const CaseRecord& record) override;
  void finalize(const RunSummary& summary) override;

  /// Findings reported so far.
  size_t findings_count() const { return findings_.size(); }
  /// The document finalize() writes (for callers that want to inspect it).
  nlohmann::ordered_json document(const RunSummary& summary) const;

 private:
  std::ostream& out_;
  ReportContext context_;
  int64_t cases_run_ = 0;
  int64_t passed_ = 0;
  int64_t failed_ = 0;
  int64_t unsupported_ = 0;
  std::map<std::string, int64_t> fused_forward_counts_;
  std::map<std::string, int64_t> fused_backward_counts_;
  /// Per hand-written CUDA kernel: launches, and launches with more than one block.
  std::map<std::string, std::array<int64_t, 2>> kernel_counts_;
  std::map<std::string, int64_t> op_counts_;
  std::map<std::string, int64_t> fusion_counts_;
  std::map<std::string, int64_t> feature_counts_;
  /// coverage.usage: cases per usage element; per recipe, the same and the calls run.
  std::map<std::string, int64_t> usage_counts_;
  std::map<std::string, std::map<std::string, int64_t>> usage_by_recipe_;
  /// coverage.fp8_state: delayed-scaling states judged, per recipe.
  std::map<std::string, int64_t> fp8_states_by_recipe_;
  std::map<std::string, int64_t> fp8_tensors_by_recipe_;
  std::map<std::string, int64_t> fused_compared_counts_;
  int64_t kink_elements_ = 0;
  int64_t cancellation_tensors_ = 0;
  /// Failing cases whose every finding matched a known issue.
  int64_t known_failed_ = 0;
  /// Per shape regime: cases and seconds.
  std::map<std::string, std::pair<int64_t, double>> regimes_;
  std::vector<Finding> findings_;
  /// Per known-issue id (campaign/known_issues.h): the cases with a finding it matched, and
  /// the distinct signatures it matched (the known findings by cause, not by signature).
  struct KnownTally {
    int64_t cases = 0;
    std::set<std::string> signatures;
  };
  std::map<std::string, KnownTally> known_tallies_;
  /// Per cluster key: failing cases counted in it, and example case files.
  std::map<std::string, int64_t> cluster_counts_;
  std::map<std::string, std::vector<std::string>> cluster_examples_;
  /// Per cluster key: its failing cases per recipe name (kNoRecipe without one).
  std::map<std::string, std::map<std::string, int64_t>> cluster_recipes_;
};

/// JSON form of one finding cluster: {signature, [cluster], kind, known, fault, backend,
/// [dtype, recipe], case_file, ops, details[...], [other_signatures], seed, reproduce} (cluster
/// when its key is not the signature; dtype and recipe (null: none) of the saved case when
/// known; details: the saved case's findings with the cluster's signature; other_signatures:
/// its other findings' signatures; plus error when the result carries notes; plus count and
/// examples when given: the failing cases counted in it, and recipes when given: those cases
/// per recipe name).
nlohmann::ordered_json finding_to_json(const Finding& finding, int64_t count = 0,
                                       const std::vector<std::string>& examples = {},
                                       const std::map<std::string, int64_t>& recipes = {});

/// JSON form of a case's recipe: {name, fp8_format, options}, as a case file writes it.
nlohmann::ordered_json recipe_to_json(const harness::RecipeSpec& recipe);

/// JSON form of one finding of a case (a finding's details entry).
nlohmann::ordered_json detail_to_json(const harness::Finding& finding);

/// JSON form of one selftest entry (absent values written as null).
nlohmann::ordered_json selftest_entry_to_json(const SelftestEntry& entry);

}  // namespace gradfuzz::reports
