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
  /// Stop after the first finding (selftest); with require_fault_attributable, after the
  /// first finding the fault is responsible for.
  bool stop_at_first_finding = false;
  /// With a fault on: a failing case counts as the fault's finding only when it passes with
  /// the fault switched off (one extra run), and its shrink keeps that property. Failures
  /// that persist without the fault are real runtime bugs: still shrunk, saved and reported,
  /// deduplicated separately, but never taken as the fault's detection (selftest).
  bool require_fault_attributable = false;
  /// Shrink each new finding before saving it.
  bool shrink = true;
  /// Predicate-call cap of each shrink.
  int64_t max_shrink_calls = 2000;
  harness::RunOptions run_options;
};

/// One new finding of a campaign, shrunk and saved.
struct CampaignFinding {
  reports::Finding finding;
  /// Catalog op count of the shrunk case.
  int64_t shrunk_ops = 0;
  /// 1-based index of the case that found it, and seconds from the campaign start to the end
  /// of that case (shrinking not included).
  int64_t case_number = 0;
  double seconds = 0;
  /// The case passes with the campaign's fault off (always true without a fault or without
  /// require_fault_attributable).
  bool fault_attributable = true;
};

/// What a campaign did.
struct CampaignOutcome {
  int64_t cases_run = 0;
  int64_t passed = 0;
  int64_t failed = 0;
  /// New findings (deduplicated by CaseResult::signature()), in the order found.
  std::vector<CampaignFinding> findings;
  double wall_s = 0;
  /// The first finding with fault_attributable set, if any.
  const CampaignFinding* first_attributable() const;
};

/// The case file (verdict pass, provenance of this build) of `spec`, as written to the
/// in-flight file before the case runs.
std::string inflight_case_text(const harness::CaseSpec& spec, uint64_t campaign_seed,
                               const std::optional<std::string>& fault);

/// Moves case files left in <corpus>/inflight by runs that a case killed into
/// <corpus>/crashing/<content hash>.json with verdict crash, and returns their new paths.
/// A leftover that cannot be read is left in place and reported in `problems`.
std::vector<std::filesystem::path> recover_crashed_cases(const std::filesystem::path& corpus_dir,
                                                         std::vector<std::string>& problems);

/// Seed of case `index` of a campaign: a SplitMix64 mix of (campaign_seed, index), so every
/// case of a run can be regenerated alone and `--seed` reproduces the whole run.
uint64_t case_seed(uint64_t campaign_seed, int64_t index);

/// Generator size of case `index`: grows linearly from 10 to 100 over the first 90 cases,
/// then stays at 100 (case_gen.h: the op budget scales with min(size, 100)).
int case_size(int64_t index);

/// Generator options of a campaign (max_ops, dtypes, device; every catalog fusion).
generators::GenOptions campaign_gen_options(const CampaignOptions& options);

/// One case in this many is an invalid configuration (generators/invalid_gen.h).
inline constexpr int64_t kInvalidCaseEvery = 10;

/// The spec of case `index`, exactly as run_campaign generates it.
harness::CaseSpec campaign_case(const CampaignOptions& options, int64_t index);

/// Runs a seeded, budgeted campaign. Each case is written to the process's in-flight file in
/// <corpus>/inflight before it runs (InflightFile), so a crash leaves its repro; a failing case whose signature
/// is new is shrunk (predicate: still fails with the same verdict kind, same fault on) and
/// saved to <corpus>/findings with its verdict and fault. Every case goes to `reporter`
/// (report_case only: the caller reports the context and finalizes). `progress`, when not
/// null, receives a carriage-return progress line (cases, findings, cases/s) a few times a
/// second. Throws InternalError (the inflight file kept) when run_case raises an internal
/// assertion, and InputError or corpus::CorpusError when the corpus cannot be written.
CampaignOutcome run_campaign(const CampaignOptions& options, reports::Reporter& reporter, std::ostream* progress);

/// Shrinks a failing `spec` (verdict `kind` under the current fault switchboard) to a
/// locally minimal case with the same verdict kind and, when `passes_without` is given,
/// that still passes with that fault switched off. Predicate calls that raise count as
/// "does not fail the same way".
harness::CaseSpec shrink_failure(const harness::CaseSpec& spec, harness::VerdictKind kind,
                                 const std::optional<ops::Fault>& passes_without,
                                 const harness::RunOptions& run_options, int64_t max_calls);

/// Whether `spec` passes with `fault` switched off (other faults as they are). Raising
/// counts as not passing.
bool passes_without_fault(const harness::CaseSpec& spec, ops::Fault fault, const harness::RunOptions& run_options);

}  // namespace gradfuzz::tools
