#pragma once

// The flags of the `gradfuzz` subcommands (tools/cli.cc): their raw values, their checks and
// their conversion to the options of the campaign engine. Internal to gradfuzz_cli.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "campaign/campaign.h"
#include "campaign/sanitizer.h"
#include "harness/capabilities.h"
#include "runner/run_options.h"
#include "tools/report_tool.h"

namespace CLI {
class App;
}  // namespace CLI

namespace gradfuzz::tools::detail {

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
  /// --usage on|off: the usage script's elements drawn or not.
  std::string usage = "on";
  // Distributed cases: ranks per case (0: one-process cases) and, for a worker, the device
  // its rank processes run on (empty: the campaign's).
  std::string world_size_text;
  int64_t world_size = 0;
  std::string rank_device;
};

/// Fills the numeric flags from their text (only those given); InputError naming the option
/// for a number that does not fit.
void parse_numbers(Flags& f);

/// The backend of --backend and its flags; InputError for a value out of range.
backends::BackendOptions backend_options(const Flags& f);

/// compute-sanitizer settings of --sanitize TOOL: logs beside the corpus (or in $TMPDIR).
campaign::SanitizerOptions sanitizer_options(const Flags& f);

/// --overlap as the run options take it; auto: the evidence drawn ahead for CUDA cases where
/// each worker and its adapter have a core of their own, else the reference only. Drawing
/// ahead is CPU a passing case does not need: with the adapter's work on the GPU it is free
/// (one te worker on the H200: 7.5-8.2 ms less a case under an FP8 recipe, docs/BENCHMARKS.md),
/// with a CPU adapter sharing the cores it slows the adapter down.
runner::RunOptions::Overlap resolve_overlap(const Flags& f);

/// Checks a --fault name against the model's faults and the backend's planted ones.
std::optional<std::string> check_fault(const std::string& name, const harness::BackendCapabilities& caps,
                                       const char* flag = "--fault");

/// `all` means every fault this run can see: for the model, the oob-write fault only under
/// `--sanitize memcheck` on CUDA, the process-killing faults only with worker processes; for
/// te and torch, the adapter's planted faults.
std::vector<std::string> parse_fault_list(const std::string& list, const harness::BackendCapabilities& caps,
                                          bool sanitized, bool workers, std::vector<std::string>* too_many_ranks);

/// Checks --recipe against what the backend runs.
void check_recipe(const std::string& recipe, const harness::BackendCapabilities& caps);

/// The known-issues file of --known (null without one).
std::shared_ptr<const campaign::KnownIssues> load_known(const Flags& f);

/// Checks --dtypes: at least one, each a known dtype.
void check_dtypes(const std::vector<std::string>& dtypes);

/// The campaign options of the flags `sub` registered (fuzz, selftest, bench).
campaign::CampaignOptions campaign_options(const Flags& f, const CLI::App& sub);

/// --seed, --device, --dtypes, --max-ops, --shapes, --max-tensor-elements, --recipe.
void add_campaign_flags(CLI::App& sub, Flags& f);
/// --known and --fail-on-known.
void add_known_flags(CLI::App& sub, Flags& f);
/// --backend and how it runs (with_workers: --workers, --devices, --sanitize, --mps too).
void add_backend_flags(CLI::App& sub, Flags& f, bool with_workers = true);

}  // namespace gradfuzz::tools::detail
