#include "tools/bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <memory>
#include <ostream>

#include "campaign/files.h"
#include "harness/builder.h"
#include "harness/dtype.h"
#include "ops/fusion_registry.h"
#include "ops/reference.h"
#include "oracle/tolerances.h"

namespace gradfuzz::tools {

using campaign::campaign_case;
using campaign::CampaignOptions;
using campaign::CampaignOutcome;
using campaign::inflight_case_text;
using campaign::InflightFile;
using campaign::make_temp_dir;
using campaign::remove_tree;
using campaign::run_campaign;

namespace {

using Clock = std::chrono::steady_clock;

class NullReporter final : public reports::Reporter {
 public:
  void report_context(const reports::ReportContext&) override {}
  void report_case(const reports::CaseRecord&) override {}
  void finalize(const reports::RunSummary&) override {}
};

void synchronize(const at::Device& device) {
  if (device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device.index() < 0 ? 0 : device.index());
}

/// Everything a case needs that is not part of the floor: shapes and drawn tensors.
struct PreparedCase {
  const harness::CaseSpec* spec = nullptr;
  harness::CasePlan plan;
  harness::CaseTensors tensors;
};

bool prepare(const harness::CaseSpec& spec, PreparedCase& out) {
  try {
    out.spec = &spec;
    out.plan = harness::plan_case(spec);
    harness::BuildOptions probe_build;
    probe_build.call_then_bind = false;
    harness::BuiltCase probe;
    harness::create_ops(spec, out.plan, nullptr, probe_build, probe);
    at::Generator generator = at::detail::createCPUGenerator(spec.seed);
    out.tensors = harness::draw_case_tensors(spec, out.plan, harness::param_shapes(probe.ops), generator);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

/// Gradient of sum_i <outputs_i, cotangents_i> w.r.t. every leaf that requires grad, as the
/// harness computes it (no scalar loss).
void backward(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& cotangents,
              const std::vector<at::Tensor>& leaves) {
  std::vector<at::Tensor> outs;
  std::vector<at::Tensor> cots;
  for (size_t i = 0; i < outputs.size() && i < cotangents.size(); ++i) {
    const at::Tensor& out = outputs[i];
    if (!out.defined() || !cotangents[i].defined() || !out.is_floating_point() || !out.requires_grad()) continue;
    if (out.sizes() != cotangents[i].sizes()) continue;
    outs.push_back(out);
    cots.push_back(cotangents[i].to(out.options()));
  }
  if (outs.empty() || leaves.empty()) return;
  torch::autograd::grad(outs, leaves, cots, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
}

std::vector<at::Tensor> grad_leaves(const at::Tensor& input, const std::vector<at::Tensor>& extras,
                                    const std::vector<std::vector<at::Tensor>>& params) {
  std::vector<at::Tensor> leaves;
  if (input.requires_grad()) leaves.push_back(input);
  for (const auto& op_params : params) {
    for (const auto& p : op_params) {
      if (p.requires_grad()) leaves.push_back(p);
    }
  }
  for (const auto& e : extras) {
    if (e.defined() && e.requires_grad()) leaves.push_back(e);
  }
  return leaves;
}

/// Runs one case's fused and reference paths, adding to `times`.
void run_floor_case(const PreparedCase& c, FloorTimes& times) {
  const harness::CaseSpec& spec = *c.spec;
  const at::ScalarType dtype = harness::scalar_type_from_name(spec.dtype);
  const at::Device device = spec.device == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  try {
    {
      // Fused path.
      auto t0 = Clock::now();
      harness::BuildOptions build;
      build.dtype = dtype;
      build.device = device;
      build.fusions = ops::FusionRegistry::catalog().only(spec.fusions);
      harness::BuiltCase built;
      harness::create_ops(spec, c.plan, &c.tensors, build, built);
      harness::build_case(spec, c.plan, c.tensors, build, built);
      synchronize(device);
      auto t1 = Clock::now();
      const auto options = at::TensorOptions().dtype(dtype).device(device);
      std::vector<std::vector<at::Tensor>> params;
      for (const auto& op : built.ops) {
        if (op) params.push_back(op->parameters());
      }
      // The first call and the case's repeat calls, each with its own input tensor.
      std::vector<harness::RepeatCall> calls{{false, spec.input_requires_grad}};
      calls.insert(calls.end(), spec.repeat_calls.begin(), spec.repeat_calls.end());
      for (const harness::RepeatCall& call : calls) {
        at::Tensor input = c.tensors.input.to(options, false, true).requires_grad_(call.input_requires_grad);
        std::vector<at::Tensor> extras =
            harness::to_path(c.tensors.extra_inputs, c.tensors.extra_input_requires_grad, options);
        if (call.no_grad) {
          at::NoGradGuard no_grad;
          built.sequential->forward(input, extras);
          continue;
        }
        auto outputs = built.sequential->forward(input, extras);
        backward(outputs, c.tensors.cotangents, grad_leaves(input, extras, params));
      }
      synchronize(device);
      auto t2 = Clock::now();
      times.build_s += std::chrono::duration<double>(t1 - t0).count();
      times.forward_backward_s += std::chrono::duration<double>(t2 - t1).count();
    }
    {
      // Reference path (float64 CPU, no call-then-bind), as runner::run_case builds it.
      auto t0 = Clock::now();
      harness::BuildOptions build;
      build.call_then_bind = false;
      harness::BuiltCase built;
      harness::create_ops(spec, c.plan, &c.tensors, build, built);
      harness::build_case(spec, c.plan, c.tensors, build, built);
      auto t1 = Clock::now();
      const auto options = at::TensorOptions().dtype(at::kDouble).device(at::kCPU);
      at::Tensor input = c.tensors.input.to(options, false, true).requires_grad_(spec.input_requires_grad);
      std::vector<at::Tensor> extras =
          harness::to_path(c.tensors.extra_inputs, c.tensors.extra_input_requires_grad, options);
      ops::ReferenceEvaluator evaluator(*built.sequential);
      evaluator.forward(input, extras);
      evaluator.backward(c.tensors.cotangents);
      auto t2 = Clock::now();
      times.build_s += std::chrono::duration<double>(t1 - t0).count();
      times.forward_backward_s += std::chrono::duration<double>(t2 - t1).count();
    }
  } catch (const std::exception& e) {
    if (times.errors++ == 0) times.first_error = e.what();
  }
}

}  // namespace

FloorTimes measure_floor(const std::vector<harness::CaseSpec>& specs) {
  oracle::disable_tf32();
  std::vector<PreparedCase> prepared(specs.size());
  std::vector<bool> ok(specs.size(), false);
  for (size_t i = 0; i < specs.size(); ++i) ok[i] = prepare(specs[i], prepared[i]);
  FloorTimes times;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!ok[i]) continue;
    ++times.cases;
    const int64_t errors_before = times.errors;
    run_floor_case(prepared[i], times);
    if (errors_before == 0 && times.errors > 0) times.first_error_case = static_cast<int64_t>(i);
  }
  return times;
}

BenchOutcome run_bench(CampaignOptions options) {
  const int64_t cases = options.cases.value_or(kDefaultBenchCases);
  options.cases = cases;
  options.time_s.reset();
  options.shrink = false;
  options.stop_at_first_finding = false;
  const std::filesystem::path dir = make_temp_dir("gradfuzz-bench-");
  options.corpus_dir = dir;

  BenchOutcome outcome;
  std::vector<harness::CaseSpec> specs;
  specs.reserve(static_cast<size_t>(cases));
  auto t0 = Clock::now();
  for (int64_t i = 0; i < cases; ++i) specs.push_back(campaign_case(options, i));
  outcome.generation_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // Warm-up: lazy initialisation (catalogs, allocator, autograd engine threads) is not timed.
  NullReporter null_reporter;
  {
    CampaignOptions warm = options;
    warm.cases = std::min<int64_t>(cases, 5);
    run_campaign(warm, null_reporter, nullptr);
  }

  // Campaign and floor alternate kBenchRepeats times and each keeps its fastest run: on a
  // shared 2-core machine the other load only ever adds time, so the minimum is the least
  // disturbed estimate of either cost.
  for (int repeat = 0; repeat < kBenchRepeats; ++repeat) {
    const CampaignOutcome campaign = run_campaign(options, null_reporter, nullptr);
    if (repeat == 0 || campaign.wall_s < outcome.campaign_s) {
      outcome.cases = campaign.cases_run;
      outcome.failed = campaign.failed;
      outcome.campaign_s = campaign.wall_s;
    }
    FloorTimes floor = measure_floor(specs);
    if (repeat == 0 || floor.total_s() < outcome.floor.total_s()) outcome.floor = floor;
  }

  t0 = Clock::now();
  {
    InflightFile inflight(dir / "io" / "inflight.json");
    for (const auto& spec : specs) inflight.write(inflight_case_text(spec, options.seed, std::nullopt));
    inflight.remove();
  }
  outcome.io_s = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  for (const auto& spec : specs) {
    try {
      const harness::CaseResult result = runner::run_case(spec, options.run_options);
      for (const auto& [name, counts] : result.kernels) {
        outcome.kernel_launches[name][0] += counts[0];
        outcome.kernel_launches[name][1] += counts[1];
      }
    } catch (const std::exception&) {
      // Counted by the campaign above (which would have stopped); the time still counts.
    }
  }
  outcome.run_case_s = std::chrono::duration<double>(Clock::now() - t0).count();
  remove_tree(dir);
  return outcome;
}

namespace {

harness::CaseSpec scaling_case(int64_t rows, int64_t features, const std::string& device, const std::string& dtype) {
  auto make = [](std::string name, ops::OpAttrs attrs) {
    harness::OpSpec op;
    op.name = std::move(name);
    op.attrs = std::move(attrs);
    return op;
  };
  harness::CaseSpec spec;
  harness::OpSpec producer = make("MakeExtraOutput", {});
  producer.output_bindings = {harness::OutputBindingSpec{std::string("r"), false}};
  harness::OpSpec consumer = make("AddExtraInput", {});
  consumer.input_channels = {std::string("r")};
  spec.ops = {producer, make("Linear", {{"out", static_cast<double>(features)}}), make("Bias", {}), make("GELU", {}),
              consumer};
  spec.fusions = ops::FusionRegistry::catalog().names();
  spec.input_shape = {rows, features};
  spec.dtype = dtype;
  spec.device = device;
  spec.seed = 1;
  return spec;
}

}  // namespace

std::vector<ScalingRow> run_shape_scaling(const std::string& device, const std::string& dtype, int64_t max_elements,
                                          const runner::RunOptions& run_options) {
  oracle::disable_tf32();
  std::vector<ScalingRow> rows;
  for (int64_t n = 100; n <= max_elements; n *= 10) {
    ScalingRow row;
    // Features grow as sqrt(n) up to 256 (a Linear's cost is rows * features^2), rows take
    // the rest.
    int64_t f = 8;
    while (f * 2 <= 256 && f * 2 * f * 2 <= n) f *= 2;
    row.features = f;
    row.rows = std::max<int64_t>(1, n / f);
    row.elements = row.rows * row.features;
    const harness::CaseSpec spec = scaling_case(row.rows, row.features, device, dtype);
    // Small cases repeat to rise above the clock's noise; each keeps its fastest run.
    row.repeats = n <= 100000 ? 20 : n <= 1000000 ? 3 : 1;
    runner::run_case(spec, run_options);  // warm-up: allocator, lazy init
    for (int r = 0; r < row.repeats; ++r) {
      auto t0 = Clock::now();
      const harness::CaseResult result = runner::run_case(spec, run_options);
      synchronize(device == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU));
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r == 0 || s < row.case_s) row.case_s = s;
      row.verdict = harness::verdict_name(result.verdict);
      const FloorTimes floor = measure_floor({spec});
      if (r == 0 || floor.total_s() < row.floor_s) row.floor_s = floor.total_s();
    }
    rows.push_back(row);
  }
  return rows;
}

void print_scaling(const std::vector<ScalingRow>& rows, std::ostream& out) {
  out << "elements   rows x features   ms/case   floor ms   ns/element   harness/floor   verdict\n";
  for (const auto& r : rows) {
    out << std::setw(9) << r.elements << "  " << std::setw(8) << r.rows << " x " << std::setw(4) << r.features << "   "
        << std::fixed << std::setprecision(3) << std::setw(8) << r.case_s * 1e3 << "   " << std::setw(8)
        << r.floor_s * 1e3 << "   " << std::setprecision(1) << std::setw(10)
        << r.case_s * 1e9 / static_cast<double>(r.elements) << "   " << std::setprecision(2) << std::setw(13)
        << (r.floor_s > 0 ? r.case_s / r.floor_s : 0.0) << "   " << r.verdict << '\n'
        << std::defaultfloat;
  }
}

void print_bench(const BenchOutcome& o, std::ostream& out) {
  out << std::fixed << std::setprecision(3);
  out << "cases                    " << o.cases << " (" << o.failed << " failed)\n";
  out << "campaign                 " << o.campaign_s << " s  " << o.campaign_cases_per_s() << " cases/s\n";
  out << "floor (fused+reference)  " << o.floor.total_s() << " s  " << o.floor_cases_per_s() << " cases/s"
      << "  (build " << o.floor.build_s << " s, forward+backward " << o.floor.forward_backward_s << " s";
  if (o.floor.errors) out << ", " << o.floor.errors << " cases raised";
  out << ")\n";
  if (o.floor.errors) {
    // The campaign's invalid configurations (one case in kInvalidCaseEvery) raise while
    // building, as intended; the floor counts that build time only.
    out << "first floor error        case " << o.floor.first_error_case << ": " << o.floor.first_error << '\n';
  }
  out << "  of which (separately)  generation " << o.generation_s << " s, case-file I/O " << o.io_s << " s, run_case "
      << o.run_case_s << " s\n";
  out << "overhead                 " << o.overhead() << "x  (campaign_time / floor_time)\n";
  if (o.kernel_launches.empty()) {
    out << "kernel launches          none (no hand-written CUDA kernel ran)\n";
  }
  for (const auto& [name, counts] : o.kernel_launches) {
    out << "kernel launches          " << name << ": " << counts[0] << " ("
        << static_cast<double>(counts[0]) / static_cast<double>(std::max<int64_t>(o.cases, 1)) << " per case), "
        << counts[1] << " with more than one block\n";
  }
  out << std::defaultfloat;
}

}  // namespace gradfuzz::tools
