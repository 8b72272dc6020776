#include "tools/cli.h"

#include <ATen/Parallel.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include "backends/remote_backend.h"
#include "campaign/campaign.h"
#include "campaign/environment.h"
#include "campaign/exit_codes.h"
#include "campaign/export.h"
#include "campaign/files.h"
#include "campaign/replay.h"
#include "campaign/sanitizer.h"
#include "campaign/selftest.h"
#include "campaign/worker_pool.h"
#include "corpus/case_file.h"
#include "harness/case_spec.h"
#include "harness/dtype.h"
#include "harness/limits.h"
#include "harness/sharding.h"
#include "ops/errors.h"
#include "ops/faults.h"
#include "ops/fusion_registry.h"
#include "ops/op_registry.h"
#include "oracle/tolerances.h"
#include "reports/console_reporter.h"
#include "reports/json_reporter.h"
#include "tools/bench.h"
#include "tools/known_tool.h"
#include "tools/report_tool.h"

namespace gradfuzz::tools {

using campaign::campaign_gen_options;
using campaign::CampaignOptions;
using campaign::CampaignOutcome;
using campaign::CaseRunner;
using campaign::cuda_available;
using campaign::ExitCode;
using campaign::find_leftover_cases;
using campaign::InProcessRunner;
using campaign::InputError;
using campaign::InternalError;
using campaign::kDefaultCampaignCases;
using campaign::kDefaultSelftestCases;
using campaign::kSelftestCaseTimeoutS;
using campaign::LeftoverCase;
using campaign::load_case_paths;
using campaign::LoadedCase;
using campaign::make_report_context;
using campaign::make_temp_dir;
using campaign::replay_cases;
using campaign::ReplayOutcome;
using campaign::resolve_device;
using campaign::run_campaign;
using campaign::run_selftest;
using campaign::run_worker;
using campaign::sanitizer_tool_from_name;
using campaign::SanitizerOptions;
using campaign::SelftestOptions;
using campaign::WorkerPool;
using campaign::WorkerPoolOptions;

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
  std::string backend = "model";
  int workers = 1;
  double case_timeout_s = 60;
  std::string python_exe;
  std::string adapter_dir;
  std::vector<std::string> devices;
  std::string output;
  bool python_format = false;
  bool no_finite_differences = false;
  bool no_shared_runs = false;
  std::string overlap = "auto";
  bool mps = false;
  std::string shard;
  std::string shapes;
  int64_t max_tensor_elements = int64_t{1} << 24;
  std::string sanitize;
  CiOutputs ci;
  // Numbers as typed: converted by parse_numbers, which refuses what does not fit instead of
  // clamping it (CLI11 clamps 99999999999999999999 and wraps -1 into 2^64-1).
  std::string cases_text;
  std::string seed_text;
  std::string max_ops_text;
  std::string workers_text;
  std::string dtypes_text;
  std::string case_log;
  std::string generate_as;
  std::string export_capabilities;
  std::string max_shrink_calls_text;
  std::string known;
  bool fail_on_known = false;
  bool full_export = false;
  bool upstream_export = false;
  /// replay --confirm.
  bool confirm = false;
  /// export --upstream --signature.
  std::string signature;
  std::string recipe = "any";
  // Distributed cases: ranks per case (0: one-process cases) and, for a worker, the device
  // its rank processes run on (empty: the campaign's).
  std::string world_size_text;
  int64_t world_size = 0;
  std::string rank_device;
};

/// A whole number in [min, max] typed as plain decimal digits; InputError naming the option
/// otherwise.
uint64_t parse_whole(const std::string& text, const std::string& option, uint64_t min, uint64_t max) {
  const bool digits = !text.empty() && text.size() <= 20 && text.find_first_not_of("0123456789") == std::string::npos;
  errno = 0;
  const unsigned long long v = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
  if (!digits || errno == ERANGE || v < min || v > max) {
    throw InputError(option + ": expected a whole number from " + std::to_string(min) + " to " + std::to_string(max) +
                     ", got '" + text + "'");
  }
  return v;
}

/// Fills the numeric flags from their text (only those given).
void parse_numbers(Flags& f) {
  if (!f.cases_text.empty()) {
    f.cases = static_cast<int64_t>(parse_whole(f.cases_text, "--cases", 0, uint64_t{1} << 53));
  }
  if (!f.seed_text.empty()) f.seed = parse_whole(f.seed_text, "--seed", 0, UINT64_MAX);
  if (!f.max_ops_text.empty()) {
    f.max_ops = static_cast<int>(
        parse_whole(f.max_ops_text, "--max-ops", 1, static_cast<uint64_t>(harness::CaseLimits{}.max_ops)));
  }
  if (!f.workers_text.empty()) f.workers = static_cast<int>(parse_whole(f.workers_text, "--workers", 0, 1024));
  if (!f.world_size_text.empty()) {
    f.world_size = static_cast<int64_t>(
        parse_whole(f.world_size_text, "--world-size", 1, static_cast<uint64_t>(harness::kMaxWorldSize)));
  }
  if (!f.dtypes_text.empty()) {
    f.dtypes.clear();
    std::stringstream in(f.dtypes_text);
    std::string d;
    while (std::getline(in, d, ',')) {
      if (d.empty()) {
        throw InputError("--dtypes: expected a comma-separated list of float64, float32, bfloat16, float16, got '" +
                         f.dtypes_text + "'");
      }
      f.dtypes.push_back(d);
    }
    if (f.dtypes.empty() || f.dtypes_text.back() == ',') {
      throw InputError("--dtypes: expected a comma-separated list of float64, float32, bfloat16, float16, got '" +
                       f.dtypes_text + "'");
    }
  }
}

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

backends::BackendOptions backend_options(const Flags& f) {
  backends::BackendOptions o;
  const auto& known = backends::backend_names();
  if (std::find(known.begin(), known.end(), f.backend) == known.end()) {
    throw InputError("--backend: expected model, te or torch, got '" + f.backend + "'");
  }
  o.name = f.backend;
  o.python = f.python_exe;
  o.adapter_dir = f.adapter_dir;
  if (!(f.case_timeout_s > 0) || f.case_timeout_s > 86400) {
    throw InputError("--case-timeout: expected seconds in (0, 86400], got " + std::to_string(f.case_timeout_s));
  }
  o.case_timeout_s = f.case_timeout_s;
  o.world_size = std::max<int64_t>(1, f.world_size);
  o.rank_device = f.rank_device.empty() ? resolve_device(f.device) : f.rank_device;
  if (o.rank_device != "cpu" && o.rank_device != "cuda") {
    throw InputError("--rank-device: expected cpu or cuda, got '" + o.rank_device + "'");
  }
  return o;
}

/// compute-sanitizer settings of --sanitize TOOL: logs beside the corpus (or in $TMPDIR).
SanitizerOptions sanitizer_options(const Flags& f) {
  SanitizerOptions o;
  try {
    o.tool = sanitizer_tool_from_name(f.sanitize);
  } catch (const std::invalid_argument& e) {
    throw InputError(std::string("--sanitize: ") + e.what());
  }
  if (f.workers < 1) throw InputError("--sanitize: needs worker processes (--workers 1 or more)");
  if (!cuda_available()) throw InputError("--sanitize: compute-sanitizer checks CUDA kernels; this machine has no GPU");
  if (const char* exe = std::getenv("GRADFUZZ_COMPUTE_SANITIZER"); exe && *exe) o.executable = exe;
  const std::string dir = make_temp_dir("gradfuzz-sanitizer-").string();
  o.log_pattern = dir + "/worker-%p.log";
  return o;
}

/// --overlap as the run options take it; auto: the evidence drawn ahead for CUDA cases where
/// each worker and its adapter have a core of their own, else the reference only. Drawing
/// ahead is CPU a passing case does not need: with the adapter's work on the GPU it is free
/// (one te worker on the H200: 7.5-8.2 ms less a case under an FP8 recipe, docs/BENCHMARKS.md),
/// with a CPU adapter sharing the cores it slows the adapter down.
runner::RunOptions::Overlap resolve_overlap(const Flags& f) {
  if (f.overlap != "auto") {
    try {
      return runner::overlap_from_name(f.overlap);
    } catch (const std::invalid_argument& e) {
      throw InputError(std::string("--overlap: ") + e.what() + " or auto");
    }
  }
  bool cuda = false;
  try {
    cuda = campaign::resolve_device(f.device) == "cuda";
  } catch (const std::exception&) {  // the command itself says what is wrong with --device
  }
  const unsigned cores = std::thread::hardware_concurrency();
  const unsigned workers = static_cast<unsigned>(std::max(f.workers, 1));
  return cuda && (cores == 0 || 2 * workers <= cores) ? runner::RunOptions::Overlap::kEvidence
                                                      : runner::RunOptions::Overlap::kReference;
}

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

/// Whether `name` is one of the model's faults (ops/faults.h).
bool is_model_fault(const std::string& name) {
  const auto& all = ops::all_faults();
  return std::any_of(all.begin(), all.end(), [&](ops::Fault f) { return ops::fault_name(f) == name; });
}

/// Checks a --fault name against the model's faults and the backend's planted ones.
std::optional<std::string> check_fault(const std::string& name, const harness::BackendCapabilities& caps,
                                       const char* flag = "--fault") {
  if (name.empty()) return std::nullopt;
  if (is_model_fault(name) && caps.backend == "model") return name;
  if (caps.fault(name)) return name;
  std::string known;
  for (const auto& f : caps.faults) known += (known.empty() ? "" : ", ") + f.name;
  throw InputError(std::string(flag) + ": the " + caps.backend + " backend has no fault '" + name + "'; its faults: " +
                   (known.empty() ? "none" : known) + " (gradfuzz list faults --backend " + caps.backend + ")");
}

/// `all` means every fault this run can see: for the model, the oob-write fault only under
/// `--sanitize memcheck` on CUDA, the process-killing faults only with worker processes; for
/// te and torch, the adapter's planted faults.
std::vector<std::string> parse_fault_list(const std::string& list, const harness::BackendCapabilities& caps,
                                          bool sanitized, bool workers, std::vector<std::string>* too_many_ranks) {
  std::vector<std::string> faults;
  // A fault of the ranks' communication needs cases of its world: where the backend runs
  // fewer ranks (te on one GPU) it is left out and named, not an error (a list written for
  // another machine still runs the rest).
  auto runs_here = [&](const std::string& name) {
    const auto* planted = caps.fault(name);
    if (!planted || planted->world_size <= caps.max_world_size) return true;
    if (too_many_ranks) {
      too_many_ranks->push_back(name + " needs cases of " + std::to_string(planted->world_size) + " ranks; the " +
                                caps.backend + " backend runs " + std::to_string(caps.max_world_size) + " here");
    }
    return false;
  };
  if (list == "all") {
    if (caps.backend != "model") {
      for (const auto& f : caps.faults) {
        if (runs_here(f.name)) faults.push_back(f.name);
      }
      if (faults.empty()) throw InputError("--faults all: the " + caps.backend + " backend has no planted faults");
      return faults;
    }
    for (ops::Fault f : ops::all_faults()) {
      const auto v = ops::fault_visibility(f);
      if (v == ops::FaultVisibility::kSanitizer && !sanitized) continue;
      if (v == ops::FaultVisibility::kProcess && !workers) continue;
      faults.push_back(ops::fault_name(f));
    }
    return faults;
  }
  std::stringstream in(list);
  std::string name;
  bool any = false;
  while (std::getline(in, name, ',')) {
    if (name.empty()) continue;
    any = true;
    const std::string fault = *check_fault(name, caps, "--faults");
    if (runs_here(fault)) faults.push_back(fault);
  }
  if (!any) throw InputError("--faults: expected a comma-separated list of fault names or 'all', got '" + list + "'");
  if (faults.empty()) {
    std::string why;
    for (const auto& reason : too_many_ranks ? *too_many_ranks : std::vector<std::string>{}) why += "; " + reason;
    throw InputError("--faults: none of '" + list + "' runs on this backend here" + why);
  }
  return faults;
}

/// Checks --recipe against what the backend runs.
void check_recipe(const std::string& recipe, const harness::BackendCapabilities& caps) {
  if (recipe == "any" || recipe == "none") return;
  std::string available;
  for (const auto* r : caps.available_recipes()) {
    if (r->name == recipe) return;
    available += (available.empty() ? "" : ", ") + r->name;
  }
  throw InputError("--recipe " + recipe + ": the " + caps.backend + " backend runs " +
                   (available.empty() ? "no recipe here" : available) + " (or any, none)");
}

/// The known-issues file of --known (null without one).
std::shared_ptr<const campaign::KnownIssues> load_known(const Flags& f) {
  if (f.known.empty()) return nullptr;
  return std::make_shared<const campaign::KnownIssues>(campaign::load_known_issues(f.known));
}

void check_dtypes(const std::vector<std::string>& dtypes) {
  if (dtypes.empty()) throw InputError("--dtypes: expected at least one of float64,float32,bfloat16,float16");
  for (const auto& d : dtypes) {
    if (!harness::is_known_dtype(d)) {
      throw InputError("--dtypes: expected float64, float32, bfloat16 or float16, got '" + d + "'");
    }
  }
}

/// The JSON report, valid at every moment: each write goes to a temporary file beside it and
/// is renamed over it, so a reader (or a run killed mid-write) never sees half a document.
class ReportFile {
 public:
  /// Checks up front that the directory takes a file, so a bad path is a usage error
  /// before any case runs.
  explicit ReportFile(std::string path) : path_(std::move(path)) {
    if (path_.empty()) throw InputError("--report: expected a file name, got an empty one");
    write_text("{}\n");
  }
  void write(const nlohmann::ordered_json& document) { write_text(document.dump(2) + "\n"); }
  void write_raw(const std::string& text) { write_text(text); }

 private:
  void write_text(const std::string& text) {
    const std::string tmp = path_ + ".tmp-" + std::to_string(::getpid());
    {
      std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
      if (!file) throw InputError("--report: cannot write '" + path_ + "' (cannot create " + tmp + ")");
      file << text;
      file.flush();
      if (!file) throw InputError("--report: cannot write '" + path_ + "'");
    }
    if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
      std::remove(tmp.c_str());
      throw InputError("--report: cannot write '" + path_ + "' (rename failed)");
    }
  }
  std::string path_;
};

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

CampaignOptions campaign_options(const Flags& f, const CLI::App& sub) {
  CampaignOptions o;
  if (sub.count("--cases")) {
    if (f.cases < 0) throw InputError("--cases: expected a non-negative count, got " + std::to_string(f.cases));
    o.cases = f.cases;
  }
  if (sub.get_option_no_throw("--time") && sub.count("--time")) {
    if (!(f.time_s > 0) || !(f.time_s <= 1e7)) {
      throw InputError("--time: expected a positive number of seconds (at most 1e7), got " + std::to_string(f.time_s));
    }
    o.time_s = f.time_s;
  }
  o.seed = f.seed;
  o.device = resolve_device(f.device);
  check_dtypes(f.dtypes);
  o.dtypes = f.dtypes;
  if (f.max_ops < 1) throw InputError("--max-ops: expected at least 1, got " + std::to_string(f.max_ops));
  o.max_ops = f.max_ops;
  // Checked against the backend's faults once it runs (check_fault).
  if (!f.fault.empty()) o.fault = f.fault;
  o.known = load_known(f);
  o.recipe = f.recipe;
  if (f.world_size > 0) o.world_size = f.world_size;
  if (sub.get_option_no_throw("--corpus") && sub.count("--corpus")) {
    if (f.corpus.empty()) throw InputError("--corpus: expected a directory, got an empty name");
    o.corpus_dir = f.corpus;
  }
  o.backend = f.backend;
  o.run_options.finite_differences = !f.no_finite_differences;
  o.run_options.shared_runs = !f.no_shared_runs;
  o.run_options.overlap = resolve_overlap(f);
  if (!f.max_shrink_calls_text.empty()) {
    o.max_shrink_calls = static_cast<int64_t>(parse_whole(f.max_shrink_calls_text, "--max-shrink-calls", 0, 1000000));
  }
  if (!f.shapes.empty()) {
    try {
      o.shapes = generators::shape_regime_from_name(f.shapes);
    } catch (const std::invalid_argument& e) {
      throw InputError(std::string("--shapes: ") + e.what());
    }
  }
  if (f.max_tensor_elements < 64 || f.max_tensor_elements > (int64_t{1} << 32)) {
    throw InputError("--max-tensor-elements: expected 64 to 2^32, got " + std::to_string(f.max_tensor_elements));
  }
  o.max_tensor_elements = f.max_tensor_elements;
  if (!f.shard.empty()) {
    // "i/N", 1 <= i <= N: shard i of N (SLURM_ARRAY_TASK_ID + 1 of the array's size).
    const auto slash = f.shard.find('/');
    int64_t i = 0;
    int64_t n = 0;
    bool ok = slash != std::string::npos && slash > 0 && slash + 1 < f.shard.size() &&
              f.shard.find_first_not_of("0123456789/") == std::string::npos && f.shard.size() <= 15;
    if (ok) {
      i = std::stoll(f.shard.substr(0, slash));
      n = std::stoll(f.shard.substr(slash + 1));
      ok = n >= 1 && i >= 1 && i <= n;
    }
    if (!ok) throw InputError("--shard: expected i/N with 1 <= i <= N (e.g. 2/8), got '" + f.shard + "'");
    o.shard_index = i - 1;
    o.shard_count = n;
  }
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

int cmd_list(const Flags& f, std::ostream& out) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  if (f.what == "capabilities" && f.backend == "model") {
    out << nlohmann::json(harness::model_capabilities()).dump(2) << '\n';
    return static_cast<int>(ExitCode::kOk);
  }
  if (f.backend != "model") {
    std::unique_ptr<backends::Backend> backend;
    const harness::BackendCapabilities* caps = nullptr;
    try {
      backend = backends::make_backend(backend_options(f));
      caps = &backend->capabilities();
    } catch (const backends::BackendUnavailable& e) {
      throw InputError(std::string("--backend ") + f.backend + ": " + e.what());
    }
    if (f.what == "capabilities") {
      out << nlohmann::json(*caps).dump(2) << '\n';
      return static_cast<int>(ExitCode::kOk);
    }
    if (f.what == "faults") {
      for (const auto& fault : caps->faults) {
        j.push_back({{"name", fault.name}, {"description", fault.description}, {"target", fault.target}});
        if (!f.json) out << fault.name << '\t' << fault.description << '\n';
      }
    } else if (f.what == "ops") {
      for (const auto& op : caps->ops) {
        nlohmann::ordered_json options = nlohmann::ordered_json::object();
        for (const auto& [attr, values] : op.options) options[attr] = values;
        std::vector<std::string> styles;
        for (auto style : op.output_styles)
          styles.emplace_back(style == ops::OutputStyle::kGenerator ? "generator" : "vector");
        j.push_back({{"name", op.name},
                     {"implementation", op.implementation},
                     {"options", options},
                     {"output_styles", styles}});
        if (!f.json) {
          out << op.name << '\t' << op.implementation;
          for (const auto& [attr, values] : op.options) {
            out << "  " << attr << "=";
            for (size_t i = 0; i < values.size(); ++i) out << (i ? "|" : "") << values[i];
          }
          out << '\n';
        }
      }
    } else {
      for (const auto& fusion : caps->fusions) {
        j.push_back({{"name", fusion.name},
                     {"pass", ops::fusion_pass_name(fusion.pass)},
                     {"implementation", fusion.implementation}});
        if (!f.json)
          out << fusion.name << '\t' << ops::fusion_pass_name(fusion.pass) << '\t' << fusion.implementation << '\n';
      }
    }
    if (f.json) out << j.dump(2) << '\n';
    return static_cast<int>(ExitCode::kOk);
  }
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
      j.push_back({{"name", ops::fault_name(fault)}, {"description", ops::fault_description(fault)}});
      if (!f.json) out << ops::fault_name(fault) << '\t' << ops::fault_description(fault) << '\n';
    }
  }
  if (f.json) out << j.dump(2) << '\n';
  return static_cast<int>(ExitCode::kOk);
}

int cmd_bench(const Flags& f, const CLI::App& sub, std::ostream& out) {
  if (f.shapes == "scaling") {
    // How the cost of one case grows with its size (docs/BENCHMARKS.md).
    const std::string device = resolve_device(f.device);
    std::string dtype = "float32";
    if (sub.count("--dtypes")) {
      check_dtypes(f.dtypes);
      if (f.dtypes.size() != 1) throw InputError("--dtypes: bench --shapes scaling takes one dtype");
      dtype = f.dtypes.front();
    }
    const int64_t max_elements = sub.count("--max-tensor-elements")
                                     ? f.max_tensor_elements
                                     : (device == "cuda" ? int64_t{100000000} : int64_t{10000000});
    if (max_elements < 100 || max_elements > (int64_t{1} << 32)) {
      throw InputError("--max-tensor-elements: expected 100 to 2^32, got " + std::to_string(max_elements));
    }
    out << "bench --shapes scaling: MakeExtraOutput, Linear, Bias, GELU, AddExtraInput (all fusions), " << dtype
        << ", device " << device << '\n';
    print_scaling(run_shape_scaling(device, dtype, max_elements, runner::RunOptions{}), out);
    return static_cast<int>(ExitCode::kOk);
  }
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
  sub.add_option("--seed", f.seed_text, "campaign seed (case i uses a seed derived from it and i)");
  sub.add_option("--device", f.device, "cpu, cuda or auto (cuda when available)")->default_str("cpu");
  sub.add_option("--dtypes", f.dtypes_text, "comma-separated dtypes (float64,float32,bfloat16,float16)")
      ->default_str("float64,float32");
  sub.add_option("--max-ops", f.max_ops_text, "upper bound on catalog ops per case (1 to 256)")->default_str("8");
  sub.add_option("--shapes", f.shapes,
                 "tiny, edge, large or mix (default: mix on cuda, tiny on cpu); bench also takes 'scaling' (time "
                 "per case against elements per case)");
  sub.add_option("--max-tensor-elements", f.max_tensor_elements, "element budget of one tensor in edge/large cases")
      ->default_str("16777216");
  sub.add_option(
         "--recipe", f.recipe,
         "FP8 recipes where the backend has them: any (half the cases), none, or one recipe's name (every case)")
      ->default_str("any");
}

void add_known_flags(CLI::App& sub, Flags& f) {
  sub.add_option("--known", f.known,
                 "known-issues file: matching findings are reported as known, not shrunk, and do not fail the run");
  sub.add_flag("--fail-on-known", f.fail_on_known, "with --known: known findings make exit status 1 too");
}

void add_backend_flags(CLI::App& sub, Flags& f, bool with_workers = true) {
  sub.add_option("--backend", f.backend, "model, te or torch (docs/BACKENDS.md)")->default_str("model");
  sub.add_option("--python-exe", f.python_exe, "Python of the te/torch adapter (default $GRADFUZZ_PYTHON)");
  sub.add_option("--adapter-dir", f.adapter_dir, "folder holding gradfuzz_adapter (default the source tree's)");
  sub.add_option("--case-timeout", f.case_timeout_s, "seconds one case may run before it is a timeout")
      ->default_str("60");
  if (with_workers) {
    sub.add_option("--workers", f.workers_text, "worker processes (0: run cases in this process)")->default_str("1");
    sub.add_option("--devices", f.devices, "CUDA devices handed to workers round-robin (e.g. 0,1)")->delimiter(',');
  }
  sub.add_flag("--no-finite-differences", f.no_finite_differences, "skip the finite-difference check of the reference");
  sub.add_flag("--no-shared-runs", f.no_shared_runs,
               "run each check of a case as its own run, as before (slower, same findings; for comparing)");
  sub.add_option("--overlap", f.overlap,
                 "what a worker does while a te/torch adapter runs a case's paths: none, reference (the float64 "
                 "reference), evidence (that and the low-precision evidence a failing case needs, drawn ahead; same "
                 "findings), auto (evidence for CUDA cases when the machine has two cores per worker, else reference)")
      ->default_str("auto");
  if (with_workers) {
    sub.add_option("--sanitize", f.sanitize,
                   "run workers under compute-sanitizer: memcheck, racecheck, initcheck, synccheck");
    sub.add_flag("--mps", f.mps,
                 "start a CUDA MPS daemon of this run's own, so the workers' kernels share each GPU (docs/GPU.md)");
  }
}

int cmd_worker(const Flags& f) {
  backends::BackendOptions backend = backend_options(f);
  runner::RunOptions run_options;
  run_options.finite_differences = !f.no_finite_differences;
  run_options.shared_runs = !f.no_shared_runs;
  run_options.overlap = resolve_overlap(f);
  return run_worker(backend, run_options);
}

/// The export's paths with the fusions the target runs of theirs, for their quantization
/// points (runner::judging_expectation): te runs every fusion a case names (the model's fuser
/// models te.ops'); torch only those of its capabilities (torch_runtime.py: FUSIONS).
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
  }
  if (!job.output.empty()) ReportFile(output).write_raw(done.reply.script);
  return done;
}

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

}  // namespace

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool terminal) {
  CLI::App app{"gradfuzz: differential fuzzer for fused forward/backward op runtimes", "gradfuzz"};
  app.require_subcommand(1);
  Flags f;

  CLI::App* fuzz = app.add_subcommand("fuzz", "run a seeded campaign of generated cases");
  auto* cases_opt = fuzz->add_option("--cases", f.cases_text, "number of cases (default 100)");
  auto* time_opt = fuzz->add_option("--time", f.time_s, "wall-time budget in seconds");
  cases_opt->excludes(time_opt);
  add_campaign_flags(*fuzz, f);
  fuzz->add_option("--fault", f.fault, "switch one known defect on (see `gradfuzz list faults`)");
  fuzz->add_option("--corpus", f.corpus, "corpus directory (default gradfuzz-out/corpus)");
  fuzz->add_option("--report", f.report, "write the JSON report here");
  fuzz->add_flag("--quiet", f.quiet, "print nothing but errors");
  add_backend_flags(*fuzz, f);
  fuzz->add_option("--max-shrink-calls", f.max_shrink_calls_text, "cap on the runs one shrink may make (default 2000)");
  fuzz->add_option("--case-log", f.case_log, "write one JSON line per case (number, verdict, signature, spec)");
  fuzz->add_option("--generate-as", f.generate_as,
                   "generate the cases a campaign on this backend would run (te: compare the model on TE's cases)");
  fuzz->add_option("--shard", f.shard, "run shard i of N of the campaign (i/N, 1-based): shards never repeat cases");
  fuzz->add_option("--world-size", f.world_size_text,
                   "distributed cases of N ranks (tensor/sequence-parallel chains; torch and te backends)");
  add_known_flags(*fuzz, f);
  add_ci_output_flags(*fuzz, f.ci);

  CLI::App* replay = app.add_subcommand("replay", "run case files or directories of case files");
  replay->add_option("paths", f.paths, "case files or directories")->required();
  replay->add_option("--fault", f.fault, "switch one known defect on");
  replay->add_flag("--confirm", f.confirm,
                   "confirm each new finding by its alternative runs (diagnosis; for `report upstream`)");
  add_known_flags(*replay, f);
  replay->add_option("--report", f.report, "write the JSON report here");
  add_ci_output_flags(*replay, f.ci);
  add_backend_flags(*replay, f);

  CLI::App* selftest = app.add_subcommand("selftest", "check that the default campaign finds every known fault");
  selftest->add_option("--faults", f.faults, "comma-separated fault names or 'all'")->default_str("all");
  selftest->add_option("--cases", f.cases_text, "case budget per fault (default 2000)");
  selftest->add_option("--report", f.report, "write the JSON report here");
  add_ci_output_flags(*selftest, f.ci);
  add_campaign_flags(*selftest, f);
  selftest->add_option("--corpus", f.corpus, "where found cases are saved (default gradfuzz-out/selftest)");
  add_known_flags(*selftest, f);
  add_backend_flags(*selftest, f);

  CLI::App* list = app.add_subcommand("list", "list catalog ops, fusions, faults or a backend's capabilities");
  list->add_option("what", f.what, "ops, fusions, faults or capabilities")
      ->required()
      ->check(CLI::IsMember({"ops", "fusions", "faults", "capabilities"}));
  list->add_flag("--json", f.json, "print JSON");
  add_backend_flags(*list, f, /*with_workers=*/false);

  CLI::App* exporter = app.add_subcommand("export", "write a case as a standalone test for the real framework");
  exporter->add_flag("--python", f.python_format, "a pytest file (te.ops or PyTorch build, values, float64 reference)");
  exporter->add_flag("--upstream", f.upstream_export,
                     "a test in TE's own style for the case's finding: seeded values, the plain float64 reference, "
                     "TE's tolerance, one assertion (at most 40 lines for a case of up to 3 ops)");
  exporter->add_option("--signature", f.signature,
                       "with --upstream: the finding to write the test for (default: the one the case was saved "
                       "for, else its first when the target replays it)");
  exporter->add_option("--fault", f.fault, "with --upstream: the torch backend's planted fault the test switches on");
  exporter->add_option("case", f.paths, "the case file")->required()->expected(1);
  exporter->add_option("--output,-o", f.output, "write the script here (default: stdout)");
  exporter->add_flag("--full", f.full_export,
                     "the self-contained form (whole catalog, reference and oracle) instead of the compact test");
  exporter->add_option("--capabilities", f.export_capabilities,
                       "the target's capabilities (`gradfuzz list capabilities --backend te --json` on the target "
                       "machine): its FP8 rounding and GEMM accumulation set a recipe case's bounds (default: asked "
                       "of the target when it starts here, else the coarse FP8 allowance)");
  add_backend_flags(*exporter, f, /*with_workers=*/false);

  CLI::App* worker = app.add_subcommand("worker", "");  // internal: a campaign's worker process
  worker->group("");
  add_backend_flags(*worker, f, /*with_workers=*/false);
  worker->add_option("--world-size", f.world_size_text, "rank processes the adapter starts with");
  worker->add_option("--rank-device", f.rank_device, "cpu (gloo) or cuda (NCCL)");

  CLI::App* bench = app.add_subcommand("bench", "campaign throughput against the bare fused+reference floor");
  bench->add_option("--cases", f.cases_text, "number of cases (default 200)");
  add_campaign_flags(*bench, f);

  ReportCommand report(app);  // `report merge`, `diff` and `upstream` (tools/report_tool.h)
  std::ostringstream export_notes;
  report.set_upstream_exporter(
      [&](const nlohmann::ordered_json& cluster, const std::string& target, const std::string& test) {
        // The report's record of the cluster is the finding: no replay on the target needed.
        const corpus::SavedFinding finding = campaign::finding_from_report(nlohmann::json::parse(cluster.dump()));
        const ExportDone done = export_case(f, cluster.at("case_file").get<std::string>(), target,
                                            campaign::ExportForm::kUpstream, test, export_notes, finding);
        return UpstreamTest{done.reply.script, done.reply.notes, done.reply.source};
      });
  KnownCommand known(app);  // `known accept` (tools/known_tool.h)

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
    parse_numbers(f);
    if (!list->parsed()) use_single_intra_op_thread();
    if (fuzz->parsed()) return cmd_fuzz(f, *fuzz, out, err, terminal);
    if (replay->parsed()) return cmd_replay(f, *replay, out, err);
    if (selftest->parsed()) return cmd_selftest(f, *selftest, out, err, terminal);
    if (list->parsed()) return cmd_list(f, out);
    if (exporter->parsed()) return cmd_export(f, *exporter, out, err);
    if (worker->parsed()) return cmd_worker(f);
    if (bench->parsed()) return cmd_bench(f, *bench, out);
    if (report.parsed()) return report.run(out);
    if (known.parsed()) return known.run(out);
    err << "gradfuzz: error: no command given\n";
    return static_cast<int>(ExitCode::kUsage);
  } catch (const InputError& e) {
    err << "gradfuzz: error: " << e.what() << '\n';
    return static_cast<int>(ExitCode::kUsage);
  } catch (const corpus::CorpusError& e) {
    err << "gradfuzz: error: " << e.what() << '\n';
    return static_cast<int>(ExitCode::kUsage);
  } catch (const backends::BackendUnavailable& e) {
    // A backend that cannot start or whose workers keep dying before they are ready.
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
