#include "tools/cli.h"

#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>

#include "corpus/case_file.h"
#include "harness/case_spec.h"
#include "ops/errors.h"
#include "ops/faults.h"
#include "ops/fusion_registry.h"
#include "ops/op_registry.h"
#include "reports/console_reporter.h"
#include "reports/json_reporter.h"
#include "tools/bench.h"
#include "tools/campaign.h"
#include "tools/environment.h"
#include "tools/exit_codes.h"
#include "tools/replay.h"
#include "tools/selftest.h"

namespace gradfuzz::tools {

namespace {

/// Raw flag values shared by the subcommands (each uses the ones it registers).
struct Flags {
  int64_t cases = 0;
  double time_s = 0;
  uint64_t seed = 0;
  std::string device = "cpu";
  std::vector<std::string> dtypes{"float64", "float32"};
  int max_ops = 8;
  std::string fault;
  std::string faults = "all";
  std::string corpus;
  std::string report;
  bool quiet = false;
  std::vector<std::string> paths;
  std::string what;
  bool json = false;
};

std::optional<ops::Fault> parse_fault(const std::string& name) {
  if (name.empty()) return std::nullopt;
  try {
    return ops::fault_from_name(name);
  } catch (const Error& e) {
    throw InputError(std::string("--fault: ") + e.what());
  }
}

std::vector<ops::Fault> parse_fault_list(const std::string& list) {
  if (list == "all") return ops::all_faults();
  std::vector<ops::Fault> faults;
  std::stringstream in(list);
  std::string name;
  while (std::getline(in, name, ',')) {
    if (name.empty()) continue;
    try {
      faults.push_back(ops::fault_from_name(name));
    } catch (const Error& e) {
      throw InputError(std::string("--faults: ") + e.what());
    }
  }
  if (faults.empty())
    throw InputError("--faults: expected a comma-separated list of fault names or 'all', got '" + list + "'");
  return faults;
}

void check_dtypes(const std::vector<std::string>& dtypes) {
  if (dtypes.empty()) throw InputError("--dtypes: expected at least one of float64,float32,bfloat16,float16");
  for (const auto& d : dtypes) {
    if (!harness::is_known_dtype(d)) {
      throw InputError("--dtypes: expected float64, float32, bfloat16 or float16, got '" + d + "'");
    }
  }
}

/// Opened up front so a bad path is a usage error before any case runs.
std::unique_ptr<std::ofstream> open_report(const std::string& path) {
  if (path.empty()) return nullptr;
  auto file = std::make_unique<std::ofstream>(path);
  if (!*file) throw InputError("--report: cannot open '" + path + "' for writing");
  return file;
}

/// The reporters of one command: JSON to --report (when given) and console lines to `out`
/// (unless quiet).
struct Reporters {
  std::unique_ptr<std::ofstream> report_file;
  std::unique_ptr<reports::JsonReporter> json;
  std::unique_ptr<reports::ConsoleReporter> console;
  std::unique_ptr<reports::MultiReporter> all;

  Reporters(const std::string& report_path, std::ostream& out, bool quiet) {
    report_file = open_report(report_path);
    if (report_file) json = std::make_unique<reports::JsonReporter>(*report_file);
    if (!quiet) console = std::make_unique<reports::ConsoleReporter>(out);
    all = std::make_unique<reports::MultiReporter>(std::vector<reports::Reporter*>{json.get(), console.get()});
  }
  reports::Reporter& reporter() { return *all; }
};

CampaignOptions campaign_options(const Flags& f, const CLI::App& sub) {
  CampaignOptions o;
  if (sub.count("--cases")) {
    if (f.cases < 0) throw InputError("--cases: expected a non-negative count, got " + std::to_string(f.cases));
    o.cases = f.cases;
  }
  if (sub.get_option_no_throw("--time") && sub.count("--time")) {
    if (!(f.time_s > 0)) throw InputError("--time: expected a positive number of seconds");
    o.time_s = f.time_s;
  }
  o.seed = f.seed;
  o.device = resolve_device(f.device);
  check_dtypes(f.dtypes);
  o.dtypes = f.dtypes;
  if (f.max_ops < 1) throw InputError("--max-ops: expected at least 1, got " + std::to_string(f.max_ops));
  o.max_ops = f.max_ops;
  o.fault = parse_fault(f.fault);
  if (!f.corpus.empty()) o.corpus_dir = f.corpus;
  return o;
}

reports::CampaignInfo campaign_info(const std::string& command, const CampaignOptions& o) {
  reports::CampaignInfo info;
  info.command = command;
  info.seed = o.seed;
  info.cases_requested = o.cases;
  if (!o.cases && !o.time_s) info.cases_requested = kDefaultCampaignCases;
  info.time_budget_s = o.time_s;
  info.dtypes = o.dtypes;
  info.devices = {o.device};
  if (o.fault) info.fault = ops::fault_name(*o.fault);
  return info;
}

std::ostream* progress_stream(std::ostream& err, bool terminal, bool quiet) {
  return terminal && !quiet ? &err : nullptr;
}

int exit_for(int64_t failed) { return static_cast<int>(failed > 0 ? ExitCode::kFindings : ExitCode::kOk); }

int cmd_fuzz(const Flags& f, const CLI::App& sub, std::ostream& out, std::ostream& err, bool terminal) {
  const CampaignOptions options = campaign_options(f, sub);
  // Cases that killed an earlier run on this corpus: keep them where they are found again.
  std::vector<std::string> problems;
  for (const auto& path : recover_crashed_cases(options.corpus_dir, problems)) {
    err << "gradfuzz: a case killed an earlier run; saved as " << path.string() << "\n  gradfuzz replay "
        << path.string() << "\n";
  }
  for (const auto& problem : problems) err << "gradfuzz: " << problem << "\n";
  Reporters reporters(f.report, out, f.quiet);
  reporters.reporter().report_context(make_report_context(campaign_info("fuzz", options), options.device));
  const CampaignOutcome outcome = run_campaign(options, reporters.reporter(), progress_stream(err, terminal, f.quiet));
  reporters.reporter().finalize(reports::RunSummary{outcome.wall_s, std::nullopt});
  return exit_for(outcome.failed);
}

int cmd_replay(const Flags& f, std::ostream& out, std::ostream& err) {
  const std::optional<ops::Fault> fault = parse_fault(f.fault);
  const std::vector<LoadedCase> cases = load_case_paths(f.paths);
  Reporters reporters(f.report, out, /*quiet=*/true);
  reports::CampaignInfo info;
  info.command = "replay";
  info.cases_requested = static_cast<int64_t>(cases.size());
  std::set<std::string> dtypes;
  std::set<std::string> devices;
  for (const auto& c : cases) {
    dtypes.insert(c.file.spec.dtype);
    devices.insert(c.file.spec.device);
  }
  info.dtypes.assign(dtypes.begin(), dtypes.end());
  info.devices.assign(devices.begin(), devices.end());
  if (fault) info.fault = ops::fault_name(*fault);
  reporters.reporter().report_context(make_report_context(info, devices.count("cuda") ? "cuda" : "cpu"));
  const auto start = std::chrono::steady_clock::now();
  const ReplayOutcome outcome = replay_cases(cases, fault, harness::RunOptions{}, &reporters.reporter(), &out);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  reporters.reporter().finalize(reports::RunSummary{wall_s, std::nullopt});
  out << "replay: " << outcome.cases_run << " cases, " << outcome.failed << " failed\n";
  (void)err;
  return exit_for(outcome.failed);
}

int cmd_selftest(const Flags& f, const CLI::App& sub, std::ostream& out, std::ostream& err, bool terminal) {
  SelftestOptions options;
  options.faults = parse_fault_list(f.faults);
  options.campaign = campaign_options(f, sub);
  if (!options.campaign.cases) options.campaign.cases = kDefaultSelftestCases;
  if (!f.corpus.empty()) options.corpus_dir = f.corpus;
  Reporters reporters(f.report, out, /*quiet=*/false);
  reports::CampaignInfo info = campaign_info("selftest", options.campaign);
  info.fault.reset();
  reporters.reporter().report_context(make_report_context(info, options.campaign.device));
  const auto start = std::chrono::steady_clock::now();
  std::vector<reports::SelftestEntry> entries =
      run_selftest(options, reporters.reporter(), progress_stream(err, terminal, false));
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bool all_ok = true;
  for (const auto& e : entries) all_ok = all_ok && e.ok();
  reporters.reporter().finalize(reports::RunSummary{wall_s, std::move(entries)});
  return static_cast<int>(all_ok ? ExitCode::kOk : ExitCode::kFindings);
}

int cmd_list(const Flags& f, std::ostream& out) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  if (f.what == "ops") {
    const auto& registry = ops::OpRegistry::catalog();
    for (const auto& name : registry.names()) {
      const ops::OpInfo& info = registry.info(name);
      j.push_back({{"name", name}, {"summary", info.summary}, {"attrs", info.defaults}});
      if (!f.json) out << name << (info.summary.empty() ? "" : "\t" + info.summary) << '\n';
    }
  } else if (f.what == "fusions") {
    // catalog() returns by value: keep it alive for the loop over its entries.
    const ops::FusionRegistry catalog = ops::FusionRegistry::catalog();
    for (const auto& entry : catalog.entries()) {
      j.push_back({{"name", entry.name}, {"pass", ops::fusion_pass_name(entry.pass)}});
      if (!f.json) out << entry.name << '\t' << ops::fusion_pass_name(entry.pass) << '\n';
    }
  } else {
    for (ops::Fault fault : ops::all_faults()) {
      j.push_back({{"name", ops::fault_name(fault)}});
      if (!f.json) out << ops::fault_name(fault) << '\n';
    }
  }
  if (f.json) out << j.dump(2) << '\n';
  return static_cast<int>(ExitCode::kOk);
}

int cmd_bench(const Flags& f, const CLI::App& sub, std::ostream& out) {
  CampaignOptions options = campaign_options(f, sub);
  if (!options.cases) options.cases = kDefaultBenchCases;
  out << "bench: " << *options.cases << " cases, seed " << options.seed << ", device " << options.device << '\n';
  const BenchOutcome outcome = run_bench(options);
  print_bench(outcome, out);
  return static_cast<int>(ExitCode::kOk);
}

/// Cases are tiny (a few rows and features), so intra-op parallelism only adds OpenMP
/// wake-ups and spinning; on a shared machine that costs ~10x throughput (measured on a
/// loaded 2-core host: 6.1 s vs 0.7 s user for 300 cases). Scale out with processes instead.
/// An explicit OMP_NUM_THREADS is respected.
void use_single_intra_op_thread() {
  if (!std::getenv("OMP_NUM_THREADS")) at::set_num_threads(1);
}

void add_campaign_flags(CLI::App& sub, Flags& f) {
  sub.add_option("--seed", f.seed, "campaign seed (case i uses a seed derived from it and i)");
  sub.add_option("--device", f.device, "cpu, cuda or auto (cuda when available)")->default_str("cpu");
  sub.add_option("--dtypes", f.dtypes, "comma-separated dtypes (float64,float32,bfloat16,float16)")
      ->delimiter(',')
      ->default_str("float64,float32");
  sub.add_option("--max-ops", f.max_ops, "upper bound on catalog ops per case")->default_str("8");
}

}  // namespace

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool terminal) {
  CLI::App app{"gradfuzz: differential fuzzer for fused forward/backward op runtimes", "gradfuzz"};
  app.require_subcommand(1);
  Flags f;

  CLI::App* fuzz = app.add_subcommand("fuzz", "run a seeded campaign of generated cases");
  auto* cases_opt = fuzz->add_option("--cases", f.cases, "number of cases (default 100)");
  auto* time_opt = fuzz->add_option("--time", f.time_s, "wall-time budget in seconds");
  cases_opt->excludes(time_opt);
  add_campaign_flags(*fuzz, f);
  fuzz->add_option("--fault", f.fault, "switch one known defect on (see `gradfuzz list faults`)");
  fuzz->add_option("--corpus", f.corpus, "corpus directory (default gradfuzz-out/corpus)");
  fuzz->add_option("--report", f.report, "write the JSON report here");
  fuzz->add_flag("--quiet", f.quiet, "print nothing but errors");

  CLI::App* replay = app.add_subcommand("replay", "run case files or directories of case files");
  replay->add_option("paths", f.paths, "case files or directories")->required();
  replay->add_option("--fault", f.fault, "switch one known defect on");
  replay->add_option("--report", f.report, "write the JSON report here");

  CLI::App* selftest = app.add_subcommand("selftest", "check that the default campaign finds every known fault");
  selftest->add_option("--faults", f.faults, "comma-separated fault names or 'all'")->default_str("all");
  selftest->add_option("--cases", f.cases, "case budget per fault (default 2000)");
  selftest->add_option("--report", f.report, "write the JSON report here");
  add_campaign_flags(*selftest, f);
  selftest->add_option("--corpus", f.corpus, "where found cases are saved (default gradfuzz-out/selftest)");

  CLI::App* list = app.add_subcommand("list", "list catalog ops, fusions or faults");
  list->add_option("what", f.what, "ops, fusions or faults")
      ->required()
      ->check(CLI::IsMember({"ops", "fusions", "faults"}));
  list->add_flag("--json", f.json, "print JSON");

  CLI::App* bench = app.add_subcommand("bench", "campaign throughput against the bare fused+reference floor");
  bench->add_option("--cases", f.cases, "number of cases (default 200)");
  add_campaign_flags(*bench, f);

  std::vector<const char*> argv{"gradfuzz"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::Success& e) {
    return app.exit(e, out, err);
  } catch (const CLI::ParseError& e) {
    app.exit(e, out, err);
    return static_cast<int>(ExitCode::kUsage);
  }

  try {
    if (!list->parsed()) use_single_intra_op_thread();
    if (fuzz->parsed()) return cmd_fuzz(f, *fuzz, out, err, terminal);
    if (replay->parsed()) return cmd_replay(f, out, err);
    if (selftest->parsed()) return cmd_selftest(f, *selftest, out, err, terminal);
    if (list->parsed()) return cmd_list(f, out);
    if (bench->parsed()) return cmd_bench(f, *bench, out);
    err << "gradfuzz: error: no command given\n";
    return static_cast<int>(ExitCode::kUsage);
  } catch (const InputError& e) {
    err << "gradfuzz: error: " << e.what() << '\n';
    return static_cast<int>(ExitCode::kUsage);
  } catch (const corpus::CorpusError& e) {
    err << "gradfuzz: error: " << e.what() << '\n';
    return static_cast<int>(ExitCode::kUsage);
  } catch (const InternalError& e) {
    err << "gradfuzz: internal error: " << e.what();
    if (!e.repro().empty()) err << " (repro left at " << e.repro() << ")";
    err << '\n';
    return static_cast<int>(ExitCode::kInternal);
  } catch (const std::exception& e) {
    err << "gradfuzz: internal error: " << e.what() << '\n';
    return static_cast<int>(ExitCode::kInternal);
  } catch (...) {
    err << "gradfuzz: internal error: unknown exception\n";
    return static_cast<int>(ExitCode::kInternal);
  }
}

}  // namespace gradfuzz::tools
