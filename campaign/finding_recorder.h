#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "campaign/campaign.h"
#include "campaign/case_runner.h"
#include "campaign/clusters.h"
#include "corpus/case_file.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "reports/reporter.h"

namespace gradfuzz::campaign {

/// Whether `result` (marked against the known issues) has a new wrong or missing value: its
/// case is then run again traced (CaseRunner::run_traced), whose signatures say where the
/// values first diverge. The campaign and replay do the same, so a replay signs a case as the
/// campaign that saved it did.
bool wants_trace(const harness::CaseResult& result);

/// What a campaign does with each failing case (run_campaign's loop hands them over): a case
/// with a new value finding is run again traced, so that its value findings are signed by
/// where the values first diverge (runner::RunOptions::trace) and a defect's downstream
/// symptoms are one cluster; each signature of the case is counted in its cluster; the first
/// case of a new cluster is shrunk for that signature, confirmed by its alternative runs
/// (confirmation.h: a cluster whose documented cause explains it becomes that known issue's)
/// and saved with the finding it stands for (corpus::SavedFinding); the first case of a known
/// cluster is saved as generated; a few further cases of each cluster are kept as examples.
class FindingRecorder {
 public:
  /// `backend_version`: what known issues' version ranges compare with (backend_version());
  /// `keep_going`: false once the campaign must end (a shrink then stops with its best case).
  FindingRecorder(const CampaignOptions& options, CaseRunner& runner, std::string backend_version,
                  std::function<bool()> keep_going);

  /// Marks every finding of `result` (the run of `spec`) that a known issue matches, or that a
  /// confirmation of this campaign put down to a documented cause the case has.
  void mark(harness::CaseResult& result, const harness::CaseSpec& spec) const;

  /// Records failing case `spec` (its 1-based `number`, `seconds` into the campaign) that ran
  /// with `fault` (empty: none) and gave `record.result` (marked): its result may be replaced by
  /// its traced run; `record` gets the clusters it counts in, the clusters it opened and its
  /// example files; `outcome.findings` the clusters it opened. True when the campaign should
  /// stop (CampaignOptions::stop_at_first_finding and a new finding the fault is responsible
  /// for).
  bool record(const harness::CaseSpec& spec, const std::string& fault, int64_t number, double seconds,
              reports::CaseRecord& record, CampaignOutcome& outcome);

 private:
  /// The known issue with case-level conditions (or the documented cause a confirmation
  /// found) that `finding` matched, which its cases cluster apart by; else empty.
  std::string case_level_known(const harness::Finding& finding) const;
  /// Saves `spec` (a case showing `kind`) in `dir`, with the finding it stands for.
  std::string save(const harness::CaseSpec& spec, harness::VerdictKind kind, const std::optional<std::string>& fault,
                   const std::filesystem::path& dir, std::optional<corpus::SavedFinding> finding = std::nullopt) const;
  /// Opens the cluster of `signature` for case `spec` (`result` its run): shrinks and confirms
  /// a new one; returns the finding to report.
  CampaignFinding open_cluster(const harness::CaseSpec& spec, const harness::CaseResult& result,
                               const std::string& signature, const std::string& fault, bool attributable, bool traced,
                               std::string& key);

  const CampaignOptions& options_;
  CaseRunner& runner_;
  const std::string version_;
  std::function<bool()> keep_going_;
  const std::string tool_version_;
  const std::filesystem::path findings_dir_;
  const std::filesystem::path crashing_dir_;
  const std::filesystem::path known_dir_;
  /// Fault-attributable findings and failures that persist without the fault are clustered
  /// separately, so a real bug cannot hide the fault's finding of the same cause.
  const bool attribute_;
  ClusterTable clusters_;
  /// Signature -> the known issue whose documented cause a confirmation found it to follow
  /// from (in cases that have that cause).
  std::map<std::string, std::string> explained_;
};

}  // namespace gradfuzz::campaign
