#include "tools/replay.h"

#include <memory>
#include <ostream>

#include "tools/environment.h"
#include "tools/exit_codes.h"

namespace gradfuzz::tools {

std::vector<LoadedCase> load_case_paths(const std::vector<std::string>& paths) {
  if (paths.empty()) throw InputError("replay: expected at least one case file or directory");
  std::vector<std::filesystem::path> fs_paths(paths.begin(), paths.end());
  std::vector<LoadedCase> loaded;
  try {
    for (const auto& path : corpus::list_case_files(fs_paths)) {
      loaded.push_back(LoadedCase{path, corpus::load_case_file(path)});
    }
  } catch (const corpus::CorpusError& e) {
    throw InputError(e.what());
  }
  for (const auto& c : loaded) {
    if (c.file.spec.device == "cuda" && !cuda_available()) {
      throw InputError(c.path.string() + ": /spec/device: the case needs cuda, but this process has no CUDA device");
    }
  }
  return loaded;
}

ReplayOutcome replay_cases(const std::vector<LoadedCase>& cases, const std::optional<ops::Fault>& fault,
                           const harness::RunOptions& run_options, reports::Reporter* reporter, std::ostream* out) {
  std::unique_ptr<ops::FaultScope> fault_scope;
  if (fault) fault_scope = std::make_unique<ops::FaultScope>(*fault);
  const std::optional<std::string> fault_text =
      fault ? std::optional<std::string>(ops::fault_name(*fault)) : std::nullopt;

  ReplayOutcome outcome;
  for (const auto& c : cases) {
    reports::CaseRecord record;
    try {
      record.result = harness::run_case(c.file.spec, run_options);
    } catch (const std::exception& e) {
      throw InternalError(c.path.string() + ": run_case raised: " + e.what(), c.path.string());
    }
    ++outcome.cases_run;
    if (!record.result.passed()) {
      ++outcome.failed;
      reports::Finding finding;
      finding.result = record.result;
      finding.case_file = c.path.string();
      finding.reproduce = reports::reproduce_line(finding.case_file, fault_text);
      if (out) {
        *out << "FAIL " << harness::verdict_name(record.result.verdict) << ' ' << finding.case_file << " ["
             << record.result.signature() << "]: " << finding.reproduce << '\n';
      }
      outcome.failures.push_back(finding);
      record.finding = std::move(finding);
    }
    if (reporter) reporter->report_case(record);
  }
  return outcome;
}

}  // namespace gradfuzz::tools
