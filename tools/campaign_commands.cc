#include "tools/campaign_commands.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "campaign/campaign.h"
#include "campaign/environment.h"
#include "campaign/exit_codes.h"
#include "campaign/mps.h"
#include "campaign/replay.h"
#include "campaign/selftest.h"
#include "campaign/worker_pool.h"
#include "reports/console_reporter.h"
#include "reports/json_reporter.h"
#include "tools/cli_flags.h"
#include "tools/report_file.h"
#include "tools/report_tool.h"

namespace gradfuzz::tools::detail {

using campaign::campaign_gen_options;
using campaign::CampaignOptions;
using campaign::CampaignOutcome;
using campaign::CaseRunner;
using campaign::ExitCode;
using campaign::find_leftover_cases;
using campaign::InProcessRunner;
using campaign::InputError;
using campaign::kDefaultCampaignCases;
using campaign::kDefaultSelftestCases;
using campaign::kSelftestCaseTimeoutS;
using campaign::LeftoverCase;
using campaign::load_case_paths;
using campaign::LoadedCase;
using campaign::make_report_context;
using campaign::replay_cases;
using campaign::ReplayOutcome;
using campaign::run_campaign;
using campaign::run_selftest;
using campaign::run_worker;
using campaign::SelftestOptions;
using campaign::WorkerPool;
using campaign::WorkerPoolOptions;

namespace {

/// Set by SIGTERM and SIGINT during a campaign: the run ends cleanly with its partial report.
std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int /*signal*/) { g_stop.store(true); }

/// Installs the stop handlers for the lifetime of a campaign (without SA_RESTART, so a
/// blocking wait returns at once).
class StopSignals {
 public:
  StopSignals() {
    g_stop.store(false);
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGTERM, &action, &previous_term_);
    ::sigaction(SIGINT, &action, &previous_int_);
  }
  ~StopSignals() {
    ::sigaction(SIGTERM, &previous_term_, nullptr);
    ::sigaction(SIGINT, &previous_int_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction previous_term_ {};
  struct sigaction previous_int_ {};
};

/// The runner of a campaign: worker processes, or this process with --workers 0.
std::unique_ptr<CaseRunner> make_runner(const Flags& f, const runner::RunOptions& run_options) {
  const backends::BackendOptions backend = backend_options(f);
  if (f.workers < 0 || f.workers > 1024) {
    throw InputError("--workers: expected 0 (run in this process) to 1024, got " + std::to_string(f.workers));
  }
  try {
    if (f.workers == 0) {
      if (f.mps) throw InputError("--mps: shares a GPU among worker processes (--workers 1 or more)");
      auto runner = std::make_unique<InProcessRunner>(backends::make_backend(backend), run_options);
      runner->capabilities();  // starts a remote backend now: a missing TE is a usage error
      return runner;
    }
    WorkerPoolOptions pool;
    if (f.mps && !f.sanitize.empty()) throw InputError("--mps: compute-sanitizer does not run under MPS; drop one");
    if (!f.sanitize.empty()) pool.sanitizer = sanitizer_options(f);
    pool.mps = f.mps;
    pool.workers = f.workers;
    pool.backend = backend;
    pool.devices = f.devices;
    pool.case_timeout_s = backend.case_timeout_s;
    pool.run_options = run_options;
    return std::make_unique<WorkerPool>(pool);
  } catch (const backends::BackendUnavailable& e) {
    throw InputError(std::string("--backend ") + f.backend + ": " + e.what());
  } catch (const campaign::MpsUnavailable& e) {
    throw InputError(e.what());
  }
}

/// Checks the campaign's dtypes and device against what the backend runs; dtypes the user
/// did not choose are narrowed to those the backend has.
void fit_to_backend(CampaignOptions& o, const harness::BackendCapabilities& caps, bool dtypes_given,
                    bool check_device = true) {
  auto has = [](const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  std::string supported;
  for (const auto& d : caps.dtypes) supported += (supported.empty() ? "" : ", ") + d;
  std::vector<std::string> kept;
  for (const auto& d : o.dtypes) {
    if (has(caps.dtypes, d)) {
      kept.push_back(d);
    } else if (dtypes_given) {
      throw InputError("--dtypes " + d + ": the " + o.backend + " backend runs " + supported);
    }
  }
  if (kept.empty() && !caps.dtypes.empty())
    kept.push_back(has(caps.dtypes, "float32") ? "float32" : caps.dtypes.front());
  o.dtypes = kept;
  if (check_device && !has(caps.devices, o.device)) {
    std::string devices;
    for (const auto& d : caps.devices) devices += (devices.empty() ? "" : ", ") + d;
    throw InputError("--device " + o.device + ": the " + o.backend + " backend runs on " + devices);
  }
}

/// The reporters of one command: JSON to --report (when given), JUnit and HTML from the
/// final JSON document to --junit/--html (when given), and console lines to `out` (unless
/// quiet).
struct Reporters {
  std::unique_ptr<ReportFile> report_file;
  std::ostringstream json_sink;
  std::unique_ptr<reports::JsonReporter> json;
  std::unique_ptr<reports::ConsoleReporter> console;
  std::unique_ptr<reports::MultiReporter> all;
  std::chrono::steady_clock::time_point last_snapshot{};
  CiOutputs ci;

  Reporters(const std::string& report_path, std::ostream& out, bool quiet, const CiOutputs& ci_outputs)
      : ci(ci_outputs) {
    ci.check_writable();
    if (!report_path.empty()) report_file = std::make_unique<ReportFile>(report_path);
    if (report_file || ci.any()) json = std::make_unique<reports::JsonReporter>(json_sink);
    if (!quiet) console = std::make_unique<reports::ConsoleReporter>(out);
    all = std::make_unique<reports::MultiReporter>(std::vector<reports::Reporter*>{json.get(), console.get()});
  }
  reports::Reporter& reporter() { return *all; }
  void context(const reports::ReportContext& c) {
    all->report_context(c);
    snapshot(0, /*force=*/true);
  }
  /// Rewrites the report with the cases so far (at most once a second unless forced).
  void snapshot(double wall_s, bool force = false) {
    if (!report_file) return;
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_snapshot < std::chrono::seconds(1)) return;
    last_snapshot = now;
    reports::RunSummary partial;
    partial.wall_s = wall_s;
    partial.complete = false;
    report_file->write(json->document(partial));
  }
  void finalize(const reports::RunSummary& summary) {
    all->finalize(summary);
    if (report_file) report_file->write(json->document(summary));
    if (json) ci.write(json->document(summary));
  }
};

reports::CampaignInfo campaign_info(const std::string& command, const CampaignOptions& o) {
  reports::CampaignInfo info;
  info.command = command;
  info.seed = o.seed;
  info.cases_requested = o.cases;
  if (!o.cases && !o.time_s) info.cases_requested = kDefaultCampaignCases;
  info.time_budget_s = o.time_s;
  info.dtypes = o.dtypes;
  info.devices = {o.device};
  info.fault = o.fault;
  info.shapes = generators::shape_regime_name(campaign_gen_options(o).shapes);
  if (o.known) info.known_file = o.known->path.string();
  info.feature_weights = campaign::campaign_feature_weights(o, o.backend);
  info.recipe = o.recipe;
  return info;
}

/// The report context of a run on `caps`' backend.
reports::ReportContext backend_context(const reports::CampaignInfo& info, const std::string& device,
                                       const harness::BackendCapabilities& caps) {
  reports::ReportContext context = make_report_context(info, device);
  context.environment.backend = caps.backend;
  context.environment.backend_versions = caps.versions;
  if (caps.backend != "model") {
    context.coverage_names.ops = caps.op_names();
    context.coverage_names.fusions = caps.fusion_names();
    if (!caps.device_name.empty()) context.environment.device_name = caps.device_name;
  }
  return context;
}

std::ostream* progress_stream(std::ostream& err, bool terminal, bool quiet) {
  return terminal && !quiet ? &err : nullptr;
}

/// Exit 1 when a case failed with a finding no known issue covers (with --fail-on-known,
/// when any case failed), else 0.
int exit_for(const Flags& f, int64_t failed, int64_t known_failed) {
  const int64_t counted = f.fail_on_known ? failed : failed - known_failed;
  return static_cast<int>(counted > 0 ? ExitCode::kFindings : ExitCode::kOk);
}

}  // namespace

int cmd_fuzz(const Flags& f, const CLI::App& sub, std::ostream& out, std::ostream& err, bool terminal) {
  CampaignOptions options = campaign_options(f, sub);
  Reporters reporters(f.report, out, f.quiet, f.ci);
  std::unique_ptr<CaseRunner> runner = make_runner(f, options.run_options);
  fit_to_backend(options, runner->capabilities(), sub.count("--dtypes") > 0);
  if (options.world_size && *options.world_size > runner->capabilities().max_world_size) {
    throw InputError("--world-size: the " + f.backend + " backend runs at most " +
                     std::to_string(runner->capabilities().max_world_size) + " rank(s) here, got " +
                     std::to_string(*options.world_size));
  }
  options.fault = check_fault(f.fault, runner->capabilities());
  check_recipe(options.recipe, runner->capabilities());
  // Cases in flight when an earlier run on this corpus ended abruptly run first.
  std::vector<std::string> problems;
  std::vector<LeftoverCase> leftovers = find_leftover_cases(options.corpus_dir, problems);
  for (const auto& problem : problems) err << "gradfuzz: " << problem << "\n";
  if (!leftovers.empty()) {
    err << "gradfuzz: " << leftovers.size() << " case(s) in flight when an earlier run ended abruptly run first\n";
  }
  reports::CampaignInfo info = campaign_info("fuzz", options);
  info.workers = f.workers;
  info.shard = f.shard;
  reporters.context(backend_context(info, options.device, runner->capabilities()));
  std::unique_ptr<std::ofstream> case_log;
  if (!f.case_log.empty()) {
    case_log = std::make_unique<std::ofstream>(f.case_log, std::ios::trunc);
    if (!*case_log) throw InputError("--case-log: cannot write '" + f.case_log + "'");
    options.case_log = case_log.get();
  }
  if (!f.generate_as.empty()) {
    // The same cases as a campaign on that backend: its capabilities drive the generator.
    // A backend name starts it; a file holds what `gradfuzz list capabilities --json` wrote
    // (so the model can run TE's cases where TE is not installed).
    const auto& names = backends::backend_names();
    if (std::find(names.begin(), names.end(), f.generate_as) != names.end()) {
      Flags other = f;
      other.backend = f.generate_as;
      try {
        auto backend = backends::make_backend(backend_options(other));
        options.generate_as = std::make_shared<const harness::BackendCapabilities>(backend->capabilities());
      } catch (const backends::BackendUnavailable& e) {
        throw InputError(std::string("--generate-as ") + f.generate_as + ": " + e.what());
      }
    } else {
      std::ifstream in(f.generate_as);
      if (!in)
        throw InputError("--generate-as: expected model, te, torch or a capabilities file, got '" + f.generate_as +
                         "'");
      try {
        options.generate_as = std::make_shared<const harness::BackendCapabilities>(
            nlohmann::json::parse(in).get<harness::BackendCapabilities>());
      } catch (const std::exception& e) {
        throw InputError("--generate-as " + f.generate_as + ": not a capabilities document: " + e.what());
      }
    }
    // The cases, not the device: the model may run TE's cases on the CPU.
    fit_to_backend(options, *options.generate_as, sub.count("--dtypes") > 0, /*check_device=*/false);
  }
  StopSignals signals;
  options.stop = &g_stop;
  size_t findings_seen = 0;
  options.on_case = [&](double wall_s) {
    const size_t findings = reporters.json ? reporters.json->findings_count() : 0;
    reporters.snapshot(wall_s, findings != findings_seen);
    findings_seen = findings;
  };
  const CampaignOutcome outcome = run_campaign(options, *runner, reporters.reporter(),
                                               progress_stream(err, terminal, f.quiet), std::move(leftovers));
  reports::RunSummary summary{outcome.wall_s, std::nullopt};
  summary.complete = !g_stop.load();
  reporters.finalize(summary);
  if (g_stop.load()) err << "gradfuzz: stopped by a signal after " << outcome.cases_run << " cases\n";
  if (options.known && !f.quiet) {
    err << "gradfuzz: " << outcome.known_failed << " of " << outcome.failed << " failing cases only known issues ("
        << options.known->path.string() << "), " << outcome.new_findings() << " new finding clusters\n";
  }
  return exit_for(f, outcome.failed, outcome.known_failed);
}

int cmd_replay(const Flags& f, const CLI::App& sub, std::ostream& out, std::ostream& err) {
  const std::vector<LoadedCase> cases = load_case_paths(f.paths);
  const auto known = load_known(f);
  Flags flags = f;
  if (!sub.count("--backend")) {
    // The backend the cases were recorded on, when they agree.
    std::set<std::string> recorded;
    for (const auto& c : cases) recorded.insert(c.file.backend);
    if (recorded.size() > 1) {
      throw InputError("replay: the cases were recorded on several backends (" + *recorded.begin() + ", " +
                       *recorded.rbegin() + "); choose one with --backend");
    }
    flags.backend = *recorded.begin();
  }
  Reporters reporters(f.report, out, /*quiet=*/true, f.ci);
  runner::RunOptions run_options;
  run_options.finite_differences = !f.no_finite_differences;
  run_options.shared_runs = !f.no_shared_runs;
  run_options.overlap = resolve_overlap(f);
  std::unique_ptr<CaseRunner> runner = make_runner(flags, run_options);
  const std::optional<std::string> fault = check_fault(f.fault, runner->capabilities());
  reports::CampaignInfo info;
  info.command = "replay";
  info.cases_requested = static_cast<int64_t>(cases.size());
  info.workers = flags.workers;
  std::set<std::string> dtypes;
  std::set<std::string> devices;
  for (const auto& c : cases) {
    dtypes.insert(c.file.spec.dtype);
    devices.insert(c.file.spec.device);
  }
  info.dtypes.assign(dtypes.begin(), dtypes.end());
  info.devices.assign(devices.begin(), devices.end());
  info.fault = fault;
  if (known) info.known_file = known->path.string();
  reporters.context(backend_context(info, devices.count("cuda") ? "cuda" : "cpu", runner->capabilities()));
  const auto start = std::chrono::steady_clock::now();
  const ReplayOutcome outcome =
      replay_cases(cases, fault, *runner, &reporters.reporter(), &out, known.get(), f.confirm);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  reporters.finalize(reports::RunSummary{wall_s, std::nullopt});
  out << "replay: " << outcome.cases_run << " cases, " << outcome.failed << " failed";
  if (known) out << " (" << outcome.known_failed << " with known findings only)";
  out << "\n";
  (void)err;
  return exit_for(f, outcome.failed, outcome.known_failed);
}

int cmd_selftest(const Flags& f, const CLI::App& sub, std::ostream& out, std::ostream& err, bool terminal) {
  SelftestOptions options;
  options.campaign = campaign_options(f, sub);
  if (!options.campaign.cases) options.campaign.cases = kDefaultSelftestCases;
  if (!f.corpus.empty()) options.corpus_dir = f.corpus;
  Reporters reporters(f.report, out, /*quiet=*/false, f.ci);
  reports::CampaignInfo info = campaign_info("selftest", options.campaign);
  info.fault.reset();
  // The hang fault is found by its time-out: selftest cases are tiny, so a short limit
  // keeps that fault's run (its case and the shrink's) at seconds rather than minutes.
  Flags flags = f;
  if (!sub.count("--case-timeout")) flags.case_timeout_s = kSelftestCaseTimeoutS;
  std::unique_ptr<CaseRunner> runner = make_runner(flags, options.campaign.run_options);
  fit_to_backend(options.campaign, runner->capabilities(), sub.count("--dtypes") > 0);
  std::vector<std::string> too_many_ranks;
  options.faults =
      parse_fault_list(f.faults, runner->capabilities(), !f.sanitize.empty(), f.workers > 0, &too_many_ranks);
  for (const auto& why : too_many_ranks) err << "gradfuzz: selftest: not run: " << why << "\n";
  // Faults of the ranks' communication run distributed cases: the workers start their rank
  // processes with their adapters, so that the first such case does not pay for them.
  int64_t ranks = 0;
  for (const auto& name : options.faults) {
    if (const auto* planted = runner->capabilities().fault(name)) ranks = std::max(ranks, planted->world_size);
  }
  if (ranks > 1 && f.workers > 0 && flags.world_size != ranks) {
    flags.world_size = ranks;
    runner.reset();
    runner = make_runner(flags, options.campaign.run_options);
  }
  check_recipe(options.campaign.recipe, runner->capabilities());
  info.dtypes = options.campaign.dtypes;
  info.workers = f.workers;
  reporters.context(backend_context(info, options.campaign.device, runner->capabilities()));
  const auto start = std::chrono::steady_clock::now();
  std::vector<reports::SelftestEntry> entries =
      run_selftest(options, *runner, reporters.reporter(), progress_stream(err, terminal, false));
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bool all_ok = true;
  for (const auto& e : entries) all_ok = all_ok && e.ok();
  reporters.finalize(reports::RunSummary{wall_s, std::move(entries)});
  return static_cast<int>(all_ok ? ExitCode::kOk : ExitCode::kFindings);
}

int cmd_worker(const Flags& f) {
  backends::BackendOptions backend = backend_options(f);
  runner::RunOptions run_options;
  run_options.finite_differences = !f.no_finite_differences;
  run_options.shared_runs = !f.no_shared_runs;
  run_options.overlap = resolve_overlap(f);
  return run_worker(backend, run_options);
}

}  // namespace gradfuzz::tools::detail
