#pragma once

#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "campaign/case_runner.h"
#include "campaign/known_issues.h"
#include "corpus/case_file.h"
#include "ops/faults.h"
#include "reports/reporter.h"
#include "runner/run_case.h"

namespace gradfuzz::campaign {

/// One loaded case file.
struct LoadedCase {
  std::filesystem::path path;
  corpus::CaseFile file;
};

/// Expands files and directories (corpus::list_case_files) and loads every case file before
/// anything runs. Throws InputError naming the file and the JSON path of the first problem
/// (syntax error, wrong schema version, unknown op, missing producer...), for a path that
/// does not exist, and, where `runs` (the cases are to run here), for a CUDA case when this
/// process has no CUDA device (an export writes a CUDA case's script anywhere).
std::vector<LoadedCase> load_case_paths(const std::vector<std::string>& paths, bool runs = true);

/// What a replay did.
struct ReplayOutcome {
  int64_t cases_run = 0;
  int64_t failed = 0;
  /// Failed cases whose every finding matched a known issue (counted in `failed` too).
  int64_t known_failed = 0;
  /// One per distinct finding signature of each failing case (case_file = the replayed path;
  /// reproduce names --fault when on).
  std::vector<reports::Finding> failures;
  /// Failed cases with a finding no known issue matches.
  int64_t new_failed() const { return failed - known_failed; }
};

/// Runs each case's spec on `runner` with `fault` on (when given: a model fault or one of the
/// backend's). A case fails when its verdict is neither pass nor unsupported; with `known`,
/// its findings are matched (a case whose findings are all known counts as known_failed). The
/// recorded verdict does not change that (a
/// finding file replayed without its fault passes once the runtime is right). Fusions the
/// runner's backend lacks: an error naming the file and the JSON path when the case was
/// recorded on that backend, dropped with a note on `out` when it was recorded on another.
/// For each failing case one line "FAIL <kind> <file> [<signature>]: <reproduce line>" goes
/// to `out` (when not null). Every case goes to `reporter` (when not null) with a Finding
/// for failures. With `confirm`, each new finding of a failing case is confirmed as a
/// campaign confirms a new cluster (confirmation.h: its variants and diagnosis, in the report
/// and on `out`), so that `report upstream` can write its folder. Throws InternalError when a
/// case trips an internal assertion.
ReplayOutcome replay_cases(const std::vector<LoadedCase>& cases, const std::optional<std::string>& fault,
                           CaseRunner& runner, reports::Reporter* reporter, std::ostream* out,
                           const KnownIssues* known = nullptr, bool confirm = false);
/// The same in this process on the model backend.
ReplayOutcome replay_cases(const std::vector<LoadedCase>& cases, const std::optional<std::string>& fault,
                           const runner::RunOptions& run_options, reports::Reporter* reporter, std::ostream* out,
                           const KnownIssues* known = nullptr);

}  // namespace gradfuzz::campaign
