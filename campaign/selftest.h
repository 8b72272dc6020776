#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "campaign/campaign.h"
#include "ops/faults.h"
#include "reports/reporter.h"

namespace gradfuzz::campaign {

/// Cases per fault when --cases is not given.
inline constexpr int64_t kDefaultSelftestCases = 2000;
/// Per-case time limit of selftest runs unless --case-timeout says otherwise.
inline constexpr double kSelftestCaseTimeoutS = 10;
/// Default corpus of `gradfuzz selftest` (one sub-directory per fault).
inline constexpr const char* kDefaultSelftestDir = "gradfuzz-out/selftest";

/// `gradfuzz selftest`: the default campaign once per fault.
struct SelftestOptions {
  /// Fault names: the model's (ops/faults.h) or the backend's planted ones.
  std::vector<std::string> faults;
  /// Campaign settings shared by every fault (cases, seed, device, dtypes, max_ops). The
  /// fault, corpus and stop-at-first-finding fields are set per fault.
  CampaignOptions campaign;
  std::filesystem::path corpus_dir = kDefaultSelftestDir;
};

/// For each fault: runs the default campaign (same generator, no tuning toward the fault;
/// a half-precision fault in half dtypes, see selftest_campaign)
/// with the fault on until the first finding the fault is responsible for (one that passes
/// with the fault off; see CampaignOptions::require_fault_attributable) or the case budget,
/// shrinks and saves that finding under <corpus>/<fault-name>/findings, then replays the
/// saved file with the fault (must fail: exit 1) and without (must pass: exit 0). Failures
/// that persist without the fault are real runtime bugs: they are saved and reported as
/// findings and counted in SelftestEntry::unattributed_findings. Campaign cases go to `reporter`;
/// `progress` as in run_campaign. Throws InternalError on internal assertions.
/// Cases run on `runner` (worker processes, so that the crash, abort and hang faults are
/// findings and not the end of the selftest).
std::vector<reports::SelftestEntry> run_selftest(const SelftestOptions& options, CaseRunner& runner,
                                                 reports::Reporter& reporter, std::ostream* progress);
/// The same in this process on the model backend (faults that kill a process must not be
/// among options.faults).
std::vector<reports::SelftestEntry> run_selftest(const SelftestOptions& options, reports::Reporter& reporter,
                                                 std::ostream* progress);

/// Exit status replay would give for `case_file` with `fault` on or off, run on `runner`,
/// with `known` loaded when given (then only new findings fail): 0 pass, 1 failure, 2
/// unusable file, 3 internal error.
int replay_exit_status(const std::filesystem::path& case_file, const std::optional<std::string>& fault,
                       CaseRunner& runner, const KnownIssues* known = nullptr);

/// The campaign a fault's selftest runs: `base` with the fault on, and where the fault needs
/// them (ops::fault_is_half_precision, ops::fault_shapes) the half dtypes of `base` (else
/// bfloat16 and float16) and the edge shapes within a 2^14-element tensor budget.
CampaignOptions selftest_campaign(const CampaignOptions& base, const std::string& fault);

}  // namespace gradfuzz::campaign
