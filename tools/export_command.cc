#include "tools/export_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>
#include <vector>

#include "backends/backend.h"
#include "backends/remote_backend.h"
#include "campaign/case_runner.h"
#include "campaign/exit_codes.h"
#include "campaign/export.h"
#include "campaign/replay.h"
#include "corpus/case_file.h"
#include "harness/capabilities.h"
#include "harness/path_run.h"
#include "runner/reference_set.h"
#include "runner/run_options.h"
#include "tools/cli_flags.h"
#include "tools/report_file.h"

namespace gradfuzz::tools::detail {

using campaign::ExitCode;
using campaign::InProcessRunner;
using campaign::InputError;
using campaign::load_case_paths;
using campaign::LoadedCase;

namespace {

/// The export's paths with the fusions the target runs of theirs, for their quantization
/// points (runner::judging_expectation): te runs every fusion a case names (the model's fuser
/// models te.ops'); torch only those of its capabilities (adapter torch_backend/runtime.py: FUSIONS).
std::vector<harness::PathRequest> target_paths(std::vector<harness::PathRequest> paths, const std::string& target,
                                               backends::RemoteBackend& torch) {
  if (target != "torch") return paths;
  std::set<std::string> runs;
  try {
    for (const auto& fusion : torch.capabilities().fusions) runs.insert(fusion.name);
  } catch (const backends::BackendUnavailable& e) {
    throw InputError(std::string("export: ") + e.what());
  }
  for (auto& path : paths) {
    path.fusions.erase(std::remove_if(path.fusions.begin(), path.fusions.end(),
                                      [&](const std::string& name) { return !runs.count(name); }),
                       path.fusions.end());
  }
  return paths;
}

/// The capabilities whose FP8 fields set a recipe case's exported bounds (replay on the
/// target judges with the target's): --capabilities FILE; else the target's own when it
/// starts here (torch: the adapter already running; te: where TE imports); else none of
/// its FP8 is taken as the reference's (the coarse allowance, one FP8 step on any quantized
/// element), said on `err`: a te script written away from TE must not fail on TE's GEMM
/// accumulation.
std::optional<harness::BackendCapabilities> export_fp8_target(const Flags& f, const std::string& target,
                                                              backends::RemoteBackend& torch, std::ostream& err) {
  if (!f.export_capabilities.empty()) {
    std::ifstream in(f.export_capabilities);
    if (!in) throw InputError("--capabilities: cannot read '" + f.export_capabilities + "'");
    try {
      return nlohmann::json::parse(in).get<harness::BackendCapabilities>();
    } catch (const std::exception& e) {
      throw InputError("--capabilities " + f.export_capabilities + ": not a capabilities document: " + e.what());
    }
  }
  if (target == "torch") return torch.capabilities();
  Flags te = f;
  te.backend = "te";
  try {
    auto backend = backends::make_backend(backend_options(te));
    return backend->capabilities();
  } catch (const backends::BackendUnavailable& e) {
    const std::string why = e.what();
    err << "export: TE does not start here (" << why.substr(0, why.find('\n'))
        << "): the script holds the FP8 paths to the coarse FP8 allowance; export where TE runs, or pass "
           "--capabilities FILE, for replay's tight rule\n";
    harness::BackendCapabilities coarse;
    coarse.fp8_reference_exact = false;
    return coarse;
  }
}

/// One export (campaign/export.h) of the case at `path` for `target` in `form`, its script to
/// `output` ("" or "-": returned only): the adapter's reply, with the job it wrote.
struct ExportDone {
  campaign::ExportJob job;
  backends::ExportRequest request;
  backends::ExportReply reply;
};
ExportDone export_case(const Flags& f, const std::string& path, const std::string& target, campaign::ExportForm form,
                       const std::string& output, std::ostream& err,
                       const std::optional<corpus::SavedFinding>& finding = std::nullopt) {
  const std::vector<LoadedCase> cases = load_case_paths({path}, /*runs=*/false);
  ExportDone done;
  campaign::ExportJob& job = done.job;
  job.case_file = cases.front();
  job.target = target;
  job.form = form;
  const LoadedCase& c = job.case_file;
  if (!output.empty() && output != "-") job.output = std::filesystem::absolute(output).string();
  const harness::CaseSpec& spec = c.file.spec;
  runner::PreparedCase prepared;
  try {
    prepared = runner::prepare_case(spec);
  } catch (const std::exception& e) {
    throw InputError(c.path.string() + ": the case cannot be built: " + e.what());
  }
  // Generating a script is plain code generation: the torch adapter does it for both
  // targets, so a te script can be written where TE does not import.
  Flags adapter = f;
  adapter.backend = "torch";
  backends::RemoteBackend backend(backend_options(adapter));
  std::vector<harness::PathRequest> paths{{"fused", spec.fusions, false}, {"unfused", {}, false}};
  if (form == campaign::ExportForm::kUpstream) {
    job.fault = f.fault.empty() ? c.file.verdict.fault : std::optional<std::string>(f.fault);
    if (finding) {
      job.finding = finding;
    } else if (c.file.finding && (f.signature.empty() || f.signature == c.file.finding->finding.signature)) {
      job.finding = c.file.finding;
    } else {
      // No record of the cluster (an older case file) or another finding asked for: the
      // target's replay says what it is, where the target runs.
      Flags replay_flags = f;
      replay_flags.backend = target;
      InProcessRunner replay(backends::make_backend(backend_options(replay_flags)), runner::RunOptions{});
      job.finding = campaign::replayed_finding(c, replay, job.fault.value_or(""), f.signature);
    }
  } else if (spec.recipe) {
    // The oracle's bounds hold the paths to the target's FP8 (its GEMMs' accumulation).
    job.paths = target_paths(paths, target, backend);
    job.fp8_target = export_fp8_target(f, target, backend, err);
  } else {
    job.paths = paths;
  }
  done.request = campaign::export_request(job, prepared);
  try {
    done.reply = backend.export_script(spec, prepared.plan, prepared.tensors, paths, done.request);
  } catch (const backends::BackendUnavailable& e) {
    throw InputError(std::string("export: ") + e.what());
  } catch (const backends::RequestRefused& e) {
    throw InputError(std::string("export: ") + e.what());
  }
  if (!job.output.empty()) ReportFile(output).write_raw(done.reply.script);
  return done;
}

}  // namespace

int cmd_export(const Flags& f, const CLI::App& sub, std::ostream& out, std::ostream& err) {
  if (!f.python_format && !f.upstream_export) {
    throw InputError("export: choose a format: --python (a pytest file) or --upstream (a test in TE's style)");
  }
  if (f.upstream_export && f.full_export) throw InputError("export: --upstream and --full are two forms; give one");
  const std::vector<LoadedCase> cases = load_case_paths({f.paths.at(0)}, /*runs=*/false);
  const LoadedCase& c = cases.front();
  const std::string target = sub.count("--backend") ? f.backend : (c.file.backend == "model" ? "te" : c.file.backend);
  if (target != "te" && target != "torch") {
    throw InputError("--backend: export writes te or torch scripts, got '" + target + "'");
  }
  const campaign::ExportForm form = f.upstream_export ? campaign::ExportForm::kUpstream
                                    : f.full_export   ? campaign::ExportForm::kFull
                                                      : campaign::ExportForm::kCompact;
  const ExportDone done = export_case(f, f.paths.at(0), target, form, f.output, err);
  if (done.job.output.empty()) {
    out << done.reply.script;
  } else {
    const std::string expects =
        form == campaign::ExportForm::kUpstream
            ? "fails on " + (done.reply.asserted.empty() ? done.job.finding->finding.tensor : done.reply.asserted) +
                  " for " + done.job.finding->finding.signature
        : done.request.expect.value("kind", "") == "error"
            ? "expects " + done.request.expect.at("error_kind").get<std::string>()
            : std::string("expects a pass");
    out << "wrote " << f.output << " (" << target << ", " << expects
        << (done.reply.data_file.empty() ? "" : ", values in " + done.reply.data_file) << ")\n";
  }
  for (const auto& note : done.reply.notes) err << "export: note: " << note << '\n';
  return static_cast<int>(ExitCode::kOk);
}

UpstreamTest export_upstream_test(const Flags& f, const nlohmann::ordered_json& cluster, const std::string& target,
                                  const std::string& test_path, std::ostream& notes) {
  // The report's record of the cluster is the finding: no replay on the target needed.
  const corpus::SavedFinding finding = campaign::finding_from_report(nlohmann::json::parse(cluster.dump()));
  const ExportDone done = export_case(f, cluster.at("case_file").get<std::string>(), target,
                                      campaign::ExportForm::kUpstream, test_path, notes, finding);
  return UpstreamTest{done.reply.script, done.reply.notes, done.reply.source};
}

}  // namespace gradfuzz::tools::detail
