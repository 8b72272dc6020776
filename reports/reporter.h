#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/case_result.h"
#include "harness/case_spec.h"

namespace gradfuzz::reports {

/// Version of the report document (fuzzer.md "Reports"); bumped on any incompatible change.
inline constexpr int kReportSchemaVersion = 1;

/// How a report names the recipe of a case without one (a cluster's `recipes` counts; the
/// `recipe` value of a known-issue entry, campaign/known_issues.h).
inline constexpr const char* kNoRecipe = "none";

/// Which tool wrote a report. build_tool_info() gives the values of this build.
struct ToolInfo {
  std::string name = "gradfuzz";
  std::string version;
  /// `git rev-parse --short HEAD` at configure time, "unknown" outside a git checkout.
  std::string git_sha = "unknown";
};

/// Where the cases ran.
struct EnvironmentInfo {
  /// LibTorch version the tool was built against (TORCH_VERSION).
  std::string torch_version;
  /// "cpu" or "cuda" (the resolved device, never "auto").
  std::string device = "cpu";
  /// Human name of the device ("cpu", "NVIDIA H200").
  std::string device_name = "cpu";
  /// Backend under test ("model", "te", "torch") and the versions it reported (python,
  /// torch, transformer_engine).
  std::string backend = "model";
  std::map<std::string, std::string> backend_versions;
};

/// What the run was asked to do.
struct CampaignInfo {
  /// "fuzz", "replay", "selftest" or "bench".
  std::string command = "fuzz";
  uint64_t seed = 0;
  /// Requested case count; nullopt when the run was budgeted by time only.
  std::optional<int64_t> cases_requested;
  /// Requested wall-time budget; nullopt when the run was budgeted by count.
  std::optional<double> time_budget_s;
  std::vector<std::string> dtypes;
  std::vector<std::string> devices;
  /// Fault switched on for the run (ops::fault_name), nullopt when none.
  std::optional<std::string> fault;
  /// Worker processes (0: cases ran in the supervisor's process).
  int workers = 0;
  /// "i/N" when the run is one shard of a campaign (1-based), empty otherwise.
  std::string shard;
  /// Shape regime of generated cases ("tiny", "edge", "large", "mix"), empty for replay.
  std::string shapes;
  /// The known-issues file the run matched findings against (empty: none), and the case
  /// features the generator drew at reduced weight because of it (feature -> weight).
  std::string known_file;
  std::map<std::string, double> feature_weights;
  /// --recipe: "any", "none" or a recipe's name (empty for replay).
  std::string recipe;
};

/// Names listed in `coverage` even when their count is zero.
struct CoverageNames {
  std::vector<std::string> ops;
  std::vector<std::string> fusions;
  std::vector<std::string> features;
};

/// The context block written first (google/benchmark's Context): everything about the run
/// that is known before the first case. `date` is injected so golden tests can fix it.
struct ReportContext {
  ToolInfo tool;
  EnvironmentInfo environment;
  CampaignInfo campaign;
  CoverageNames coverage_names;
  /// ISO 8601 UTC time the run started ("2024-05-01T12:00:00Z").
  std::string date;
};

/// A known issue a finding matched (campaign/known_issues.h), as a report shows it.
struct KnownRef {
  std::string id;
  /// "open-defect" or "documented-behaviour".
  std::string status;
  std::string link;
  std::string note;
};

/// One alternative run of a cluster's case (campaign/confirmation.h): the same case with one
/// thing changed, and whether the cluster's finding stays.
struct VariantRun {
  /// "in_place_off", "unfused", "no_recipe", "float32", "without_op[2]".
  std::string name;
  /// What differs from the cluster's case, in words ("every in_place=1 set to 0").
  std::string change;
  /// "fails" (the cluster's signature again), "fails_otherwise" (other findings only),
  /// "passes", "raises" (the path raised instead), "unsupported" (the backend declined the
  /// variant), "not_run" (nothing to compare: the unfused path of a case that fused nothing).
  std::string verdict;
  /// The variant's signatures, when it failed.
  std::vector<std::string> signatures;
  bool operator==(const VariantRun& o) const {
    return name == o.name && change == o.change && verdict == o.verdict && signatures == o.signatures;
  }
};

/// How a new cluster was confirmed before it is called new (campaign/confirmation.h): its
/// case rerun as variants on the same values, the diagnosis they give, and where its values
/// first diverge.
struct Confirmation {
  std::vector<VariantRun> variants;
  /// "fused-only", "all-paths", "quantized-only", "half-only", "crash" or "known-consequence".
  std::string diagnosis;
  /// Where the cluster's case first diverges, in the path of the cluster's first finding (a
  /// traced run; absent for an error).
  std::optional<harness::Divergence> first_divergence;
  /// With "known-consequence": the known issue whose documented cause it follows from.
  std::string explained_by;
  bool operator==(const Confirmation& o) const {
    return variants == o.variants && diagnosis == o.diagnosis && first_divergence == o.first_divergence &&
           explained_by == o.explained_by;
  }
};

/// One finding cluster of a run: the root-cause signature (oracle/signature.h) and the
/// case saved for it (shrunk for a new cluster, as generated for a known one).
struct Finding {
  /// Result of running the saved case: every finding it has; those with `signature` are the
  /// cluster's.
  harness::CaseResult result;
  /// The cluster's root-cause signature.
  std::string signature;
  /// Path of the saved case file, as the user should type it.
  std::string case_file;
  /// One line that reproduces the finding: `gradfuzz replay <case_file> [--fault NAME]`.
  std::string reproduce;
  /// Fault that was switched on when it was found, if any.
  std::optional<std::string> fault;
  /// Cluster key (the signature, plus "|persists-without-fault" for a selftest finding the
  /// fault is not responsible for); empty: the signature.
  std::string cluster;
  /// dtype of the failing case ("float32"); empty when unknown. The HTML report plots
  /// errors per dtype from it.
  std::string dtype;
  /// The failing case's recipe (nullopt: none); written with `dtype` (both come from the
  /// saved case), so that report merge and diff can match known issues with case-level
  /// conditions (campaign/known_issues.h).
  std::optional<harness::RecipeSpec> recipe;
  /// The known issue it matches; nullopt: a new finding.
  std::optional<KnownRef> known;
  /// The alternative runs of a cluster that was new when found (campaign/confirmation.h);
  /// nullopt where none ran (a known cluster, a replay).
  std::optional<Confirmation> confirmation;
  /// The cluster key (cluster, else signature).
  const std::string& key() const { return cluster.empty() ? signature : cluster; }
};

/// Builds the reproduce line of fuzzer.md: `gradfuzz replay <case_file>` plus
/// ` --fault NAME` when a fault was on.
std::string reproduce_line(const std::string& case_file, const std::optional<std::string>& fault);

/// One case that ran: its result (counted in summary and coverage), the clusters its
/// findings were counted in, and the clusters it opened (the campaign deduplicates by
/// signature before reporting).
struct CaseRecord {
  harness::CaseResult result;
  /// One per cluster this case opened, with its saved case.
  std::vector<Finding> new_findings;
  /// Per distinct signature of the result: the key of the cluster it was counted in.
  std::vector<std::string> clusters;
  /// (cluster key, case file) of the examples of clusters saved from this case as generated.
  std::vector<std::pair<std::string, std::string>> example_files;
  /// The case's shape regime ("tiny", "edge", "large"; empty when not generated) and its
  /// seconds from hand-out to result.
  std::string regime;
  double seconds = 0;
  /// The case's recipe name, kNoRecipe without one; empty when not known. Counted per
  /// cluster (a finding's `recipes`).
  std::string recipe;
  /// The case's usage elements (CaseSpec::usage_coverage) and its number of calls.
  std::vector<std::string> usage;
  int64_t calls = 1;
};

/// Per-fault outcome of `gradfuzz selftest` (fuzzer.md "Faults").
struct SelftestEntry {
  std::string name;
  bool detected = false;
  /// 1-based index of the first failing case; nullopt when not detected.
  std::optional<int64_t> cases_to_detect;
  std::optional<double> seconds_to_detect;
  /// Catalog op count of the shrunk case; nullopt when not detected.
  std::optional<int64_t> shrunk_ops;
  std::optional<std::string> case_file;
  /// Exit status of replaying case_file with the fault on (must be 1) and off (must be 0).
  std::optional<int> replay_with_fault_exit;
  std::optional<int> replay_without_fault_exit;
  /// Findings of the fault's campaign that also fail with the fault off (real runtime bugs,
  /// reported among the findings but not taken as this fault's detection).
  int64_t unattributed_findings = 0;
  /// Findings of the fault's campaign that matched a known issue (not taken as detection).
  int64_t known_findings = 0;
  /// Whether this fault passed the selftest (detected and both replays behaved).
  bool ok() const { return detected && replay_with_fault_exit == 1 && replay_without_fault_exit == 0; }
};

/// What is only known at the end of a run.
struct RunSummary {
  double wall_s = 0;
  /// Present for selftest runs only.
  std::optional<std::vector<SelftestEntry>> selftest;
  /// False while the run goes on (a snapshot of the report) and for a run ended by a
  /// signal before its budget.
  bool complete = true;
};

/// A sink for run results over an injected std::ostream (google/benchmark's
/// BenchmarkReporter): report_context once, report_case per case, finalize once.
class Reporter {
 public:
  virtual ~Reporter() = default;
  /// Called once before the first case.
  virtual void report_context(const ReportContext& context) = 0;
  /// Called after each case, in run order.
  virtual void report_case(const CaseRecord& record) = 0;
  /// Called once at the end; writes whatever is buffered.
  virtual void finalize(const RunSummary& summary) = 0;
};

/// Forwards every call to several reporters (nullptr entries are skipped).
class MultiReporter final : public Reporter {
 public:
  explicit MultiReporter(std::vector<Reporter*> reporters) : reporters_(std::move(reporters)) {}
  void report_context(const ReportContext& context) override;
  void report_case(const CaseRecord& record) override;
  void finalize(const RunSummary& summary) override;

 private:
  std::vector<Reporter*> reporters_;
};

}  // namespace gradfuzz::reports
