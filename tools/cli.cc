#include "tools/cli.h"

#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "backends/backend.h"
#include "campaign/environment.h"
#include "campaign/exit_codes.h"
#include "corpus/case_file.h"
#include "harness/capabilities.h"
#include "ops/faults.h"
#include "ops/fusion_registry.h"
#include "ops/op_registry.h"
#include "tools/bench.h"
#include "tools/campaign_commands.h"
#include "tools/cli_flags.h"
#include "tools/export_command.h"
#include "tools/known_tool.h"
#include "tools/report_tool.h"

namespace gradfuzz::tools {

using campaign::CampaignOptions;
using campaign::ExitCode;
using campaign::InputError;
using campaign::InternalError;
using campaign::resolve_device;
using detail::add_backend_flags;
using detail::add_campaign_flags;
using detail::add_known_flags;
using detail::backend_options;
using detail::campaign_options;
using detail::check_dtypes;
using detail::cmd_export;
using detail::cmd_fuzz;
using detail::cmd_replay;
using detail::cmd_selftest;
using detail::cmd_worker;
using detail::export_upstream_test;
using detail::Flags;
using detail::parse_numbers;

namespace {

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
  fuzz->add_option("--report", f.report, "write the JSON report here")->check(empty_name_error, "FILE");
  fuzz->add_flag("--quiet", f.quiet, "print nothing but errors");
  add_backend_flags(*fuzz, f);
  fuzz->add_option("--max-shrink-calls", f.max_shrink_calls_text, "cap on the runs one shrink may make (default 2000)");
  fuzz->add_option("--case-log", f.case_log, "write one JSON line per case (number, verdict, signature, spec)")
      ->check(empty_name_error, "FILE");
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
  replay->add_option("--report", f.report, "write the JSON report here")->check(empty_name_error, "FILE");
  add_ci_output_flags(*replay, f.ci);
  add_backend_flags(*replay, f);

  CLI::App* selftest = app.add_subcommand("selftest", "check that the default campaign finds every known fault");
  selftest->add_option("--faults", f.faults, "comma-separated fault names or 'all'")->default_str("all");
  selftest->add_option("--cases", f.cases_text, "case budget per fault (default 2000)");
  selftest->add_option("--report", f.report, "write the JSON report here")->check(empty_name_error, "FILE");
  add_ci_output_flags(*selftest, f.ci);
  add_campaign_flags(*selftest, f);
  selftest->add_option("--corpus", f.corpus, "where found cases are saved (default gradfuzz-out/selftest)");
  selftest->add_option("--max-shrink-calls", f.max_shrink_calls_text,
                       "cap on the runs one shrink may make (default 2000; a slow backend's stage may want fewer)");
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
        return export_upstream_test(f, cluster, target, test, export_notes);
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
