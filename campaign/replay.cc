#include "campaign/replay.h"

#include <algorithm>
#include <memory>
#include <ostream>

#include "campaign/campaign.h"
#include "campaign/confirmation.h"
#include "campaign/environment.h"
#include "campaign/exit_codes.h"
#include "campaign/finding_recorder.h"

namespace gradfuzz::campaign {

std::vector<LoadedCase> load_case_paths(const std::vector<std::string>& paths, bool runs) {
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
  if (loaded.empty()) {
    std::string joined;
    for (const auto& p : paths) joined += (joined.empty() ? "" : ", ") + p;
    throw InputError("replay: no case files (*.json) under " + joined);
  }
  for (const auto& c : loaded) {
    if (runs && c.file.spec.device == "cuda" && !cuda_available()) {
      throw InputError(c.path.string() + ": /spec/device: the case needs cuda, but this process has no CUDA device");
    }
  }
  return loaded;
}

ReplayOutcome replay_cases(const std::vector<LoadedCase>& cases, const std::optional<std::string>& fault,
                           const runner::RunOptions& run_options, reports::Reporter* reporter, std::ostream* out,
                           const KnownIssues* known) {
  InProcessRunner runner(backends::make_backend({}), run_options);
  return replay_cases(cases, fault, runner, reporter, out, known);
}

ReplayOutcome replay_cases(const std::vector<LoadedCase>& cases, const std::optional<std::string>& fault,
                           CaseRunner& runner, reports::Reporter* reporter, std::ostream* out, const KnownIssues* known,
                           bool confirm) {
  const std::optional<std::string>& fault_text = fault;
  const harness::BackendCapabilities& caps = runner.capabilities();
  const std::string version = backend_version(caps);
  const auto known_fusions = caps.fusion_names();

  ReplayOutcome outcome;
  for (const auto& c : cases) {
    harness::CaseSpec spec = c.file.spec;
    std::vector<std::string> kept;
    for (size_t k = 0; k < spec.fusions.size(); ++k) {
      if (std::find(known_fusions.begin(), known_fusions.end(), spec.fusions[k]) != known_fusions.end()) {
        kept.push_back(spec.fusions[k]);
      } else if (c.file.backend == caps.backend) {
        throw InputError(c.path.string() + ": /spec/fusions/" + std::to_string(k) + ": the " + caps.backend +
                         " backend has no fusion '" + spec.fusions[k] + "'");
      } else if (out) {
        *out << "note: " << c.path.string() << " was recorded on " << c.file.backend << "; the " << caps.backend
             << " backend has no fusion '" << spec.fusions[k] << "', left out\n";
      }
    }
    spec.fusions = std::move(kept);
    reports::CaseRecord record;
    try {
      record.result = runner.run_now(spec, fault_text.value_or(""));
    } catch (const std::exception& e) {
      throw InternalError(c.path.string() + ": running the case raised: " + e.what(), c.path.string());
    }
    if (known) known->mark(record.result, spec, version);
    if (wants_trace(record.result)) {
      // As the campaign that saved it: a new value finding signed by where values first diverge.
      harness::CaseResult traced = runner.run_traced(spec, fault_text.value_or(""));
      if (known) known->mark(traced, spec, version);
      if (traced.failed()) record.result = std::move(traced);
    }
    record.recipe = spec.recipe ? spec.recipe->name : reports::kNoRecipe;
    record.usage = spec.usage_coverage();
    record.calls = 1 + static_cast<int64_t>(spec.repeat_calls.size());
    ++outcome.cases_run;
    if (record.result.failed()) {
      ++outcome.failed;
      if (!record.result.has_new_findings()) ++outcome.known_failed;
      for (const auto& signature : record.result.signatures()) {
        const harness::Finding& first = *record.result.finding(signature);
        reports::Finding finding;
        finding.result = record.result;
        finding.signature = signature;
        finding.case_file = c.path.string();
        finding.reproduce = reports::reproduce_line(finding.case_file, fault_text);
        if (caps.backend != "model") finding.reproduce += " --backend " + caps.backend;
        finding.fault = fault_text;
        finding.dtype = spec.dtype;
        finding.recipe = spec.recipe;
        if (first.is_known() && known) {
          if (const KnownIssue* e = known->entry(first.known)) {
            finding.known = reports::KnownRef{e->id, e->status, e->link, e->note};
          }
        }
        if (confirm && !first.is_known()) {
          ConfirmationContext context;
          context.fault = fault_text.value_or("");
          context.known = known;
          context.backend = caps.backend;
          context.version = version;
          finding.confirmation = confirm_cluster(runner, spec, record.result, signature, context);
        }
        if (out) {
          *out << (first.is_known() ? "KNOWN " : "FAIL ") << harness::verdict_name(first.kind) << ' '
               << finding.case_file << " [" << signature << "]"
               << (first.is_known() ? " (" + first.known + ")" : std::string()) << ": " << finding.reproduce << '\n';
          if (finding.confirmation) *out << "  diagnosis: " << finding.confirmation->diagnosis << '\n';
          if (const harness::Divergence* d = record.result.divergence_of(first.path_pair)) {
            *out << "  first diverges: " << d->pass << " op " << d->op_index << " (" << d->op << ") " << d->role
                 << (d->impl_class.empty() ? std::string() : ", computed by " + d->impl_class + "." + d->method)
                 << '\n';
          }
        }
        outcome.failures.push_back(finding);
        // Each replayed file is its own finding, without a cluster count.
        record.new_findings.push_back(std::move(finding));
      }
    }
    if (reporter) reporter->report_case(record);
  }
  return outcome;
}

}  // namespace gradfuzz::campaign
