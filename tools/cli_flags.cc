#include "tools/cli_flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "campaign/environment.h"
#include "campaign/exit_codes.h"
#include "campaign/files.h"
#include "campaign/known_issues.h"
#include "generators/case_gen.h"
#include "harness/case_spec.h"
#include "harness/limits.h"
#include "ops/faults.h"

namespace gradfuzz::tools::detail {

using campaign::CampaignOptions;
using campaign::cuda_available;
using campaign::InputError;
using campaign::make_temp_dir;
using campaign::resolve_device;
using campaign::sanitizer_tool_from_name;
using campaign::SanitizerOptions;

namespace {

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

/// Whether `name` is one of the model's faults (ops/faults.h).
bool is_model_fault(const std::string& name) {
  const auto& all = ops::all_faults();
  return std::any_of(all.begin(), all.end(), [&](ops::Fault f) { return ops::fault_name(f) == name; });
}

}  // namespace

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

std::optional<std::string> check_fault(const std::string& name, const harness::BackendCapabilities& caps,
                                       const char* flag) {
  if (name.empty()) return std::nullopt;
  if (is_model_fault(name) && caps.backend == "model") return name;
  if (caps.fault(name)) return name;
  std::string known;
  for (const auto& f : caps.faults) known += (known.empty() ? "" : ", ") + f.name;
  throw InputError(std::string(flag) + ": the " + caps.backend + " backend has no fault '" + name + "'; its faults: " +
                   (known.empty() ? "none" : known) + " (gradfuzz list faults --backend " + caps.backend + ")");
}

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
  if (f.usage != "on" && f.usage != "off") throw InputError("--usage: expected on or off, got '" + f.usage + "'");
  o.usage = f.usage == "on";
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
  sub.add_option("--usage", f.usage,
                 "on: cases draw the usage script (optimizer steps, eval passes, checkpoint round trips, recompute, "
                 "held outputs) where the backend runs it; off: none")
      ->default_str("on");
}

void add_known_flags(CLI::App& sub, Flags& f) {
  sub.add_option("--known", f.known,
                 "known-issues file: matching findings are reported as known, not shrunk, and do not fail the run");
  sub.add_flag("--fail-on-known", f.fail_on_known, "with --known: known findings make exit status 1 too");
}

void add_backend_flags(CLI::App& sub, Flags& f, bool with_workers) {
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

}  // namespace gradfuzz::tools::detail
