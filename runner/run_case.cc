#include "runner/run_case.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#include "backends/model_backend.h"
#include "harness/dtype.h"
#include "ops/cuda/launch_stats.h"
#include "ops/errors.h"
#include "ops/reference.h"
#include "oracle/tolerances.h"

namespace gradfuzz::runner {

using backends::BackendCrash;
using backends::BackendTimeout;
using backends::ModelBackend;
using oracle::all_finite;
using oracle::case_tolerance;
using oracle::check_caller_tensors;
using oracle::check_finite_differences;
using oracle::compare_paths;
using oracle::compare_plans;
using oracle::Comparer;
using oracle::disable_tf32;
using oracle::expected_for_call;
using oracle::path_pair_tolerance;
using oracle::rounding_errors;
using oracle::Tolerance;
using oracle::ToleranceContext;

using harness::build_case;
using harness::build_stage_name;
using harness::BuildOptions;
using harness::BuildStage;
using harness::check_static_wiring;
using harness::create_ops;
using harness::describe_error;
using harness::draw_case_tensors;
using harness::kBoundaryOp;
using harness::OpPlan;
using harness::OpSpec;
using harness::param_shapes;
using harness::plan_case;
using harness::run_guarded;
using harness::scalar_type_from_name;
using harness::to_path;
using harness::verdict_name;

namespace {

/// Whether a repeat call of `spec` takes the main input's gradient.
bool repeat_wants_input_grad(const CaseSpec& spec) {
  return std::any_of(spec.repeat_calls.begin(), spec.repeat_calls.end(),
                     [](const RepeatCall& c) { return !c.no_grad && c.input_requires_grad; });
}

/// The float64 reference path (or, with another compute dtype, the rounding baseline): the
/// catalog's reference math under plain autograd, on the CPU, over the ops in `built`.
PathRun run_reference_path(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors, BuiltCase& built,
                           at::ScalarType compute_dtype = at::kDouble, at::Device device = at::kCPU) {
  PathRun run;
  run.name = compute_dtype == at::kDouble ? "reference" : "rounding_baseline";
  BuildOptions build;
  build.call_then_bind = false;
  run_guarded(run, [&] {
    try {
      build_case(spec, plan, tensors, build, built);
    } catch (...) {
      run.error_stage = build_stage_name(built.stage);
      throw;
    }
    run.error_stage = "forward";
    const auto options = at::TensorOptions().dtype(at::kDouble).device(at::kCPU);
    at::Tensor input = tensors.input.to(options, false, true).requires_grad_(spec.input_requires_grad);
    std::vector<at::Tensor> extras = to_path(tensors.extra_inputs, tensors.extra_input_requires_grad, options);
    ops::ReferenceEvaluator evaluator(*built.sequential, compute_dtype, device);
    run.outputs = evaluator.forward(input, extras);
    run.error_stage = "backward";
    ops::ReferenceGradients grads = evaluator.backward(tensors.cotangents);
    run.grad_input = grads.grad_input;
    run.grad_params.resize(spec.ops.size());
    for (size_t i = 0; i < plan.ops.size(); ++i) {
      const int64_t ordinal = plan.ops[i].ordinal;
      if (ordinal >= 0 && ordinal < static_cast<int64_t>(grads.grad_params.size())) {
        run.grad_params[i] = grads.grad_params[static_cast<size_t>(ordinal)];
      }
    }
    run.grad_extra_inputs = grads.grad_extra_inputs;
    run.channel_grads = grads.channel_grads;
  });
  if (!run.ok() && built.stage == BuildStage::kConstruct) {
    for (size_t i = 0; i < built.ops.size(); ++i) {
      const bool before = i < built.locked_before_construct.size() && built.locked_before_construct[i];
      if (built.ops[i] && built.ops[i]->locked() && !before) run.left_locked.push_back(static_cast<int64_t>(i));
    }
  }
  return run;
}

/// Cases with more elements than this evaluate the float64 reference on their GPU: a float64
/// CPU evaluation of a [4096, 4096] matmul chain takes seconds, the GPU's a millisecond.
constexpr int64_t kReferenceOnDeviceElements = int64_t{1} << 16;

/// Where the reference of `spec` computes: the CPU, unless the case runs on CUDA and is big.
at::Device reference_device(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors) {
  if (spec.device != "cuda" || !at::hasCUDA()) return at::kCPU;
  int64_t elements = tensors.input.numel();
  for (const auto& op : tensors.params) {
    for (const auto& p : op) elements += p.numel();
  }
  for (const auto& op : plan.ops) {
    int64_t n = 1;
    for (int64_t d : op.signature.output_shape) n *= d;
    elements += n;
  }
  return elements > kReferenceOnDeviceElements ? at::Device(at::kCUDA) : at::Device(at::kCPU);
}

/// Writes the case's parameter values into a build's ops.
void copy_param_values(const CaseTensors& tensors, BuiltCase& built) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < built.ops.size(); ++i) {
    if (!built.ops[i]) continue;
    auto params = built.ops[i]->parameters();
    for (size_t j = 0; j < params.size() && j < tensors.params[i].size(); ++j) params[j].copy_(tensors.params[i][j]);
  }
}

/// Float64 CPU ops of the reference path holding the case's parameter values.
BuiltCase reference_ops_with_values(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors) {
  BuildOptions build;
  build.call_then_bind = false;
  BuiltCase built;
  create_ops(spec, plan, nullptr, build, built);
  copy_param_values(tensors, built);
  return built;
}

/// Whether two error outcomes agree: both ran, or both raised the same kind. A remote
/// backend's error it could not map to a runtime kind ("unrecognized") agrees with any.
bool errors_agree(const PathRun& run, const PathRun& reference) {
  if (run.ok() != reference.ok()) return false;
  if (run.ok()) return true;
  return run.error_kind == reference.error_kind || run.error_kind == "unrecognized";
}

/// Fused groups that fired, per pass, and the same_fusion_channel feature.
void add_plan_coverage(const CaseSpec& spec, const PathRun& fused, CaseResult& result) {
  std::set<std::string> fired;
  std::set<std::string> forward;
  std::set<std::string> backward;
  // Channel -> producer spec index and consumer spec indices (channels are per fuser, and a
  // fused group never spans fusers, so a name seen inside one group is unambiguous there).
  std::multimap<std::string, int64_t> producers;
  std::multimap<std::string, int64_t> consumers;
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    for (const auto& b : spec.ops[i].output_bindings) {
      if (b.channel) producers.emplace(*b.channel, static_cast<int64_t>(i));
    }
    for (const auto& c : spec.ops[i].input_channels) {
      if (c) consumers.emplace(*c, static_cast<int64_t>(i));
    }
  }
  bool same_fusion = false;
  for (const auto& fuser : fused.plans) {
    for (const auto* pass : {&fuser.forward, &fuser.backward}) {
      for (const auto& group : *pass) {
        if (!group.fused) continue;
        if (fired.insert(group.name).second) result.fusions_fired.push_back(group.name);
        auto& per_pass = pass == &fuser.forward ? forward : backward;
        if (per_pass.insert(group.name).second) {
          (pass == &fuser.forward ? result.fused_forward : result.fused_backward).push_back(group.name);
        }
        for (const auto& [channel, consumer] : consumers) {
          if (consumer < group.begin || consumer >= group.end) continue;
          auto [lo, hi] = producers.equal_range(channel);
          for (auto it = lo; it != hi; ++it) {
            if (it->second >= group.begin && it->second < consumer) same_fusion = true;
          }
        }
      }
    }
  }
  if (same_fusion) result.features.emplace_back("same_fusion_channel");
}

/// Names of the case's fusions registered for `pass` in `caps`.
std::set<std::string> fusions_of_pass(const BackendCapabilities& caps, ops::FusionPass pass) {
  std::set<std::string> out;
  for (const auto& f : caps.fusions) {
    if (f.pass == pass) out.insert(f.name);
  }
  return out;
}

bool fired_any_of(const PathRun& run, const std::set<std::string>& names) {
  for (const auto& fuser : run.plans) {
    for (const auto* pass : {&fuser.forward, &fuser.backward}) {
      for (const auto& g : *pass) {
        if (g.fused && names.count(g.name)) return true;
      }
    }
  }
  return false;
}

std::vector<std::string> without(const std::vector<std::string>& all, const std::set<std::string>& drop) {
  std::vector<std::string> out;
  for (const auto& f : all) {
    if (!drop.count(f)) out.push_back(f);
  }
  return out;
}

/// The widest dtype the backend runs (float64, else float32), or nullopt when it has neither.
std::optional<std::string> widest_dtype(const BackendCapabilities& caps) {
  for (const char* d : {"float64", "float32"}) {
    if (std::find(caps.dtypes.begin(), caps.dtypes.end(), d) != caps.dtypes.end()) return std::string(d);
  }
  return std::nullopt;
}

int dtype_rank(const std::string& dtype) {
  if (dtype == "float64") return 3;
  if (dtype == "float32") return 2;
  return 1;
}

/// A low-precision detail that no rounding explains once every path has passed in the widest
/// dtype on the same values: a non-finite value where the reference is finite, unless the
/// dtype itself overflows on this case (the rounding baseline was not finite either).
/// Finite differences are not judged by size there: the soaks of the repaired runtime showed
/// them at about one case in 3000 in bfloat16/float16 (a ReLU pre-activation rounding to the
/// other side of its kink in one path, gradients that cancel to nearly zero after a norm,
/// with errors well past the tensor's magnitude), and no size rule separated those from a
/// defect; a defect in the code shows in the widest dtype as well and is confirmed there.
bool gross(const TensorMismatch& d, bool dtype_overflows) {
  if (d.kind != VerdictKind::kMismatch) return true;
  return !std::isfinite(d.max_abs_err) && !dtype_overflows;
}

}  // namespace

std::vector<std::string> static_features(const CaseSpec& spec, const CasePlan& plan) {
  bool bound_input = false;
  bool public_input = false;
  bool mixed = false;
  bool hidden = false;
  bool public_bound = false;
  bool fresh = false;
  bool generator = false;
  bool boundary = false;
  bool scale_bias = false;
  bool no_grad_input = !spec.input_requires_grad;
  std::map<std::pair<int64_t, std::string>, int64_t> consumers;  // (fuser, channel) -> count
  std::map<std::pair<int64_t, std::string>, std::pair<std::string, int64_t>> producers;
  std::map<int64_t, bool> fuser_seen_bound;
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const OpSpec& op = spec.ops[i];
    const OpPlan& op_plan = plan.ops[i];
    if (op_plan.boundary) {
      boundary = true;
      continue;
    }
    const size_t n_in = op_plan.signature.extra_inputs.size();
    bool op_bound = false;
    bool op_public = false;
    for (size_t s = 0; s < n_in; ++s) {
      const bool bound = s < op.input_channels.size() && op.input_channels[s].has_value();
      if (bound) {
        op_bound = true;
        ++consumers[{op_plan.fuser, *op.input_channels[s]}];
        fuser_seen_bound[op_plan.fuser] = true;
      } else {
        op_public = true;
        // A public slot after a bound one in (op, slot) order: bound-first matching differs.
        if (fuser_seen_bound[op_plan.fuser]) mixed = true;
        const bool floating = op_plan.signature.extra_inputs[s].kind == ops::TensorKind::kFloat;
        if (floating && s < op.extra_input_requires_grad.size() && !op.extra_input_requires_grad[s]) {
          no_grad_input = true;
        }
      }
    }
    bound_input = bound_input || op_bound;
    public_input = public_input || op_public;
    if (op_bound && op_public) mixed = true;
    for (size_t s = 0; s < op.output_bindings.size() && s < op_plan.signature.extra_outputs.size(); ++s) {
      const auto& binding = op.output_bindings[s];
      if (!binding.channel) continue;
      (binding.output_to_caller ? public_bound : hidden) = true;
      producers[{op_plan.fuser, *binding.channel}] = {op.name, static_cast<int64_t>(s)};
    }
    if (op.output_style == ops::OutputStyle::kGenerator && (n_in > 0 || !op_plan.signature.extra_outputs.empty())) {
      generator = true;
    }
    if (op.name == "GroupedLinear") {
      auto it = op.attrs.find("scale_bias");
      if (it != op.attrs.end() && it->second != 0) scale_bias = true;
    }
  }
  bool fanout = false;
  for (const auto& [key, count] : consumers) {
    if (count >= 2) fanout = true;
    auto it = producers.find(key);
    if (it == producers.end()) continue;
    const auto& [type, slot] = it->second;
    // Fresh-tensor producers: Dispatch's token probs (slot 1) and RowStat's statistic.
    if ((type == "Dispatch" && slot == 1) || type == "RowStat") fresh = true;
  }
  std::vector<std::string> features;
  auto add = [&](bool on, const char* name) {
    if (on) features.emplace_back(name);
  };
  add(bound_input, "bound_input");
  add(public_input, "public_input");
  add(mixed, "mixed_slot_order");
  add(hidden, "hidden_output");
  add(public_bound, "public_bound_output");
  add(fanout, "fanout");
  add(fresh, "fresh_producer");
  add(generator, "generator_outputs");
  add(!spec.call_then_bind.empty(), "call_then_bind");
  add(boundary, "fuser_boundary");
  add(scale_bias, "scale_bias");
  add(no_grad_input, "no_grad_input");
  add(!spec.repeat_calls.empty(), "repeat_calls");
  add(std::any_of(spec.repeat_calls.begin(), spec.repeat_calls.end(), [](const RepeatCall& c) { return c.no_grad; }),
      "no_grad_call");
  return features;
}
bool intends_error(const CaseSpec& spec) {
  return spec.extra_input_count_delta != 0 || spec.corrupt_split_sizes || !spec.late_binds.empty() ||
         check_static_wiring(spec).has_value();
}

PreparedCase prepare_case(const CaseSpec& spec) {
  PreparedCase prepared;
  prepared.plan = plan_case(spec);
  BuildOptions build;
  build.call_then_bind = false;
  create_ops(spec, prepared.plan, nullptr, build, prepared.reference_ops);
  prepared.generator = at::detail::createCPUGenerator(spec.seed);
  prepared.tensors =
      draw_case_tensors(spec, prepared.plan, param_shapes(prepared.reference_ops.ops), prepared.generator);
  copy_param_values(prepared.tensors, prepared.reference_ops);
  return prepared;
}

std::optional<std::string> reference_error_kind(const CaseSpec& spec) {
  PathRun probe;
  PreparedCase prepared;
  run_guarded(probe, [&] { prepared = prepare_case(spec); });
  if (!probe.ok()) return probe.error_kind;
  const PathRun reference = run_reference_path(spec, prepared.plan, prepared.tensors, prepared.reference_ops);
  if (!reference.ok()) return reference.error_kind;
  return std::nullopt;
}

CaseResult run_case(const CaseSpec& spec, const RunOptions& options) {
  thread_local ModelBackend model;
  return run_case(spec, model, options);
}

namespace {
CaseResult run_case_impl(const CaseSpec& spec, Backend& backend, const RunOptions& options);
}  // namespace

CaseResult run_case(const CaseSpec& spec, Backend& backend, const RunOptions& options) {
  const auto before = ops::cuda::kernel_launches();
  CaseResult result = run_case_impl(spec, backend, options);
  for (const auto& [name, after] : ops::cuda::kernel_launches()) {
    auto it = before.find(name);
    const int64_t launches = after.launches - (it == before.end() ? 0 : it->second.launches);
    const int64_t multi = after.multi_block - (it == before.end() ? 0 : it->second.multi_block);
    if (launches > 0) result.kernels[name] = {launches, multi};
  }
  return result;
}

namespace {

CaseResult run_case_impl(const CaseSpec& spec, Backend& backend, const RunOptions& options) {
  disable_tf32();
  CaseResult result;
  result.seed = spec.seed;
  result.backend = backend.name();
  for (const auto& op : spec.ops) {
    if (op.name != kBoundaryOp) result.op_types.push_back(op.name);
  }
  const at::ScalarType dtype = scalar_type_from_name(spec.dtype);
  if (spec.device == "cuda" && backend.name() == "model" && !at::hasCUDA()) {
    throw std::invalid_argument("case needs device cuda, but this process has no CUDA device");
  }

  // Shapes and op creation are the same computation in every path (the catalog's signature
  // and factory), so an error there is every path's error: an invalid case that passes.
  PreparedCase prepared;
  {
    PathRun probe;
    probe.name = "every path";
    run_guarded(probe, [&] {
      probe.error_stage = "op creation";
      prepared = prepare_case(spec);
    });
    if (!probe.ok()) {
      result.error_detail = "every path raised " + probe.error_kind + " during op creation: " + probe.error_message;
      return result;
    }
  }
  const CasePlan& plan = prepared.plan;
  const CaseTensors& tensors = prepared.tensors;
  BuiltCase& reference_ops = prepared.reference_ops;
  at::Generator& generator = prepared.generator;
  result.features = static_features(spec, plan);

  // The backend's paths. A crash or time-out is the whole case's verdict.
  std::vector<PathRequest> requests{{"fused", spec.fusions, false}};
  if (options.run_unfused) requests.push_back({"unfused", {}, true});
  std::vector<PathRun> runs;
  auto run_backend = [&](const CaseSpec& s, const std::vector<PathRequest>& r) -> bool {
    try {
      runs = backend.run_paths(s, plan, tensors, r);
      return true;
    } catch (const BackendCrash& e) {
      result.verdict = VerdictKind::kCrash;
      result.error_detail = e.what();
    } catch (const BackendTimeout& e) {
      result.verdict = VerdictKind::kTimeout;
      result.error_detail = e.what();
    }
    result.error_kinds = verdict_name(result.verdict);
    return false;
  };
  if (!spec.repeat_calls.empty() && !backend.capabilities().repeat_calls) {
    result.verdict = VerdictKind::kUnsupported;
    result.error_detail = "the " + backend.name() + " backend does not run repeat_calls";
    return result;
  }
  if (!run_backend(spec, requests)) return result;
  const BackendCapabilities& caps = backend.capabilities();
  std::vector<PathRequest> single_pass;  // the single-pass paths, when they ran
  if (options.single_pass_paths && !runs.empty() && runs.front().ok()) {
    // A fused path that ran forward-only and backward-only fused ops together: each pass's
    // fusions alone form two more configurations, neither the fused nor the unfused one.
    const auto forward_only = fusions_of_pass(caps, ops::FusionPass::kForward);
    const auto backward_only = fusions_of_pass(caps, ops::FusionPass::kBackward);
    if (fired_any_of(runs.front(), forward_only) && fired_any_of(runs.front(), backward_only)) {
      single_pass = {{"forward_fused", without(spec.fusions, backward_only), false},
                     {"backward_fused", without(spec.fusions, forward_only), false}};
      std::vector<PathRun> first = std::move(runs);
      if (!run_backend(spec, single_pass)) return result;
      for (auto& r : runs) first.push_back(std::move(r));
      runs = std::move(first);
    }
  }
  std::vector<const PathRun*> active;
  for (const auto& r : runs) {
    if (r.status != PathStatus::kSkipped) active.push_back(&r);
  }
  add_plan_coverage(spec, runs.front(), result);
  for (const PathRun* run : active) {
    if (run->status == PathStatus::kUnsupported) {
      result.verdict = VerdictKind::kUnsupported;
      result.error_detail = run->name + " declined the case: " + run->error_message;
      return result;
    }
  }

  const at::Device ref_device = reference_device(spec, plan, tensors);
  PathRun reference = run_reference_path(spec, plan, tensors, reference_ops, at::kDouble, ref_device);
  // A repeat call whose input requires grad when the first call's does not: the input's
  // gradient from a second reference run with it (a channel whose value then requires grad
  // has a gradient in that run that the first call must not be judged on, so the first
  // reference stays as it is).
  at::Tensor repeat_grad_input = reference.grad_input;
  if (reference.ok() && !spec.input_requires_grad && repeat_wants_input_grad(spec)) {
    CaseSpec with_input_grad = spec;
    with_input_grad.input_requires_grad = true;
    BuiltCase input_grad_ops;
    PathRun creation;
    run_guarded(creation, [&] { input_grad_ops = reference_ops_with_values(spec, plan, tensors); });
    if (creation.ok()) {
      const PathRun run = run_reference_path(with_input_grad, plan, tensors, input_grad_ops, at::kDouble, ref_device);
      if (run.ok()) repeat_grad_input = run.grad_input;
    }
  }

  // Errors: every path must agree with the reference on whether and what it raised, and a
  // failed construction must leave no op locked.
  bool any_error = !reference.ok();
  bool agree = true;
  std::vector<std::string> lock_problems;
  std::vector<const PathRun*> all = active;
  all.push_back(&reference);
  for (const PathRun* run : all) {
    if (!run->ok()) any_error = true;
    if (!errors_agree(*run, reference)) agree = false;
    for (int64_t op : run->left_locked) {
      lock_problems.push_back(run->name + ": failed " + run->error_stage + " left op " + std::to_string(op) + " (" +
                              spec.ops[static_cast<size_t>(op)].name + ") locked");
    }
  }
  if (any_error || !lock_problems.empty()) {
    std::string kinds;
    std::string detail;
    for (const PathRun* run : all) {
      kinds += (kinds.empty() ? "" : " ") + run->name + "=" + (run->ok() ? "none" : run->error_kind);
      detail += (detail.empty() ? "" : "; ") + (run->ok() ? run->name + " passed" : describe_error(*run));
    }
    for (const auto& problem : lock_problems) detail += "; " + problem;
    result.error_detail = detail;
    // Agreeing errors are the expected outcome only for a case that asks for one; a case
    // that is valid by construction and raises everywhere is a runtime bug that would
    // otherwise hide as a pass.
    if (!agree || !lock_problems.empty() || !intends_error(spec)) {
      result.verdict = VerdictKind::kUnexpectedError;
      result.error_kinds = kinds;
      if (agree && lock_problems.empty()) result.error_detail = "a valid case raised in every path: " + detail;
    }
    return result;
  }
  if (intends_error(spec)) {
    // Validation is shared code: a regression there lets an invalid configuration through
    // every path alike, which no comparison between them can see.
    result.verdict = VerdictKind::kUnexpectedError;
    result.error_kinds = "no path raised";
    result.error_detail = "an invalid configuration raised in no path (reference included)";
    return result;
  }

  // Every path ran: compare.
  std::vector<std::string> notes;
  const ToleranceContext context{spec.num_ops(), plan.max_reduction_length};
  const bool all_channels = backend.name() != "te";
  auto compare_runs = [&](const std::vector<const PathRun*>& paths, const Tolerance& tolerance,
                          const Tolerance& pair_tolerance, const PathRun* rounding) {
    std::vector<TensorMismatch> details;
    Comparer comparer(details, notes, options.allowance);
    const PathRun* unfused = nullptr;
    for (const PathRun* run : paths) {
      compare_paths(run->name + "~reference", spec, reference, *run, tolerance, comparer, rounding, all_channels);
      check_caller_tensors(*run, details);
      if (run->name == "unfused") unfused = run;
      for (size_t k = 0; k < run->repeats.size() && k < spec.repeat_calls.size(); ++k) {
        const PathRun& repeat = run->repeats[k];
        compare_paths(repeat.name + "~reference", spec,
                      expected_for_call(reference, repeat_grad_input, spec.repeat_calls[k]), repeat, tolerance,
                      comparer, rounding, all_channels);
        check_caller_tensors(repeat, details);
        compare_plans(repeat, details, notes);
      }
    }
    if (unfused && options.compare_fused_unfused && paths.front() != unfused) {
      compare_paths(paths.front()->name + "~unfused", spec, *unfused, *paths.front(), pair_tolerance, comparer,
                    rounding, all_channels);
    }
    return details;
  };
  result.details = compare_runs(active, case_tolerance(dtype, context), path_pair_tolerance(dtype, context), nullptr);
  bool dtype_overflows = false;
  if (!result.details.empty() && dtype != at::kDouble) {
    // What the dtype itself costs this case, per element: the plain-autograd reference run
    // in the case's dtype. Only failing cases pay for this second reference run.
    BuiltCase baseline_ops;
    PathRun creation;
    run_guarded(creation, [&] { baseline_ops = reference_ops_with_values(spec, plan, tensors); });
    if (creation.ok()) {
      PathRun baseline = run_reference_path(spec, plan, tensors, baseline_ops, dtype, ref_device);
      dtype_overflows = baseline.ok() && !all_finite(baseline);
      if (baseline.ok()) {
        const PathRun rounding = rounding_errors(reference, baseline);
        notes.clear();
        result.details =
            compare_runs(active, case_tolerance(dtype, context), path_pair_tolerance(dtype, context), &rounding);
      }
    }
  }
  const auto wide = widest_dtype(caps);
  const bool structural = std::any_of(result.details.begin(), result.details.end(),
                                      [](const TensorMismatch& d) { return d.kind != VerdictKind::kMismatch; });
  if (!result.details.empty() && !structural && options.confirm_in_wide_dtype && wide &&
      dtype_rank(*wide) > dtype_rank(spec.dtype)) {
    // Confirm in the widest dtype with the very same values (exact in the wider type).
    CaseSpec wide_spec = spec;
    wide_spec.dtype = *wide;
    std::vector<PathRun> narrow_runs = std::move(runs);
    // The same paths as the case ran, single-pass ones included.
    if (!run_backend(wide_spec, requests)) return result;
    if (!single_pass.empty()) {
      std::vector<PathRun> first = std::move(runs);
      if (!run_backend(wide_spec, single_pass)) return result;
      for (auto& r : runs) first.push_back(std::move(r));
      runs = std::move(first);
    }
    std::vector<const PathRun*> wide_active;
    for (const auto& r : runs) {
      if (r.status == PathStatus::kOk) wide_active.push_back(&r);
    }
    const at::ScalarType wide_type = scalar_type_from_name(*wide);
    std::vector<std::string> narrow_notes = notes;
    notes.clear();
    const auto wide_details = wide_active.size() == active.size()
                                  ? compare_runs(wide_active, case_tolerance(wide_type, context),
                                                 path_pair_tolerance(wide_type, context), nullptr)
                                  : std::vector<TensorMismatch>{};
    notes = std::move(narrow_notes);
    if (wide_active.size() != active.size()) {
      notes.push_back("the " + *wide + " confirmation run raised; " + spec.dtype + " details kept");
    } else if (!wide_details.empty()) {
      notes.push_back("confirmed in " + *wide + " on the same values");
    } else {
      std::vector<TensorMismatch> kept;
      for (const auto& d : result.details) {
        if (gross(d, dtype_overflows)) kept.push_back(d);
      }
      if (kept.empty()) {
        notes.push_back(spec.dtype + " differences only (rounding): every path passes in " + *wide +
                        " on the same values");
        result.features.emplace_back("precision_only_difference");
      } else {
        notes.push_back("passes in " + *wide + ", but some " + spec.dtype +
                        " values are not finite where the reference's are");
      }
      result.details = std::move(kept);
    }
    runs = std::move(narrow_runs);
  }
  if (options.finite_differences && dtype == at::kDouble) {
    try {
      check_finite_differences(spec, tensors, reference, reference_ops, options.finite_difference, generator,
                               result.details, notes);
    } catch (const Error& e) {
      notes.push_back(std::string("finite differences: reference forward raised ") + e.what());
    } catch (const c10::Error& e) {
      notes.push_back(std::string("finite differences: reference forward raised ") + e.what_without_backtrace());
    }
  }
  for (const auto& note : notes) result.error_detail += (result.error_detail.empty() ? "" : "; ") + note;
  if (!result.details.empty()) {
    auto has = [&](VerdictKind kind) {
      return std::any_of(result.details.begin(), result.details.end(),
                         [&](const TensorMismatch& d) { return d.kind == kind; });
    };
    result.verdict = has(VerdictKind::kMissingGradient) ? VerdictKind::kMissingGradient
                     : has(VerdictKind::kModifiedInput) ? VerdictKind::kModifiedInput
                                                        : VerdictKind::kMismatch;
  }
  return result;
}

}  // namespace

}  // namespace gradfuzz::runner
