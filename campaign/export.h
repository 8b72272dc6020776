#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backends/remote_backend.h"
#include "campaign/replay.h"
#include "harness/capabilities.h"
#include "harness/path_run.h"
#include "runner/run_case.h"

namespace gradfuzz::campaign {

/// What `gradfuzz export` writes of a case (docs/BACKENDS.md "export").
enum class ExportForm {
  /// The compact pytest file: only what the case uses, judged by the oracle's own bounds.
  kCompact,
  /// The self-contained form: the whole catalog, reference and oracle in the file.
  kFull,
  /// A test TE's maintainers can paste into tests/pytorch/test_fusible_ops.py: te.ops' public
  /// API, seeded values, the plain float64 reference of the case's ops, TE's tolerance for the
  /// dtype, one assertion on the cluster's tensor for its reason (`--upstream`).
  kUpstream,
};

/// One export: the case, the framework its script is for, its form.
struct ExportJob {
  LoadedCase case_file;
  /// "te" or "torch".
  std::string target;
  ExportForm form = ExportForm::kCompact;
  /// Absolute path of the script ("" when it goes to stdout): values too large to inline go
  /// beside it (compact and full forms), a values file beside an upstream test.
  std::string output;
  /// The paths the script runs, with the fusions the target runs of theirs (compact and full).
  std::vector<harness::PathRequest> paths;
  /// Compact and full forms of a recipe case: the capabilities whose FP8 fields set the bounds
  /// (the target's, where it starts; nullopt: the model's exact FP8).
  std::optional<harness::BackendCapabilities> fp8_target;
  /// Upstream form: the finding the test is for (the case file's `finding` by default, or a
  /// replay's), and the torch backend's planted fault switched on as replay does.
  std::optional<corpus::SavedFinding> finding;
  std::optional<std::string> fault;
};

/// The adapter request that writes `job`'s script for the case prepared as `prepared`.
/// Throws InputError for what the case cannot be exported as: a distributed case in the
/// upstream form or without a values file, a distributed case that must raise, an upstream
/// test without its finding.
backends::ExportRequest export_request(const ExportJob& job, const runner::PreparedCase& prepared);

/// The upstream form's finding of `c` when its file does not record one (a case file of an
/// older gradfuzz, one written by hand): its first new finding (or the one with `signature`)
/// when `runner` replays it traced, as the campaign signs it. Throws InputError when it passes.
corpus::SavedFinding replayed_finding(const LoadedCase& c, CaseRunner& runner, const std::string& fault,
                                      const std::string& signature);

/// The finding a report's cluster stands for (its `signature`, first `details` entry and
/// `confirmation`), as a case file would record it: what `report upstream` writes each test
/// for without replaying the case. Throws InputError for a cluster without details.
corpus::SavedFinding finding_from_report(const nlohmann::json& cluster);

/// The JSON the adapter reads a finding from (`finding` of an upstream export request): the
/// finding's fields (corpus::SavedFinding), its first divergence and diagnosis.
nlohmann::json saved_finding_json(const corpus::SavedFinding& finding);

}  // namespace gradfuzz::campaign
