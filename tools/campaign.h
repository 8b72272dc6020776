#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "generators/case_gen.h"
#include "harness/runner.h"
#include "ops/faults.h"
#include "reports/reporter.h"

namespace gradfuzz::tools {

/// Cases run when neither a count nor a time budget is given.
inline constexpr int64_t kDefaultCampaignCases = 100;
/// Default corpus of `gradfuzz fuzz`: visible to the user, never the checked-in corpus.
inline constexpr const char* kDefaultCorpusDir = "gradfuzz-out/corpus";
/// Sub-directories of a campaign corpus.
inline constexpr const char* kInflightDir = "inflight";
inline constexpr const char* kFindingsDir = "findings";

/// One campaign (`gradfuzz fuzz`, and each fault of `gradfuzz selftest`).
struct CampaignOptions {
  /// Budget by count; when both are empty kDefaultCampaignCases. When both are set, the
  /// campaign stops at whichever comes first.
  std::optional<int64_t> cases;
  std::optional<double> time_s;
  uint64_t seed = 0;
  /// Resolved device ("cpu" or "cuda").
  std::string device = "cpu";
  std::vector<std::string> dtypes{"float64", "float32"};
  int max_ops = 8;
  /// Fault switched on for every case and for shrinking.
  std::optional<ops::Fault> fault;
  std::filesystem::path corpus_dir = kDefaultCorpusDir;
  /// Stop after the first finding (selftest).
  bool stop_at_first_finding = false;
  /// Shrink each new finding before saving it.
  bool shrink = true;
  /// Predicate-call cap of each shrink.
  int64_t max_shrink_calls = 2000;
  harness::RunOptions run_options;
};

/// What a campaign did.
struct CampaignOutcome {
  int64_t cases_run = 0;
  int64_t passed = 0;
  int64_t failed = 0;
  /// New findings (deduplicated by CaseResult::signature()), shrunk and saved.
  std::vector<reports::Finding> findings;
  /// Catalog op count of each finding's shrunk case (parallel to findings).
  std::vector<int64_t> finding_ops;
  double wall_s = 0;
  /// 1-based index of the first failing case and seconds from the campaign start to the end
  /// of that case (shrinking not included).
  std::optional<int64_t> first_failure_case;
  std::optional<double> first_failure_s;
};

/// Seed of case `index` of a campaign: a SplitMix64 mix of (campaign_seed, index), so every
/// case of a run can be regenerated alone and `--seed` reproduces the whole run.
uint64_t case_seed(uint64_t campaign_seed, int64_t index);

/// Generator size of case `index`: grows linearly from 10 to 100 over the first 90 cases,
/// then stays at 100 (case_gen.h: the op budget scales with min(size, 100)).
int case_size(int64_t index);

/// Generator options of a campaign (max_ops, dtypes, device; every catalog fusion).
generators::GenOptions campaign_gen_options(const CampaignOptions& options);

/// The spec of case `index`, exactly as run_campaign generates it.
harness::CaseSpec campaign_case(const CampaignOptions& options, int64_t index);

/// Runs a seeded, budgeted campaign. Each case is written to <corpus>/inflight before it runs
/// and removed after it finishes, so a crash leaves its repro; a failing case whose signature
/// is new is shrunk (predicate: still fails with the same verdict kind, same fault on) and
/// saved to <corpus>/findings with its verdict and fault. Every case goes to `reporter`
/// (report_case only: the caller reports the context and finalizes). `progress`, when not
/// null, receives a carriage-return progress line (cases, findings, cases/s) a few times a
/// second. Throws InternalError (the inflight file kept) when run_case raises an internal
/// assertion, and corpus::CorpusError when the corpus cannot be written.
CampaignOutcome run_campaign(const CampaignOptions& options, reports::Reporter& reporter, std::ostream* progress);

/// Shrinks a failing `spec` (verdict `kind` under the current fault switchboard) to a
/// locally minimal case with the same verdict kind. Predicate calls that raise count as
/// "does not fail the same way".
harness::CaseSpec shrink_failure(const harness::CaseSpec& spec, harness::VerdictKind kind,
                                 const harness::RunOptions& run_options, int64_t max_calls);

}  // namespace gradfuzz::tools
