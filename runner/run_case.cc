#include "runner/run_case.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include "backends/model_backend.h"
#include "harness/dtype.h"
#include "harness/sharding.h"
#include "ops/cuda/launch_stats.h"
#include "ops/errors.h"
#include "ops/quantization.h"
#include "ops/reference.h"
#include "oracle/divergence.h"
#include "oracle/rounding.h"
#include "oracle/signature.h"
#include "oracle/tolerances.h"
#include "runner/case_cost.h"
#include "runner/quantization_points.h"

namespace gradfuzz::runner {

using backends::BackendCrash;
using backends::BackendTimeout;
using backends::ModelBackend;
using oracle::case_tolerance;
using oracle::check_caller_tensors;
using oracle::check_finite_differences;
using oracle::compare_paths;
using oracle::compare_plans;
using oracle::disable_tf32;
using oracle::expected_for_call;
using oracle::path_pair_tolerance;
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
                           at::ScalarType compute_dtype = at::kDouble, at::Device device = at::kCPU,
                           ops::KinkProbe* probe = nullptr, ops::ReferenceQuantization* quantization = nullptr,
                           bool no_grad = false, double noise_relative = 0, at::Generator* noise_generator = nullptr,
                           bool trace = false) {
  PathRun run;
  run.name = compute_dtype == at::kDouble ? "reference" : "rounding_baseline";
  BuildOptions build;
  build.call_then_bind = false;
  run_guarded(run, [&] {
    // The unsharded math has no ranks to split over: what te.ops refuses on the case's
    // world (an indivisible split) the reference refuses alike, at the same step.
    if (const auto refused = harness::parallel_config_error(spec, plan)) {
      run.error_stage = refused->at_construction ? "op creation" : "forward";
      throw ops::InvalidArgumentError(refused->message);
    }
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
    evaluator.set_kink_probe(probe);
    evaluator.set_quantization(quantization);
    evaluator.set_output_noise(noise_relative, noise_generator);
    evaluator.set_trace(trace);
    if (no_grad) {
      // A no_grad call of the Sequential: its values only (delayed scaling records amaxes).
      at::NoGradGuard guard;
      run.outputs = evaluator.forward(input, extras);
      return;
    }
    run.outputs = evaluator.forward(input, extras);
    // Every basic op is its own group of the reference's trace, with its extras.
    using Extras = std::map<std::pair<int64_t, int64_t>, at::Tensor>;
    auto trace_entry = [&](const char* pass, int64_t op, const at::Tensor& t, const Extras& op_extras) {
      harness::TraceEntry e;
      e.pass = pass;
      e.fuser = op < static_cast<int64_t>(plan.ops.size()) ? plan.ops[op].fuser : 0;
      e.group = {spec.ops.at(op).name, op, op + 1, false};
      e.impl_class = "reference";
      e.method = pass;
      e.tensor = t;
      for (auto it = op_extras.lower_bound({op, 0}); it != op_extras.end() && it->first.first == op; ++it) {
        e.extras.push_back({op, it->first.second, it->second, false});
      }
      run.trace.push_back(std::move(e));
    };
    std::set<int64_t> forward_ops;
    for (const auto& [op, out] : evaluator.op_outputs()) forward_ops.insert(op);
    for (const auto& [slot, out] : evaluator.op_extra_outputs()) forward_ops.insert(slot.first);
    for (int64_t op : forward_ops) {
      const auto out = evaluator.op_outputs().find(op);
      trace_entry("forward", op, out == evaluator.op_outputs().end() ? at::Tensor() : out->second,
                  evaluator.op_extra_outputs());
    }
    run.error_stage = "backward";
    ops::ReferenceGradients grads = evaluator.backward(tensors.cotangents);
    std::set<int64_t> backward_ops;
    for (const auto& [op, grad] : grads.grad_op_inputs) backward_ops.insert(op);
    for (const auto& [slot, grad] : grads.grad_op_extra_inputs) backward_ops.insert(slot.first);
    for (auto it = backward_ops.rbegin(); it != backward_ops.rend(); ++it) {
      const auto grad = grads.grad_op_inputs.find(*it);
      trace_entry("backward", *it, grad == grads.grad_op_inputs.end() ? at::Tensor() : grad->second,
                  grads.grad_op_extra_inputs);
    }
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
const char* overlap_name(RunOptions::Overlap overlap) {
  switch (overlap) {
    case RunOptions::Overlap::kNone:
      return "none";
    case RunOptions::Overlap::kReference:
      return "reference";
    case RunOptions::Overlap::kEvidence:
      return "evidence";
  }
  return "evidence";
}

RunOptions::Overlap overlap_from_name(const std::string& name) {
  for (const auto o : {RunOptions::Overlap::kNone, RunOptions::Overlap::kReference, RunOptions::Overlap::kEvidence}) {
    if (name == overlap_name(o)) return o;
  }
  throw std::invalid_argument("expected none, reference or evidence, got '" + name + "'");
}

bool intends_error(const CaseSpec& spec) {
  if (spec.extra_input_count_delta != 0 || spec.corrupt_split_sizes || !spec.late_binds.empty() ||
      check_static_wiring(spec).has_value()) {
    return true;
  }
  if (spec.world_size <= 1) return false;
  try {
    return harness::parallel_config_error(spec, plan_case(spec)).has_value();
  } catch (const std::exception&) {
    return false;  // shapes that do not propagate: every path's op-creation error
  }
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
struct EvidenceCarry;
CaseResult run_case_impl(const CaseSpec& spec, Backend& backend, const RunOptions& options,
                         const EvidenceCarry* carried_evidence = nullptr);
}  // namespace

CaseResult run_case(const CaseSpec& spec, Backend& backend, const RunOptions& options) {
  const auto before = ops::cuda::kernel_launches();
  CaseCostRecorder cost(case_cost_enabled());
  CaseResult result = run_case_impl(spec, backend, options);
  if (case_cost_enabled()) log_case_cost(spec, result, cost.finish());
  for (const auto& [name, after] : ops::cuda::kernel_launches()) {
    auto it = before.find(name);
    const int64_t launches = after.launches - (it == before.end() ? 0 : it->second.launches);
    const int64_t multi = after.multi_block - (it == before.end() ? 0 : it->second.multi_block);
    if (launches > 0) result.kernels[name] = {launches, multi};
  }
  return result;
}

namespace {

/// One float64 reference of a case and what the oracle measures around it, for the paths
/// whose quantization points (ops::QuantizationPoints, runner/quantization_points.h) it
/// evaluates with: the basic ops' for the unfused path; a fused path whose plans show a fused
/// op quantizing elsewhere (BackwardLinearScale under a recipe) gets its own.
struct ReferenceSet {
  ops::QuantizationPoints points;
  PathRun reference;
  ops::KinkProbe reference_kinks;
  std::vector<ops::KinkProbe::Site> baseline_kinks;
  at::Tensor repeat_grad_input;
  /// The float64 reference with the input requiring grad, when evidence_spec_ asks for it.
  std::optional<PathRun> evidence_reference;
  /// The quantization state of the reference's calls in order (delayed scaling: call k's
  /// scales come from calls 1..k-1), and per repeat call its own reference run.
  std::unique_ptr<ops::ReferenceQuantization> call_quantization;
  std::vector<PathRun> repeat_references;
  /// Per quantization of a reference evaluation: the jitter window (set_fp8_windows).
  std::vector<at::Tensor> fp8_windows;
  std::vector<at::Tensor> fp8_reference;
  oracle::RoundingEvidence evidence;
  /// The evidence of repeat_call_bounds, once drawn.
  std::optional<oracle::RoundingEvidence> coarse_evidence;
};

/// What a case's low-precision evidence stage gathered, handed to the in-place ablation's
/// rerun of the same values (attribute_in_place_stage) so that it does not draw the same
/// samples again. The rerun differs only in its ops' in_place options, which the float64
/// reference does not see: where its reference sets have the same quantization points, in the
/// same order, and the same reference values, the parent's samples are the ones it would draw.
/// It starts at the parent's last round (`rounds`) and draws further rounds from the
/// generators' saved states. Its findings are those of its own evidence because an allowance
/// only grows with samples (oracle::evidence_bounds: maxima over samples): a round the rerun
/// would have stopped at earlier (no finding left) has none with more samples either.
struct EvidenceCarry {
  struct Set {
    ops::QuantizationPoints points;
    /// The values the evidence was measured against (evidence_reference, by name).
    std::map<std::string, at::Tensor> reference;
    oracle::RoundingEvidence evidence;
    std::optional<oracle::RoundingEvidence> coarse_evidence;
    std::vector<ops::KinkProbe::Site> baseline_kinks;
    std::vector<at::Tensor> fp8_windows;
    std::vector<at::Tensor> fp8_reference;
  };
  std::vector<Set> sets;
  at::Generator sample_generator;
  at::Generator noise_generator;
  /// The last round the parent compared with (0: the first samples; kEvidenceRounds - 1: all).
  int rounds = -1;
};

/// The rounding samples each round of the evidence adds (judge_values): the first two come
/// with gather_evidence.
constexpr int64_t kEvidenceSamples[] = {0, 6, 8};
constexpr int kEvidenceRounds = 3;

/// gather_evidence's progress on one reference set, a piece (about one reference evaluation)
/// at a time: the rounding baseline, the FP8 windows' float64 reference and accumulation
/// runs, the two first rounding samples, the kink groups (CaseRun::gather_piece).
struct Gathering {
  enum class Step { kBaseline, kFp8Reference, kAccumulation, kWindows, kSamples, kKinks, kDone };
  Step step = Step::kBaseline;
  ops::KinkProbe probe;
  PathRun baseline;
  std::vector<at::Tensor> baseline_scaled;
  std::vector<at::Tensor> reference_scaled;
  std::vector<std::vector<at::Tensor>> accumulated;
  /// The FP8 windows can be set (set_fp8_windows: a backend whose FP8 is the reference's,
  /// runs that match).
  bool windows = false;
  int samples = 0;
  oracle::KinkGroups kinks;
  size_t group = 0;
  /// The result once done: false where the baseline raised.
  bool ok = true;
};

/// The low-precision evidence of the basic ops' reference set drawn ahead, while a remote
/// backend runs the case's paths (RunOptions::Overlap::kEvidence): what judge_values would
/// draw next, in its order, kept apart until it asks for it. Its rounds and the repeat calls'
/// coarse evidence draw from copies of the generators and keep the generators' states after
/// them, so that a run that never asks (the first check passed, the ablation's carry) sees
/// the generators as they were, and one that does continues exactly where they left off.
/// Used only while the case has that one reference set (another set's evidence comes
/// between them in judge_values' order): the gathering, which starts the generators afresh,
/// holds either way.
struct Speculation {
  /// The basic ops' set's gathering, begun ahead; its result once done.
  Gathering gathering;
  bool begun = false;
  std::optional<bool> gathered;
  at::Generator sample_generator;
  at::Generator noise_generator;
  /// repeat_call_bounds' coarse evidence, and the sample generator after it.
  std::optional<oracle::RoundingEvidence> coarse;
  at::Generator after_coarse;
  /// Per evidence round (index as kEvidenceSamples): the samples drawn ahead, their maxima,
  /// and the generators' states after them.
  struct Round {
    int64_t taken = 0;
    std::map<std::string, at::Tensor> sensitivity;
    std::map<std::string, at::Tensor> output_noise;
    at::Generator sample_after;
    at::Generator noise_after;
  };
  std::array<Round, kEvidenceRounds> rounds;
};

/// One case through its stages (run_case's contract). Each stage adds its findings to
/// result_; the paths, the reference and the bounds it judges by are members so that the
/// stages read in order.
class CaseRun {
 public:
  CaseRun(const CaseSpec& spec, Backend& backend, const RunOptions& options,
          const EvidenceCarry* carried_evidence = nullptr)
      : spec_(spec),
        backend_(backend),
        options_(options),
        dtype_(harness::scalar_type_from_name(spec.dtype)),
        trace_(options.trace && !harness::is_distributed(spec)),
        carried_evidence_(carried_evidence) {
    sets_.push_back(std::make_unique<ReferenceSet>());
    ref_ = sets_.front().get();
    result_.seed = spec.seed;
    result_.backend = backend.name();
    for (const auto& op : spec.ops) {
      if (op.name != harness::kBoundaryOp) result_.op_types.push_back(op.name);
    }
  }

  /// The bounds judge_values would hold the paths to once the first check failed, and the
  /// reference's values where a script needs them; for each path of `paths` with quantization
  /// points of its own, the same of its reference set (set_expectation).
  Expectation expectation(const std::vector<PathRequest>& paths) {
    disable_tf32();
    Expectation out;
    if (!prepare()) return out;
    plan_path_sets(paths);
    run_reference();
    if (!ref_->reference.ok()) return out;
    out.quantized = quantizes_;
    // The reference's own values go with a quantizing case (a script cannot recompute the FP8
    // reference) and with a distributed one (its script compares the ranks' results, put
    // together, with them).
    PathExpectation basic = set_expectation(quantizes_ || harness::is_distributed(spec_));
    out.bounds = std::move(basic.bounds);
    out.expected = std::move(basic.expected);
    out.repeat_expected = std::move(basic.repeat_expected);
    for (const PathRequest& path : paths) {
      const size_t index = set_index(path.name);
      if (index == 0 || !sets_.at(index)->reference.ok()) continue;
      ref_ = sets_[index].get();
      PathExpectation own = set_expectation(/*values=*/true);
      own.points = ref_->points.describe();
      ref_ = sets_.front().get();
      if (own.bounds) out.paths[path.name] = std::move(own);
    }
    return out;
  }

  /// The expectation of the reference set `ref_`: its bounds (the first check's for float64
  /// or where the evidence cannot be gathered, else the low-precision rule's with its
  /// evidence) and, with `values`, exactly the tensors judge_values compares each call with,
  /// on the CPU.
  PathExpectation set_expectation(bool values) {
    PathExpectation out;
    const auto expected = oracle::tensors_by_name(evidence_spec_, evidence_reference());
    out.bounds = dtype_ == at::kDouble || !gather_evidence()
                     ? oracle::first_bounds(dtype_, context_, expected, options_.rounding)
                     : oracle::evidence_bounds(dtype_, context_, expected, ref_->evidence, options_.rounding);
    if (!values) return out;
    auto on_cpu = [](std::map<std::string, at::Tensor> tensors) {
      for (auto& [name, t] : tensors) {
        if (t.defined()) t = t.detach().cpu();
      }
      return tensors;
    };
    out.expected = on_cpu(oracle::tensors_by_name(spec_, ref_->reference));
    for (size_t k = 0; k < spec_.repeat_calls.size(); ++k) {
      const bool own = k < ref_->repeat_references.size() && ref_->repeat_references[k].ok();
      const PathRun call = own ? expected_for_call(ref_->repeat_references[k], ref_->repeat_references[k].grad_input,
                                                   spec_.repeat_calls[k])
                               : expected_for_call(ref_->reference, ref_->repeat_grad_input, spec_.repeat_calls[k]);
      out.repeat_expected.push_back(on_cpu(oracle::tensors_by_name(spec_, call)));
    }
    return out;
  }

  /// The reference sets of the paths a script runs, without running the target
  /// (judging_expectation): under a recipe, each path with fusions runs its first call on
  /// backend_ (the model: its fuser plans as te.ops' does, unquantized), and its fused groups
  /// give its quantization points as a run's do in replay (assign_reference_sets). A path
  /// the model cannot run keeps the basic ops' reference.
  void plan_path_sets(const std::vector<PathRequest>& paths) {
    if (!recipe_ || harness::is_distributed(spec_)) return;
    std::vector<PathRequest> requests;
    for (const PathRequest& path : paths) {
      if (path.fusions.empty()) continue;  // no fused op: the basic ops' points
      PathRequest r{path.name, path.fusions, false};
      r.writers = harness::WriterSearch::kNone;
      r.expected_plans = harness::ExpectedPlans::kNone;
      requests.push_back(std::move(r));
    }
    if (requests.empty()) return;
    CaseSpec first_call = spec_;  // the points come from the first call's plans
    first_call.repeat_calls.clear();
    try {
      runs_ = backend_.run_paths(first_call, prepared_.plan, prepared_.tensors, requests);
    } catch (const BackendCrash&) {
      return;
    } catch (const BackendTimeout&) {
      return;
    }
    for (const auto& r : runs_) {
      if (r.ok()) active_.push_back(&r);
    }
    assign_reference_sets();
  }

  CaseResult run() {
    disable_tf32();
    if (spec_.device == "cuda" && backend_.name() == "model" && !at::hasCUDA()) {
      throw std::invalid_argument("case needs device cuda, but this process has no CUDA device");
    }
    if (!prepare()) return std::move(result_);
    if (spec_.world_size > backend_.capabilities().max_world_size) {
      result_.verdict = VerdictKind::kUnsupported;
      result_.notes = "the " + backend_.name() + " backend runs at most " +
                      std::to_string(backend_.capabilities().max_world_size) + " rank(s) here; the case has " +
                      std::to_string(spec_.world_size);
      return std::move(result_);
    }
    if (!spec_.repeat_calls.empty() && !backend_.capabilities().repeat_calls) {
      result_.verdict = VerdictKind::kUnsupported;
      result_.notes = "the " + backend_.name() + " backend does not run repeat_calls";
      return std::move(result_);
    }
    if (spec_.recipe) {
      const auto recipes = backend_.capabilities().available_recipes();
      const bool runs = std::any_of(recipes.begin(), recipes.end(),
                                    [&](const harness::RecipeCapability* r) { return r->name == spec_.recipe->name; });
      if (!runs) {
        result_.verdict = VerdictKind::kUnsupported;
        result_.notes = "the " + backend_.name() + " backend runs no " + spec_.recipe->name + " recipe here";
        return std::move(result_);
      }
    }
    bool ran = false;
    {
      CostStage stage("paths");
      ran = run_paths();
    }
    if (!ran) return finish();
    for (const PathRun* run : active_) {
      if (run->status == PathStatus::kUnsupported) {
        result_.verdict = VerdictKind::kUnsupported;
        result_.notes = run->name + " declined the case: " + run->error_message;
        return std::move(result_);
      }
    }
    {
      CostStage stage("reference");
      run_reference();
    }
    {
      CostStage stage("judge");
      judge_errors();
      if (ref_->reference.ok()) judge_values();
      judge_replicas();
    }
    {
      CostStage stage("finite_differences");
      check_finite_differences_stage();
    }
    {
      CostStage stage("confirm");
      confirm_in_wide_dtype();
    }
    {
      CostStage stage("ablation");
      attribute_in_place_stage();
    }
    {
      CostStage stage("localise");
      localise_stage();
    }
    CostStage stage("signatures");
    return finish();
  }

 private:
  // ---- prepare: shapes, op creation and values are the same computation in every path (the
  // catalog's signatures and factories), so an error there is every path's error.
  bool prepare() {
    PathRun probe;
    probe.name = "every path";
    run_guarded(probe, [&] {
      probe.error_stage = "op creation";
      prepared_ = prepare_case(spec_);
    });
    if (!probe.ok()) {
      result_.notes = "every path raised " + probe.error_kind + " during op creation: " + probe.error_message;
      return false;
    }
    result_.features = static_features(spec_, prepared_.plan);
    context_ = {spec_.num_ops(), prepared_.plan.max_reduction_length};
    if (harness::is_distributed(spec_)) {
      // A case whose layouts do not compose is not a distributed case at all: the caller's
      // input error (case files are checked when loaded, generated cases are built valid).
      try {
        sharding_ = harness::plan_sharding(spec_, prepared_.plan);
      } catch (const harness::SpecError& e) {
        throw std::invalid_argument(std::string("not a valid distributed case: ") + e.what());
      }
      result_.features.emplace_back("distributed");
      result_.features.emplace_back("world_size_" + std::to_string(spec_.world_size));
    }
    if (spec_.recipe) {
      PathRun parse;
      run_guarded(parse, [&] {
        recipe_ = ops::QuantRecipe::parse(spec_.recipe->name, spec_.recipe->fp8_format, spec_.recipe->options);
      });
      if (!parse.ok()) {
        result_.notes = "every path raised " + parse.error_kind + " reading the recipe: " + parse.error_message;
        return false;
      }
      result_.features.emplace_back("recipe");
    }
    quantizes_ = recipe_.has_value() || std::any_of(spec_.ops.begin(), spec_.ops.end(), [](const harness::OpSpec& op) {
                   auto it = op.attrs.find("cache_quantized_input");
                   return it != op.attrs.end() && it->second == 1;
                 });
    return true;
  }

  /// A fresh quantization state for one reference evaluation (null when the case quantizes
  /// nothing); with `jitter`, each quantized element moved by one FP8 value with
  /// probability 1/2 (the oracle's estimate of what one FP8 ulp per element costs).
  std::unique_ptr<ops::ReferenceQuantization> fresh_quantization(
      at::Generator* jitter = nullptr, std::vector<at::Tensor>* record = nullptr,
      ops::AccumulationMode accumulation = ops::AccumulationMode::kExact) const {
    if (!quantizes_) return nullptr;
    auto q = recipe_ ? std::make_unique<ops::ReferenceQuantization>(*recipe_)
                     : std::make_unique<ops::ReferenceQuantization>();
    // The quantization points of the paths this reference is for (empty: the basic ops').
    q->set_points(ref_->points);
    // Windowed (gather_evidence): only elements that a rounding difference can carry across
    // an FP8 rounding boundary move.
    if (jitter) q->set_jitter(0.5, *jitter, ref_->fp8_reference, ref_->fp8_windows);
    if (record) q->record_scaled(record);
    // On a backend whose FP8 GEMMs accumulate inexactly, a sample's GEMMs also err by their
    // accumulation term, up or down at random (set_fp8_windows asks for `accumulation`).
    if (const auto model = gemm_accumulation()) {
      if (jitter) {
        q->set_accumulation(*model, ops::AccumulationMode::kRandomSign, *jitter);
      } else if (accumulation != ops::AccumulationMode::kExact) {
        q->set_accumulation(*model, accumulation);
      }
    }
    return q;
  }

  /// The backend's FP8 GEMM accumulation under the case's recipe (capabilities.
  /// fp8_gemm_accumulation: the GEMMs it lists for the recipe accumulate fast), or nullopt
  /// where the backend's GEMMs are exact or the case has no recipe.
  std::optional<ops::Fp8GemmAccumulation> gemm_accumulation() const {
    const auto& declared = backend_.capabilities().fp8_gemm_accumulation;
    if (!declared || !recipe_) return std::nullopt;
    ops::Fp8GemmAccumulation model;
    model.fraction_bits = declared->fraction_bits;
    model.products_per_step = declared->products_per_step;
    model.promotion_products = declared->promotion_products;
    const auto fast = declared->fast_accumulation.find(recipe_->name());
    if (fast != declared->fast_accumulation.end()) {
      for (const std::string& gemm : fast->second) {
        model.fast.push_back(gemm == "fprop"   ? ops::Fp8Gemm::kFprop
                             : gemm == "dgrad" ? ops::Fp8Gemm::kDgrad
                                               : ops::Fp8Gemm::kWgrad);
      }
    }
    return model;
  }

  // ---- run the paths: fused, unfused (skipped when nothing fused), and each pass's fusions
  // alone when the fused path ran forward-only and backward-only fused ops together.
  bool run_backend(const CaseSpec& s, const std::vector<PathRequest>& requests, std::vector<PathRun>& into,
                   bool overlap = false) {
    CostStage stage("backend");
    try {
      std::vector<PathRun> runs;
      if (overlap && options_.overlap != RunOptions::Overlap::kNone) {
        const std::unique_ptr<backends::PendingPaths> pending =
            backend_.start_paths(s, prepared_.plan, prepared_.tensors, requests);
        overlap_with_paths(*pending);
        runs = pending->get();
      } else {
        runs = backend_.run_paths(s, prepared_.plan, prepared_.tensors, requests);
      }
      count_request(requests, runs);
      for (auto& r : runs) into.push_back(std::move(r));
      return true;
    } catch (const BackendCrash& e) {
      add_process_finding(VerdictKind::kCrash, e.what());
    } catch (const BackendTimeout& e) {
      add_process_finding(VerdictKind::kTimeout, e.what());
    }
    return false;
  }

  /// The case cost's counts of one backend request (runner/case_cost.h): the paths it ran,
  /// their repeat calls, the fresh Sequentials a fused path's repeat calls are planned
  /// against, and the paths watched for the writer of a changed caller tensor or run a
  /// second time to find it (modified_by), as the request asked the backend to.
  void count_request(const std::vector<PathRequest>& requests, const std::vector<PathRun>& runs) const {
    if (!case_cost_recording()) return;
    count_cost("requests");
    for (size_t i = 0; i < runs.size() && i < requests.size(); ++i) {
      const PathRun& run = runs[i];
      const PathRequest& request = requests[i];
      if (run.status == PathStatus::kSkipped) continue;
      count_cost("path:" + run.name);
      count_cost("repeat_calls", static_cast<int64_t>(run.repeats.size()));
      if (!request.fusions.empty() && request.expected_plans == harness::ExpectedPlans::kPerCall) {
        count_cost("fresh_plans", static_cast<int64_t>(run.repeats.size()));
      } else if (!request.fusions.empty() && request.expected_plans == harness::ExpectedPlans::kPerPattern) {
        std::set<std::pair<bool, bool>> patterns;
        for (size_t k = 0; k < run.repeats.size() && k < spec_.repeat_calls.size(); ++k) {
          const RepeatCall& call = spec_.repeat_calls[k];
          if (call.no_grad || call.input_requires_grad != spec_.input_requires_grad) {
            patterns.insert({call.no_grad, call.input_requires_grad});
          }
        }
        count_cost("fresh_plans", static_cast<int64_t>(patterns.size()));
      }
      if (request.writers == harness::WriterSearch::kDuringRun) count_cost("watched_paths");
      if (request.writers == harness::WriterSearch::kRerun && !run.modified.empty()) count_cost("writer_runs");
    }
  }

  void add_process_finding(VerdictKind kind, const std::string& what) {
    Finding f;
    f.kind = kind;
    f.path_pair = "every path";
    f.tensor = harness::verdict_name(kind);
    f.role = harness::verdict_name(kind);
    f.message = what;
    result_.findings.push_back(std::move(f));
    result_.notes = what;
  }

  /// A path of the case as options_ asks for it (how writers and expected plans are found).
  /// Watching a path's own first call costs every plan group of every path a comparison of
  /// the caller's tensors; a second run costs a path's time, but only where a tensor changed:
  /// ops that write in place (in_place=1) make that likely, so those cases are watched.
  PathRequest path_request(std::string name, std::vector<std::string> fusions, bool skip_if_nothing_fused) const {
    PathRequest r{std::move(name), std::move(fusions), skip_if_nothing_fused};
    const bool writes_in_place = std::any_of(spec_.ops.begin(), spec_.ops.end(), [](const OpSpec& op) {
      const auto it = op.attrs.find("in_place");
      return it != op.attrs.end() && it->second == 1;
    });
    r.writers = !options_.find_writers                    ? harness::WriterSearch::kNone
                : options_.shared_runs && writes_in_place ? harness::WriterSearch::kDuringRun
                                                          : harness::WriterSearch::kRerun;
    r.expected_plans = !options_.check_plans  ? harness::ExpectedPlans::kNone
                       : options_.shared_runs ? harness::ExpectedPlans::kPerPattern
                                              : harness::ExpectedPlans::kPerCall;
    r.trace = trace_;
    return r;
  }

  std::vector<PathRequest> path_requests() const {
    std::vector<PathRequest> requests{path_request("fused", spec_.fusions, false)};
    if (options_.run_unfused) requests.push_back(path_request("unfused", {}, true));
    return requests;
  }

  bool run_paths() {
    requests_ = path_requests();
    const BackendCapabilities& caps = backend_.capabilities();
    const auto forward_only = fusions_of_pass(caps, ops::FusionPass::kForward);
    const auto backward_only = fusions_of_pass(caps, ops::FusionPass::kBackward);
    std::vector<PathRequest> single_pass;
    if (options_.single_pass_paths) {
      single_pass = {path_request("forward_fused", without(spec_.fusions, backward_only), false),
                     path_request("backward_fused", without(spec_.fusions, forward_only), false)};
    }
    const bool one_request = options_.shared_runs && !single_pass.empty() && !forward_only.empty() &&
                             !backward_only.empty() && !requests_.empty();
    if (one_request) {
      // The single-pass paths in the same request, run only where the fused path fires a
      // forward-only and a backward-only fusion (what the second request would be sent for).
      std::vector<PathRequest> all = requests_;
      for (PathRequest r : single_pass) {
        r.only_if_fired = {{forward_only.begin(), forward_only.end()}, {backward_only.begin(), backward_only.end()}};
        all.push_back(std::move(r));
      }
      if (!run_backend(spec_, all, runs_, /*overlap=*/true)) return false;
      if (runs_.size() == all.size() && runs_[requests_.size()].status != PathStatus::kSkipped) {
        single_pass_ = single_pass;  // what ran, for the confirmation's rerun
      }
    } else {
      if (!run_backend(spec_, requests_, runs_, /*overlap=*/true)) return false;
      if (!single_pass.empty() && !runs_.empty() && runs_.front().ok() && fired_any_of(runs_.front(), forward_only) &&
          fired_any_of(runs_.front(), backward_only)) {
        single_pass_ = single_pass;
        if (!run_backend(spec_, single_pass_, runs_)) return false;
      }
    }
    for (const auto& r : runs_) {
      if (r.status != PathStatus::kSkipped) active_.push_back(&r);
    }
    add_plan_coverage(spec_, runs_.front(), result_);
    assign_reference_sets();
    return true;
  }

  /// While a remote backend runs the case's first request (RunOptions::overlap): the basic
  /// ops' float64 reference, which does not depend on the paths, and then the low-precision
  /// evidence judge_values would draw for it, piece by piece until the answer is there
  /// (Speculation). Nothing where the backend ran the paths when asked.
  void overlap_with_paths(backends::PendingPaths& pending) {
    if (pending.ready()) return;
    CostStage stage("overlap");
    const auto start = std::chrono::steady_clock::now();
    reference_of_first_set();
    // A piece costs about what the reference did: where that is more than a piece may
    // overrun the answer by (a large case), nothing is drawn ahead.
    const double piece_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options_.overlap != RunOptions::Overlap::kEvidence || dtype_ == at::kDouble || carried_evidence_ != nullptr ||
        !sets_.front()->reference.ok() || harness::is_distributed(spec_) || piece_s > options_.overlap_piece_limit_s) {
      return;
    }
    while (!pending.ready() && speculate()) {
    }
  }

  /// One more piece of the Speculation, in judge_values' order: the gathering, the repeat
  /// calls' coarse evidence, then one rounding sample of the next round; false when nothing
  /// is left to draw ahead.
  bool speculate() {
    ref_ = sets_.front().get();
    Speculation& ahead = speculation_;
    if (!ahead.gathered) {
      ahead.begun = true;
      count_cost("ahead_pieces");
      if (!gather_piece(ahead.gathering)) return true;
      finish_gathering_ahead();
      count_cost("ahead_gathered");
      return *ahead.gathered;
    }
    if (!*ahead.gathered) return false;
    if (quantizes_ && !spec_.repeat_calls.empty() && !ahead.coarse) {
      ahead.coarse = coarse_evidence(ahead.sample_generator);
      ahead.after_coarse = ahead.sample_generator.clone();
      count_cost("ahead_coarse");
      count_cost("ahead_pieces");
      return true;
    }
    for (int round = 1; round < kEvidenceRounds; ++round) {
      Speculation::Round& r = ahead.rounds[round];
      if (r.taken >= kEvidenceSamples[round]) continue;
      rounding_sample(ahead.sample_generator, ahead.noise_generator, r.sensitivity, r.output_noise);
      ++r.taken;
      r.sample_after = ahead.sample_generator.clone();
      r.noise_after = ahead.noise_generator.clone();
      count_cost("ahead_samples");
      count_cost("ahead_pieces");
      return true;
    }
    return false;
  }

  /// The gathering begun ahead is done: its result, and the generators it leaves for the
  /// pieces drawn ahead after it.
  void finish_gathering_ahead() {
    speculation_.gathered = speculation_.gathering.ok;
    speculation_.sample_generator = sample_generator_.clone();
    speculation_.noise_generator = noise_generator_.clone();
  }

  /// Whether the evidence of `set` may come from the Speculation: the basic ops' set, the
  /// case's only one, gathered ahead.
  bool ahead_for(const ReferenceSet* set) const {
    return set == sets_.front().get() && sets_.size() == 1 && speculation_.gathered.value_or(false);
  }

  const PathRun* run_named(const std::string& name) const {
    for (const PathRun* r : active_) {
      if (r->name == name) return r;
    }
    return nullptr;
  }

  // ---- the float64 reference (recording its kinks for the low-precision rule): one per
  // set of quantization points the paths have (ReferenceSet), the basic ops' first.
  void run_reference() {
    reference_of_first_set();
    for (size_t k = 1; k < sets_.size(); ++k) {
      ref_ = sets_[k].get();
      run_reference_of_set(/*first=*/k == 0);
      if (k > 0 && !ref_->reference.ok() && sets_.front()->reference.ok()) {
        // The same math as the basic ops' reference, which ran: its paths fall back to it.
        set_notes_.push_back("the reference with quantization points (" + ref_->points.describe() + ") raised " +
                             ref_->reference.error_kind + ": " + ref_->reference.error_message);
        for (auto& [path, index] : path_sets_) {
          if (index == k) index = 0;
        }
      }
    }
    ref_ = sets_.front().get();
  }

  /// The basic ops' reference set's references, once (overlap_with_paths or run_reference).
  void reference_of_first_set() {
    if (first_reference_done_) return;
    first_reference_done_ = true;
    ref_device_ = reference_device(spec_, prepared_.plan, prepared_.tensors);
    evidence_spec_ = spec_;
    ref_ = sets_.front().get();
    run_reference_of_set(/*first=*/true);
  }

  /// The references of `ref_` (run_reference); the first set decides evidence_spec_.
  void run_reference_of_set(bool first) {
    ref_->call_quantization = fresh_quantization();
    // The prepared ops hold the first set's Sequential; a further set builds its own.
    BuiltCase own_ops;
    if (!first) {
      PathRun creation;
      run_guarded(creation, [&] { own_ops = reference_ops_with_values(spec_, prepared_.plan, prepared_.tensors); });
      if (!creation.ok()) {
        ref_->reference = creation;
        return;
      }
    }
    ref_->reference =
        run_reference_path(spec_, prepared_.plan, prepared_.tensors, first ? prepared_.reference_ops : own_ops,
                           at::kDouble, ref_device_, &ref_->reference_kinks, ref_->call_quantization.get(),
                           /*no_grad=*/false, 0, nullptr, trace_);
    if (ref_->reference.ok() && recipe_ && recipe_->kind == ops::RecipeKind::kDelayedScaling) {
      // Delayed scaling: call k quantizes with the scales calls 1..k-1 left in the
      // histories, so each repeat call has a reference of its own, in order, on one state.
      for (const RepeatCall& call : spec_.repeat_calls) {
        CaseSpec call_spec = spec_;
        call_spec.input_requires_grad = call.input_requires_grad;
        BuiltCase ops;
        PathRun creation;
        run_guarded(creation, [&] { ops = reference_ops_with_values(spec_, prepared_.plan, prepared_.tensors); });
        if (!creation.ok()) break;
        ref_->repeat_references.push_back(run_reference_path(call_spec, prepared_.plan, prepared_.tensors, ops,
                                                             at::kDouble, ref_device_, nullptr,
                                                             ref_->call_quantization.get(), call.no_grad));
      }
    }
    // A repeat call whose input requires grad when the first call's does not: the input's
    // gradient from a second reference run with it (a channel whose value then requires grad
    // has a gradient in that run that the first call must not be judged on).
    ref_->repeat_grad_input = ref_->reference.grad_input;
    const bool wants_input_grad = first ? !spec_.input_requires_grad && repeat_wants_input_grad(spec_)
                                        : evidence_spec_.input_requires_grad != spec_.input_requires_grad;
    if (ref_->reference.ok() && wants_input_grad) {
      CaseSpec with_input_grad = spec_;
      with_input_grad.input_requires_grad = true;
      BuiltCase ops;
      PathRun creation;
      run_guarded(creation, [&] { ops = reference_ops_with_values(spec_, prepared_.plan, prepared_.tensors); });
      if (creation.ok()) {
        const auto quantization = fresh_quantization();
        PathRun run =
            run_reference_path(with_input_grad, prepared_.plan, prepared_.tensors, ops, at::kDouble, ref_device_,
                               nullptr, quantization.get(), /*no_grad=*/false, 0, nullptr, trace_);
        if (run.ok()) {
          ref_->repeat_grad_input = run.grad_input;
          // The low-precision evidence then covers the input's gradient the repeat calls take.
          if (first) evidence_spec_ = std::move(with_input_grad);
          ref_->evidence_reference = std::move(run);
        }
      }
    }
  }

  /// The reference sets of the paths that ran (run_reference): a path whose plans show a
  /// fused op quantizing elsewhere than its basic ops (runner/quantization_points.h) under
  /// the case's recipe is judged against a reference with those quantization points; paths
  /// with the same points share one. Only such cases pay for a second reference.
  void assign_reference_sets() {
    if (!recipe_) return;
    for (const PathRun* run : active_) {
      ops::QuantizationPoints points = quantization_points(spec_, *run);
      if (points.empty()) continue;
      size_t index = 0;
      while (index < sets_.size() && sets_[index]->points != points) ++index;
      if (index == sets_.size()) {
        sets_.push_back(std::make_unique<ReferenceSet>());
        sets_.back()->points = std::move(points);
        set_notes_.push_back(run->name + " judged against a reference with its fused ops' quantization points (" +
                             sets_.back()->points.describe() + ")");
      }
      path_sets_[run->name] = index;
    }
    if (sets_.size() > 1) result_.features.emplace_back("fused_quantization_points");
    ref_ = sets_.front().get();
  }

  /// The index into sets_ of a path's reference set (of one of its repeat calls too,
  /// "<path>.call[k]").
  size_t set_index(const std::string& path) const {
    const auto it = path_sets_.find(path.substr(0, path.find('.')));
    return it == path_sets_.end() ? 0 : it->second;
  }
  const ReferenceSet& set_of(const std::string& path) const { return *sets_.at(set_index(path)); }

  // ---- judge errors: every path (repeat calls included) must agree with the reference on
  // whether and what it raised, and a failed construction must leave no op locked.
  static Finding error_finding(const PathRun& run, const std::string& path_pair) {
    Finding f;
    f.kind = VerdictKind::kUnexpectedError;
    f.path_pair = path_pair;
    f.tensor = "error";
    f.role = "error";
    f.error_kind = run.error_kind;
    f.error_type = run.error_type;
    f.phase = run.error_stage;
    f.message = run.error_message;
    f.origin = run.error_origin;
    return f;
  }

  void judge_errors() {
    std::vector<const PathRun*> all = active_;
    for (const PathRun* run : active_) {
      for (const auto& repeat : run->repeats) all.push_back(&repeat);
    }
    const bool invalid = intends_error(spec_);
    std::string kinds;
    for (const PathRun* run : all) {
      kinds += (kinds.empty() ? "" : "; ") + (run->ok() ? run->name + " ran" : describe_error(*run));
    }
    kinds += "; " + (ref_->reference.ok() ? std::string("reference ran") : describe_error(ref_->reference));
    if (!ref_->reference.ok() && !invalid) {
      // A case valid by construction that raises in the reference is a bug there or in the
      // shared building code, and would otherwise hide as an agreeing error.
      Finding f = error_finding(ref_->reference, "reference");
      f.note = "a valid case raised in the reference";
      result_.findings.push_back(std::move(f));
    }
    bool any_error = !ref_->reference.ok();
    for (const PathRun* run : all) {
      any_error = any_error || !run->ok();
      if (errors_agree(*run, ref_->reference)) continue;
      if (run->ok()) {
        Finding f;
        f.kind = VerdictKind::kUnexpectedError;
        f.path_pair = run->name + "~reference";
        f.tensor = "error";
        f.role = "no_error";
        f.error_kind = ref_->reference.error_kind;
        f.phase = ref_->reference.error_stage;
        f.message = ref_->reference.error_message;
        f.note = "the reference raised " + ref_->reference.error_kind + " during " + ref_->reference.error_stage +
                 "; " + run->name + " ran";
        result_.findings.push_back(std::move(f));
      } else {
        Finding f = error_finding(*run, run->name + "~reference");
        f.note = ref_->reference.ok()
                     ? "the reference ran"
                     : "the reference raised " + ref_->reference.error_kind + " during " + ref_->reference.error_stage;
        result_.findings.push_back(std::move(f));
      }
    }
    for (const PathRun* run : all) add_lock_findings(*run);
    add_lock_findings(ref_->reference);
    if (invalid && !any_error) {
      // Validation is shared code: a regression there lets an invalid configuration through
      // every path alike, which no comparison between them can see.
      Finding f;
      f.kind = VerdictKind::kUnexpectedError;
      f.path_pair = "every path";
      f.tensor = "error";
      f.role = "no_error";
      f.note = "an invalid configuration raised in no path (reference included)";
      result_.findings.push_back(std::move(f));
    }
    if (any_error) result_.notes = kinds;
  }

  void add_lock_findings(const PathRun& run) {
    for (int64_t op : run.left_locked) {
      Finding f;
      f.kind = VerdictKind::kUnexpectedError;
      f.path_pair = run.name;
      f.tensor = "op[" + std::to_string(op) + "]";
      f.role = "left_locked";
      f.phase = run.error_stage;
      f.op = spec_.ops.at(static_cast<size_t>(op)).name;
      f.note = "failed " + run.error_stage + " left op " + std::to_string(op) + " (" + f.op + ") locked";
      result_.findings.push_back(std::move(f));
    }
  }

  // ---- judge values: every path that ran against the reference, its repeat calls and their
  // plans, the caller's tensors, and the fused path against the unfused one. A non-float64
  // case that fails the first check is judged again with the low-precision rule's evidence.
  bool all_channels() const { return backend_.capabilities().exposes_all_channels; }

  /// The bounds one reference set holds its paths to: the first check's, or with the
  /// evidence its rule's (and its repeat calls' coarse ones).
  struct SetBounds {
    oracle::CaseBounds bounds;
    std::optional<oracle::CaseBounds> repeats;
  };
  SetBounds set_bounds(bool with_evidence, int64_t* cancellation) {
    const auto expected = oracle::tensors_by_name(evidence_spec_, evidence_reference());
    SetBounds out;
    if (!with_evidence) {
      out.bounds = oracle::first_bounds(dtype_, context_, expected, options_.rounding);
      return out;
    }
    out.bounds = oracle::evidence_bounds(dtype_, context_, expected, ref_->evidence, options_.rounding, cancellation);
    out.repeats = repeat_call_bounds(expected);
    return out;
  }

  /// Every path that ran against its reference set's reference (first check, or with
  /// `with_evidence` the low-precision rule's evidence of that set), its repeat calls and
  /// their plans, and the fused path against the unfused one. `cancellation`: the tensors the
  /// basic ops' set counts as cancellation-widened.
  std::vector<Finding> compare_all(bool with_evidence, int64_t* cancellation = nullptr) {
    std::vector<Finding> findings;
    std::vector<std::string> notes;
    oracle::Comparer comparer(findings, notes);
    std::vector<SetBounds> bounds;
    for (const auto& set : sets_) {
      ref_ = set.get();
      bounds.push_back(set_bounds(with_evidence, set == sets_.front() ? cancellation : nullptr));
    }
    ref_ = sets_.front().get();
    for (const PathRun* run : active_) {
      const ReferenceSet& set = set_of(run->name);
      const SetBounds& b = bounds.at(set_index(run->name));
      if (run->ok()) {
        compare_paths(run->name + "~reference", spec_, set.reference, *run, b.bounds, comparer, all_channels());
      }
      // A repeat call of a quantizing case rounds other values than call 1, whose evidence the
      // bounds hold, near other FP8 rounding boundaries: its elements get the largest allowance
      // of their tensor, and with evidence the repeat bounds hold the coarse FP8 estimate
      // (every element jittered, repeat_call_bounds).
      const oracle::CaseBounds repeat_bounds = b.repeats    ? *b.repeats
                                               : quantizes_ ? uniform_allowance(b.bounds)
                                                            : b.bounds;
      for (size_t k = 0; k < run->repeats.size() && k < spec_.repeat_calls.size(); ++k) {
        const PathRun& repeat = run->repeats[k];
        if (!repeat.ok()) continue;
        const bool own = k < set.repeat_references.size() && set.repeat_references[k].ok();
        compare_paths(repeat.name + "~reference", spec_,
                      own ? expected_for_call(set.repeat_references[k], set.repeat_references[k].grad_input,
                                              spec_.repeat_calls[k])
                          : expected_for_call(set.reference, set.repeat_grad_input, spec_.repeat_calls[k]),
                      repeat, repeat_bounds, comparer, all_channels());
        compare_plans(repeat, findings);
      }
    }
    const PathRun* fused = run_named("fused");
    const PathRun* unfused = run_named("unfused");
    if (options_.compare_fused_unfused && fused && unfused && fused->ok() && unfused->ok()) {
      const ReferenceSet& fused_set = set_of(fused->name);
      const ReferenceSet& unfused_set = set_of(unfused->name);
      if (dtype_ == at::kDouble && &fused_set == &unfused_set) {
        compare_paths("fused~unfused", spec_, *unfused, *fused, {path_pair_tolerance(dtype_, context_), {}}, comparer,
                      all_channels());
      } else if (dtype_ == at::kDouble) {
        compare_shifted(fused_set, unfused_set, *fused, *unfused, comparer);
      } else {
        oracle::compare_fused_unfused(spec_, fused_set.reference, *fused, *unfused, dtype_, context_,
                                      with_evidence ? &fused_set.evidence : nullptr, findings, options_.rounding,
                                      all_channels(), &unfused_set.reference);
      }
    }
    for (auto& note : notes) notes_.push_back(std::move(note));
    return findings;
  }

  /// float64, paths of two reference sets: the fused path against the unfused one moved by
  /// the difference of their references (what the quantization points alone change), under
  /// the static tolerance of two paths.
  void compare_shifted(const ReferenceSet& fused_set, const ReferenceSet& unfused_set, const PathRun& fused,
                       const PathRun& unfused, oracle::Comparer& comparer) const {
    const auto fused_expected = oracle::tensors_by_name(spec_, fused_set.reference);
    const auto unfused_expected = oracle::tensors_by_name(spec_, unfused_set.reference);
    const oracle::TensorBound bound = oracle::CaseBounds{path_pair_tolerance(dtype_, context_), {}}.bound("");
    for (const auto& t : oracle::compared_tensors(spec_, unfused, fused, all_channels())) {
      at::Tensor expected = t.expected;
      const auto f = fused_expected.find(t.name);
      const auto u = unfused_expected.find(t.name);
      if (expected.defined() && f != fused_expected.end() && u != unfused_expected.end() && f->second.defined() &&
          u->second.defined() && f->second.sizes() == expected.sizes() && u->second.sizes() == expected.sizes()) {
        expected = expected.to(at::kDouble) + (f->second - u->second).to(expected.device(), at::kDouble);
      }
      comparer.compare("fused~unfused", t.name, t.role, expected, t.got, t.gradient, bound);
    }
  }

  static oracle::CaseBounds uniform_allowance(oracle::CaseBounds bounds) {
    for (auto& [name, b] : bounds.tensors) {
      if (b.allowance.defined() && b.allowance.numel() > 0) {
        b.allowance = at::full_like(b.allowance, b.allowance.max().item<double>());
      }
    }
    return bounds;
  }

  /// Runs `stage` with ref_ on each reference set in turn (sets_[0] after); false as soon as
  /// one returns false.
  template <typename Stage>
  bool for_each_set(Stage stage) {
    bool ok = true;
    for (const auto& set : sets_) {
      ref_ = set.get();
      if (!stage()) {
        ok = false;
        break;
      }
    }
    ref_ = sets_.front().get();
    return ok;
  }

  const PathRun& evidence_reference() const {
    return ref_->evidence_reference ? *ref_->evidence_reference : ref_->reference;
  }

  static bool has_value_findings(const std::vector<Finding>& findings) {
    return std::any_of(findings.begin(), findings.end(), [](const Finding& f) {
      return (f.kind == VerdictKind::kMismatch || f.kind == VerdictKind::kMissingGradient) && f.role != "plan";
    });
  }

  void judge_values() {
    std::vector<Finding> values = compare_all(/*with_evidence=*/false);
    if (has_value_findings(values) && dtype_ != at::kDouble) {
      // What the dtype itself costs this case: only cases that fail the first check pay for
      // the evidence's extra reference runs, and only those that still fail pay for more
      // rounding samples (one sample per element is a weak estimate of its rounding noise:
      // a value that fails 8x the largest of 16 samples is not noise). Each reference set
      // gathers its own (the FP8 windows are its reference's).
      CostStage stage("evidence");
      int first_round = 0;
      bool gathered = take_carried_evidence();
      if (gathered) {
        first_round = carried_evidence_->rounds;
        count_cost("evidence_carried");
      } else {
        gathered = for_each_set([&] {
          // The basic ops' gathering drawn ahead holds whatever sets follow (each gathering
          // starts the generators afresh).
          if (ref_ != sets_.front().get() || !speculation_.begun) return gather_evidence();
          if (!speculation_.gathered) {
            // Begun ahead, not done: the rest of its pieces, in order.
            while (!gather_piece(speculation_.gathering)) {
            }
            finish_gathering_ahead();
            count_cost("ahead_gathered_in_part");
          } else {
            count_cost("ahead_gathered_used");
          }
          return *speculation_.gathered;
        });
      }
      if (gathered) {
        for (int round = first_round; round < kEvidenceRounds; ++round) {
          if (round > first_round) {
            if (!has_value_findings(values)) break;
            for_each_set([&] {
              add_round(round);
              return true;
            });
          }
          evidence_rounds_ = round;
          notes_.clear();
          int64_t cancellation = 0;
          values = compare_all(/*with_evidence=*/true, &cancellation);
          result_.cancellation_tensors = cancellation;
        }
        result_.kink_elements = sets_.front()->evidence.kink_elements;
      }
    }
    for (const PathRun* run : active_) {
      check_caller_tensors(*run, values);
      for (const auto& repeat : run->repeats) check_caller_tensors(repeat, values);
    }
    for (auto& f : values) result_.findings.push_back(std::move(f));
    // Which fused ops were judged on values: those of a fused path that ran.
    const PathRun* fused = run_named("fused");
    if (fused && fused->ok()) {
      std::set<std::string> seen;
      for (const auto* list : {&result_.fused_forward, &result_.fused_backward}) {
        for (const auto& name : *list) {
          if (seen.insert(name).second) result_.fused_compared.push_back(name);
        }
      }
    }
  }

  /// Tensors of the case with every floating value perturbed by a relative u * xi,
  /// xi uniform in [-1, 1] (the case seed's own generator, after its draws).
  harness::CaseTensors perturbed(double u, at::Generator& gen) const {
    harness::CaseTensors t = prepared_.tensors;
    auto jitter = [&](at::Tensor& x) {
      if (!x.defined() || !x.is_floating_point()) return;
      const at::Tensor xi = at::rand(x.sizes(), gen, at::TensorOptions().dtype(at::kDouble)) * 2 - 1;
      x = x.to(at::kDouble) * (1 + u * xi.to(x.device()));
    };
    jitter(t.input);
    for (auto& op : t.params) {
      for (auto& p : op) jitter(p);
    }
    for (auto& e : t.extra_inputs) jitter(e);
    for (auto& c : t.cotangents) jitter(c);
    return t;
  }

  /// A run of the reference ops on `values` in `dtype` (kinks into `probe`, when given; with
  /// `noise`, every op's results rounded once more by a relative u of the case's dtype,
  /// ReferenceEvaluator::set_output_noise, drawn from the noise generator).
  PathRun reference_run(const harness::CaseTensors& values, at::ScalarType dtype, ops::KinkProbe* probe = nullptr,
                        at::Generator* jitter = nullptr, std::vector<at::Tensor>* record = nullptr,
                        at::Generator* noise = nullptr) {
    BuiltCase ops;
    PathRun creation;
    run_guarded(creation, [&] { ops = reference_ops_with_values(spec_, prepared_.plan, values); });
    if (!creation.ok()) return creation;
    // Every evaluation its own quantization state: each moves delayed-scaling histories.
    const auto quantization = fresh_quantization(jitter, record);
    return run_reference_path(evidence_spec_, prepared_.plan, values, ops, dtype, ref_device_, probe,
                              quantization.get(), /*no_grad=*/false, noise ? harness::unit_roundoff(dtype_) : 0.0,
                              noise, trace_);
  }

  /// `n` more rounding samples: the rounding baseline on values perturbed by a relative u
  /// (each value moved to a neighbour in the dtype or not), its distance to the float64
  /// reference kept element by element at its largest; and, for a case that does not
  /// quantize, `n` output-noise samples: the float64 reference on values perturbed by a
  /// relative u with every op's results (forward and backward) rounded once more, its
  /// distance kept likewise (RoundingEvidence::output_noise).
  void add_rounding_samples(int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
      rounding_sample(sample_generator_, noise_generator_, ref_->evidence.sensitivity, ref_->evidence.output_noise);
    }
  }

  /// One rounding sample of add_rounding_samples, drawn from `samples` and `noise` (each
  /// generator's draws in the same order as n samples in a row draw them), its maxima kept
  /// in `sensitivity` and `output_noise`.
  void rounding_sample(at::Generator& samples, at::Generator& noise, std::map<std::string, at::Tensor>& sensitivity,
                       std::map<std::string, at::Tensor>& output_noise) {
    const double u = harness::unit_roundoff(dtype_);
    // A quantizing case's samples also move each quantized element by one FP8 value or not.
    const PathRun run = reference_run(perturbed(u, samples), dtype_, nullptr, quantizes_ ? &samples : nullptr);
    if (run.ok()) oracle::accumulate_max(sensitivity, oracle::abs_differences(spec_, evidence_reference(), run));
    // A quantizing case's elements already get their tensor's largest evidence (its FP8
    // rounding dominates the dtype's), and noise ahead of a quantizer would move whole FP8
    // steps: output noise is the half-precision rule's alone.
    if (quantizes_) return;
    const PathRun noisy = reference_run(perturbed(u, noise), at::kDouble, nullptr, nullptr, nullptr, &noise);
    if (noisy.ok()) oracle::accumulate_max(output_noise, oracle::abs_differences(spec_, evidence_reference(), noisy));
  }

  /// Round `round`'s samples of the set ref_: those drawn ahead (Speculation), the maxima
  /// being the same in any grouping, then the rest from where they left the generators.
  void add_round(int round) {
    int64_t n = kEvidenceSamples[round];
    if (ahead_for(ref_)) {
      const Speculation::Round& r = speculation_.rounds[round];
      if (r.taken > 0) {
        oracle::accumulate_max(ref_->evidence.sensitivity, r.sensitivity);
        oracle::accumulate_max(ref_->evidence.output_noise, r.output_noise);
        sample_generator_ = r.sample_after.clone();
        noise_generator_ = r.noise_after.clone();
        n -= r.taken;
        count_cost("ahead_samples_used", r.taken);
      }
    }
    add_rounding_samples(n);
  }

  /// The values a reference set's evidence is measured against, by name.
  std::map<std::string, at::Tensor> evidence_values() const {
    return oracle::tensors_by_name(evidence_spec_, evidence_reference());
  }

  /// The evidence stage's state for the in-place ablation's rerun (EvidenceCarry); none
  /// when this run gathered no evidence.
  std::optional<EvidenceCarry> carry_evidence() {
    if (evidence_rounds_ < 0) return std::nullopt;
    EvidenceCarry carry;
    for (const auto& set : sets_) {
      ref_ = set.get();
      carry.sets.push_back({set->points, evidence_values(), set->evidence, set->coarse_evidence, set->baseline_kinks,
                            set->fp8_windows, set->fp8_reference});
    }
    ref_ = sets_.front().get();
    carry.sample_generator = sample_generator_.clone();
    carry.noise_generator = noise_generator_.clone();
    carry.rounds = evidence_rounds_;
    return carry;
  }

  /// Takes the parent run's evidence (EvidenceCarry) where it was measured on this run's
  /// reference sets: same quantization points in the same order, same reference values
  /// (bit for bit); false otherwise (the rerun gathers its own).
  bool take_carried_evidence() {
    const EvidenceCarry* carry = carried_evidence_;
    if (carry == nullptr || carry->rounds < 0 || carry->sets.size() != sets_.size()) return false;
    bool same = true;
    for (size_t k = 0; k < sets_.size() && same; ++k) {
      ref_ = sets_[k].get();
      const auto& theirs = carry->sets[k].reference;
      const auto mine = evidence_values();
      same = sets_[k]->points == carry->sets[k].points && mine.size() == theirs.size();
      for (const auto& [name, t] : mine) {
        if (!same) break;
        const auto it = theirs.find(name);
        same = it != theirs.end() && t.defined() == it->second.defined() &&
               (!t.defined() || (t.sizes() == it->second.sizes() && t.scalar_type() == it->second.scalar_type() &&
                                 t.device() == it->second.device() && at::equal(t, it->second)));
      }
    }
    ref_ = sets_.front().get();
    if (!same) return false;
    for (size_t k = 0; k < sets_.size(); ++k) {
      const EvidenceCarry::Set& from = carry->sets[k];
      ReferenceSet& to = *sets_[k];
      to.evidence = from.evidence;
      to.coarse_evidence = from.coarse_evidence;
      to.baseline_kinks = from.baseline_kinks;
      to.fp8_windows = from.fp8_windows;
      to.fp8_reference = from.fp8_reference;
    }
    sample_generator_ = carry->sample_generator.clone();
    noise_generator_ = carry->noise_generator.clone();
    return true;
  }

  bool gather_evidence() {
    Gathering g;
    while (!gather_piece(g)) {
    }
    return g.ok;
  }

  /// The next piece of gathering `g` on ref_; true once it is done (its result in g.ok).
  /// In order: the rounding baseline (the plain reference in the case's dtype, kinks
  /// recorded); for a quantizing case the FP8 windows (set_fp8_windows); the input
  /// sensitivity's first two samples (add_rounding_samples adds more) from generators started
  /// afresh; the kinks (the reference again with the elements near one taken the other way).
  bool gather_piece(Gathering& g) {
    using Step = Gathering::Step;
    switch (g.step) {
      case Step::kBaseline:
        g.baseline = reference_run(prepared_.tensors, dtype_, &g.probe, nullptr, &g.baseline_scaled);
        if (!g.baseline.ok()) {
          g.ok = false;
          g.step = Step::kDone;
          return true;
        }
        ref_->evidence.quantized = quantizes_;
        if (quantizes_) {
          ref_->fp8_windows.clear();
          ref_->fp8_reference.clear();
        }
        g.windows = quantizes_ && backend_.capabilities().fp8_reference_exact;
        g.step = g.windows ? Step::kFp8Reference : Step::kWindows;
        return false;
      case Step::kFp8Reference: {
        const PathRun reference = reference_run(prepared_.tensors, at::kDouble, nullptr, nullptr, &g.reference_scaled);
        g.windows = reference.ok() && g.reference_scaled.size() == g.baseline_scaled.size();
        // An accumulation error ahead of a quantizer moves its input as a rounding does.
        g.step = g.windows && gemm_accumulation() ? Step::kAccumulation : Step::kWindows;
        return false;
      }
      case Step::kAccumulation: {
        const auto mode = g.accumulated.empty() ? ops::AccumulationMode::kPlus : ops::AccumulationMode::kMinus;
        std::vector<at::Tensor> scaled;
        if (!accumulation_run(mode, &scaled).ok() || scaled.size() != g.reference_scaled.size()) {
          g.windows = false;
          g.step = Step::kWindows;
          return false;
        }
        g.accumulated.push_back(std::move(scaled));
        if (g.accumulated.size() == 2) g.step = Step::kWindows;
        return false;
      }
      case Step::kWindows:
        if (g.windows) set_fp8_windows(g.baseline_scaled, std::move(g.reference_scaled), g.accumulated);
        ref_->evidence.baseline_error = oracle::abs_differences(spec_, evidence_reference(), g.baseline);
        ref_->baseline_kinks = g.probe.sites();
        sample_generator_ = at::detail::createCPUGenerator(spec_.seed ^ 0x5e9517u);
        // The output noise draws from its own generator: the rounding samples stay those of
        // the case's seed whatever else is measured.
        noise_generator_ = at::detail::createCPUGenerator(spec_.seed ^ 0x0e0153u);
        g.step = Step::kSamples;
        [[fallthrough]];
      case Step::kSamples:
        rounding_sample(sample_generator_, noise_generator_, ref_->evidence.sensitivity, ref_->evidence.output_noise);
        if (++g.samples < 2) return false;
        g.kinks = oracle::near_kinks(ref_->reference_kinks.sites(), ref_->baseline_kinks,
                                     harness::unit_roundoff(dtype_), options_.rounding);
        ref_->evidence.kink_elements = g.kinks.elements;
        g.step = Step::kKinks;
        if (!g.kinks.groups.empty()) return false;
        g.step = Step::kDone;
        return true;
      case Step::kKinks: {
        ops::KinkProbe flips;
        for (const auto& [op, mask] : g.kinks.groups.at(g.group)) flips.set_flip(op, mask);
        const PathRun run = reference_run(prepared_.tensors, at::kDouble, &flips);
        if (run.ok()) {
          oracle::accumulate_sum(ref_->evidence.kink_effect, oracle::abs_differences(spec_, evidence_reference(), run));
        }
        if (++g.group < g.kinks.groups.size()) return false;
        g.step = Step::kDone;
        return true;
      }
      case Step::kDone:
        return true;
    }
    return true;
  }

  /// The bounds of a quantizing case's repeat calls: the windows of set_fp8_windows hold for
  /// call 1's values only, so the rounding samples of these bounds jitter every quantized
  /// element (the coarse estimate: one FP8 ulp anywhere), four of them, drawn once.
  std::optional<oracle::CaseBounds> repeat_call_bounds(const std::map<std::string, at::Tensor>& expected) {
    if (!quantizes_ || spec_.repeat_calls.empty()) return std::nullopt;
    if (!ref_->coarse_evidence) {
      if (ahead_for(ref_) && speculation_.coarse) {
        ref_->coarse_evidence = *speculation_.coarse;
        sample_generator_ = speculation_.after_coarse.clone();
        count_cost("ahead_coarse_used");
      } else {
        ref_->coarse_evidence = coarse_evidence(sample_generator_);
      }
    }
    return uniform_allowance(
        oracle::evidence_bounds(dtype_, context_, expected, *ref_->coarse_evidence, options_.rounding));
  }

  /// The coarse evidence of ref_ (repeat_call_bounds): its evidence so far with the
  /// sensitivity of four samples drawn from `samples` that jitter every quantized element.
  oracle::RoundingEvidence coarse_evidence(at::Generator& samples) {
    oracle::RoundingEvidence coarse = ref_->evidence;
    coarse.sensitivity.clear();
    std::vector<at::Tensor> windows;
    std::vector<at::Tensor> reference;
    std::swap(windows, ref_->fp8_windows);
    std::swap(reference, ref_->fp8_reference);
    const double u = harness::unit_roundoff(dtype_);
    for (int k = 0; k < 4; ++k) {
      const PathRun run = reference_run(perturbed(u, samples), dtype_, nullptr, &samples);
      if (run.ok())
        oracle::accumulate_max(coarse.sensitivity, oracle::abs_differences(spec_, evidence_reference(), run));
    }
    std::swap(windows, ref_->fp8_windows);
    std::swap(reference, ref_->fp8_reference);
    return coarse;
  }

  /// FP8 rounding boundaries are the quantizer's kinks. The scaled values of the float64
  /// reference (a run of its own, recorded) and of the rounding baseline, quantization by
  /// quantization, give each element's window, fp8_window_factor * |baseline - reference|:
  /// what this dtype's rounding of the operand and of its scale moves it by, with room (on a
  /// backend whose FP8 GEMMs accumulate inexactly, the larger of that and how far the float64
  /// reference with every FP8 GEMM up, or down, by its accumulation term moves it: the term
  /// already estimates each GEMM's error from above, so it is taken once). An
  /// element whose reference value lies closer than its window to a rounding boundary can
  /// round the other way in a correct implementation; elsewhere a correct implementation
  /// rounds as the reference does (a leaf tensor's values are the reference's, bit for bit,
  /// and the cast rounds a tie to even in every implementation). The rounding samples start from
  /// the reference's codes and move only the elements within their window. On a backend
  /// whose FP8 is not the reference's bit for bit (capabilities.fp8_reference_exact), or without a match
  /// (another number of quantizations, a shape that differs) samples round their own values
  /// and move every element (ref_->fp8_windows empty). The runs are gather_piece's; this
  /// sets the windows from them, or leaves none where they do not match.
  void set_fp8_windows(const std::vector<at::Tensor>& baseline_scaled, std::vector<at::Tensor> reference_scaled,
                       const std::vector<std::vector<at::Tensor>>& accumulated) {
    const double factor = options_.rounding.fp8_window_factor;
    std::vector<at::Tensor> windows;
    for (size_t i = 0; i < reference_scaled.size(); ++i) {
      const at::Tensor& r = reference_scaled[i];
      const at::Tensor& b = baseline_scaled[i];
      if (!r.defined() || !b.defined() || r.sizes() != b.sizes()) return;
      at::Tensor window = factor * (b.to(r.device()) - r).abs();
      for (const auto& run : accumulated) {
        const at::Tensor& a = run[i];
        if (!a.defined() || a.sizes() != r.sizes()) return;
        // The term is an upper estimate of each GEMM's error already: taken once.
        window = at::maximum(window, (a.to(r.device()) - r).abs());
      }
      windows.push_back(window.cpu());
      reference_scaled[i] = r.cpu();
    }
    ref_->fp8_windows = std::move(windows);
    ref_->fp8_reference = std::move(reference_scaled);
  }

  /// The float64 reference on the case's values with every FP8 GEMM giving what `mode` says
  /// (set_fp8_windows: up or down by its accumulation term), its scaled values recorded.
  PathRun accumulation_run(ops::AccumulationMode mode, std::vector<at::Tensor>* record) {
    BuiltCase ops;
    PathRun creation;
    run_guarded(creation, [&] { ops = reference_ops_with_values(spec_, prepared_.plan, prepared_.tensors); });
    if (!creation.ok()) return creation;
    const auto quantization = fresh_quantization(nullptr, record, mode);
    return run_reference_path(evidence_spec_, prepared_.plan, prepared_.tensors, ops, at::kDouble, ref_device_, nullptr,
                              quantization.get());
  }

  // ---- replicas: a tensor every rank holds whole (the output of an AllReduce, a gradient
  // every rank computes alike) must be the same on every rank: rank 0's copy is the one
  // compared with the reference, and each other rank's copy is compared with it (the static
  // tolerance of two paths: the ranks run the same kernels on the same values, so they
  // differ at most by a reduction's order).
  void judge_replicas() {
    if (!sharding_) return;
    std::vector<Finding> findings;
    std::vector<std::string> notes;
    oracle::Comparer comparer(findings, notes);
    const oracle::Tolerance tolerance = path_pair_tolerance(dtype_, context_);
    const oracle::CaseBounds bounds{tolerance, {}};
    auto compare_ranks = [&](const PathRun& run) {
      if (!run.ok() || run.ranks.size() < 2) return;
      const PathRun lead = harness::replica_view(run.ranks.front(), *sharding_);
      for (size_t k = 1; k < run.ranks.size(); ++k) {
        if (!run.ranks[k].ok()) continue;
        const PathRun copy = harness::replica_view(run.ranks[k], *sharding_);
        for (const auto& t : oracle::compared_tensors(spec_, lead, copy)) {
          comparer.compare(run.name + ".rank[" + std::to_string(k) + "]~" + run.name + ".rank[0]", t.name, "replica",
                           t.expected, t.got, t.gradient, bounds.bound(t.name));
        }
      }
    };
    for (const PathRun* run : active_) {
      compare_ranks(*run);
      for (const auto& repeat : run->repeats) compare_ranks(repeat);
    }
    for (auto& f : findings) {
      f.note = f.note.empty() ? "the ranks' copies of a replicated tensor differ" : f.note;
      result_.findings.push_back(std::move(f));
    }
  }

  // ---- finite differences: the reference itself against central differences (float64).
  void check_finite_differences_stage() {
    // A quantizing case's gradient is deliberately not the derivative of its value (the
    // quantizers pass gradients straight through): nothing for central differences to check.
    if (!options_.finite_differences || dtype_ != at::kDouble || !ref_->reference.ok() || quantizes_) return;
    try {
      check_finite_differences(spec_, prepared_.tensors, ref_->reference, prepared_.reference_ops,
                               options_.finite_difference, prepared_.generator, result_.findings, notes_);
    } catch (const gradfuzz::Error& e) {
      notes_.push_back(std::string("finite differences: reference forward raised ") + e.what());
    } catch (const c10::Error& e) {
      notes_.push_back(std::string("finite differences: reference forward raised ") + e.what_without_backtrace());
    }
  }

  // ---- confirm: evidence, never an excuse. A low-precision value finding is rerun in the
  // widest dtype on the same values, and each finding says whether it persists there.
  void confirm_in_wide_dtype() {
    if (!options_.confirm_in_wide_dtype || dtype_ == at::kDouble) return;
    const bool has_values = std::any_of(result_.findings.begin(), result_.findings.end(), [](const Finding& f) {
      return (f.kind == VerdictKind::kMismatch || f.kind == VerdictKind::kMissingGradient) && f.role != "plan";
    });
    if (!has_values) return;
    const auto wide = widest_dtype(backend_.capabilities());
    if (!wide || dtype_rank(*wide) <= dtype_rank(spec_.dtype)) return;
    CaseSpec wide_spec = spec_;
    wide_spec.dtype = *wide;
    std::vector<PathRun> wide_runs;
    try {
      wide_runs = backend_.run_paths(wide_spec, prepared_.plan, prepared_.tensors, requests_);
      if (!single_pass_.empty()) {
        for (auto& r : backend_.run_paths(wide_spec, prepared_.plan, prepared_.tensors, single_pass_)) {
          wide_runs.push_back(std::move(r));
        }
      }
    } catch (const std::runtime_error& e) {
      notes_.push_back("the " + *wide + " confirmation did not run: " + e.what());
      return;
    }
    const at::ScalarType wide_type = harness::scalar_type_from_name(*wide);
    std::vector<Finding> wide_findings;
    std::vector<std::string> ignored;
    oracle::Comparer comparer(wide_findings, ignored);
    std::set<std::string> ran;
    for (const auto& r : wide_runs) {
      if (!r.ok()) continue;
      ran.insert(r.name);
      compare_paths(r.name + "~reference", spec_, set_of(r.name).reference, r,
                    {case_tolerance(wide_type, context_), {}}, comparer, all_channels());
    }
    std::set<std::pair<std::string, std::string>> wrong;
    for (const auto& f : wide_findings) wrong.insert({f.path_pair, f.tensor});
    bool precision_only = true;
    for (auto& f : result_.findings) {
      if (f.kind != VerdictKind::kMismatch && f.kind != VerdictKind::kMissingGradient) continue;
      const std::string path = f.path_pair.substr(0, f.path_pair.find('~'));
      if (!ran.count(path)) continue;
      const bool persists = wrong.count({path + "~reference", f.tensor}) > 0;
      precision_only = precision_only && !persists;
      const std::string evidence =
          persists ? "also wrong in " + *wide + " on the same values" : "passes in " + *wide + " on the same values";
      f.note = f.note.empty() ? evidence : f.note + "; " + evidence;
    }
    if (precision_only) result_.features.emplace_back("precision_only_finding");
  }

  // ---- root cause by ablation (RunOptions::attribute_in_place).
  static std::string base_path(const Finding& f) {
    const std::string path = f.path_pair.substr(0, f.path_pair.find('~'));
    return path.substr(0, path.find('.'));
  }
  static bool is_value_kind(const Finding& f) {
    return f.kind == VerdictKind::kMismatch || f.kind == VerdictKind::kMissingGradient ||
           f.kind == VerdictKind::kModifiedInput;
  }
  void attribute_in_place_stage() {
    if (!options_.attribute_in_place) return;
    std::vector<std::string> writers;
    CaseSpec ablated = spec_;
    for (auto& op : ablated.ops) {
      auto it = op.attrs.find("in_place");
      if (it == op.attrs.end() || it->second != 1) continue;
      it->second = 0;
      if (std::find(writers.begin(), writers.end(), op.name) == writers.end()) writers.push_back(op.name);
    }
    if (writers.empty()) return;
    std::sort(writers.begin(), writers.end());  // one cluster whatever the ops' order
    // A tensor the unfused path gets wrong (or writes) too is not a fusion's doing.
    const bool unfused_ran = run_named("unfused") != nullptr && run_named("unfused")->ok();
    std::set<std::string> unfused_wrong;
    for (const auto& f : result_.findings) {
      if (is_value_kind(f) && base_path(f) == "unfused") unfused_wrong.insert(f.tensor);
    }
    std::vector<size_t> candidates;
    for (size_t k = 0; k < result_.findings.size(); ++k) {
      const Finding& f = result_.findings[k];
      if (!is_value_kind(f)) continue;
      const bool fusion_specific = base_path(f) != "unfused" && unfused_ran && !unfused_wrong.count(f.tensor);
      if (!fusion_specific) candidates.push_back(k);
    }
    if (candidates.empty()) return;
    RunOptions o = options_;
    o.attribute_in_place = false;
    o.confirm_in_wide_dtype = false;
    o.finite_differences = false;
    // The rerun's findings are read by kind and tensor only: no writer is needed, nor the
    // repeat calls' plan checks unless a finding to attribute is a plan's.
    o.find_writers = options_.find_writers && !options_.shared_runs;
    o.check_plans = options_.check_plans && (!options_.shared_runs ||
                                             std::any_of(candidates.begin(), candidates.end(),
                                                         [&](size_t k) { return result_.findings[k].role == "plan"; }));
    // The rerun's reference is this run's (the reference ignores in_place): with shared runs
    // it starts from this run's evidence where its reference sets match (EvidenceCarry).
    const std::optional<EvidenceCarry> carry = options_.shared_runs ? carry_evidence() : std::nullopt;
    CaseResult without;
    try {
      without = run_case_impl(ablated, backend_, o, carry ? &*carry : nullptr);
    } catch (const std::exception& e) {
      notes_.push_back(std::string("in-place ablation not run: ") + e.what());
      return;
    }
    if (without.verdict == VerdictKind::kUnsupported) return;
    std::set<std::pair<VerdictKind, std::string>> still;
    for (const auto& f : without.findings) still.insert({f.kind, f.tensor});
    std::string joined;
    for (const auto& w : writers) joined += (joined.empty() ? "" : ",") + w;
    for (size_t k : candidates) {
      if (!still.count({result_.findings[k].kind, result_.findings[k].tensor})) in_place_caused_.push_back(k);
    }
    in_place_writers_ = joined;
  }

  // ---- localise (RunOptions::trace): where each path with value findings first leaves its
  // reference set's reference, among its plan groups' tensors and its compared tensors, each
  // under the bound judge_values held it to (oracle/divergence.h).
  void localise_stage() {
    if (!trace_) return;
    for (const PathRun* run : active_) {
      if (!run->ok() || run->trace.empty()) continue;
      const std::string pair = run->name + "~reference";
      if (std::none_of(result_.findings.begin(), result_.findings.end(), [&](const Finding& f) {
            return f.path_pair == pair && (f.kind == VerdictKind::kMismatch || f.kind == VerdictKind::kMissingGradient);
          })) {
        continue;
      }
      ref_ = sets_.at(set_index(run->name)).get();
      if (!ref_->reference.ok()) continue;
      const auto expected = oracle::tensors_by_name(evidence_spec_, evidence_reference());
      const oracle::CaseBounds bounds =
          dtype_ == at::kDouble || evidence_rounds_ < 0
              ? oracle::first_bounds(dtype_, context_, expected, options_.rounding)
              : oracle::evidence_bounds(dtype_, context_, expected, ref_->evidence, options_.rounding);
      if (auto d = oracle::first_divergence(spec_, prepared_.plan, ref_->reference, *run, bounds, result_.findings)) {
        result_.divergences.push_back(std::move(*d));
      }
    }
    ref_ = sets_.front().get();
    localise_repeat_calls();
  }

  /// A repeat call's value findings whose path's first call did not diverge (the call takes a
  /// gradient the first does not, or its recipe state differs): the case run once more, traced,
  /// with that call's grad requirements as its first call, on the same values. Its path's
  /// divergence stands for the repeat call's (a defect the call reaches, its values aside).
  void localise_repeat_calls() {
    for (const PathRun* run : active_) {
      const bool diverged = std::any_of(result_.divergences.begin(), result_.divergences.end(),
                                        [&](const harness::Divergence& d) { return d.path == run->name; });
      for (size_t k = 0; !diverged && k < run->repeats.size() && k < spec_.repeat_calls.size(); ++k) {
        const std::string pair = run->repeats[k].name + "~reference";
        const bool fails = std::any_of(result_.findings.begin(), result_.findings.end(), [&](const Finding& f) {
          return f.path_pair == pair && (f.kind == VerdictKind::kMismatch || f.kind == VerdictKind::kMissingGradient);
        });
        const RepeatCall& call = spec_.repeat_calls[k];
        if (!fails || call.no_grad) continue;
        CaseSpec as_first = spec_;
        as_first.input_requires_grad = call.input_requires_grad;
        as_first.repeat_calls.clear();
        RunOptions o = options_;
        o.attribute_in_place = false;
        o.confirm_in_wide_dtype = false;
        o.finite_differences = false;
        o.find_writers = false;
        o.check_plans = false;
        CaseResult first_call;
        try {
          first_call = run_case_impl(as_first, backend_, o);
        } catch (const std::exception& e) {
          notes_.push_back("the traced run of " + run->repeats[k].name + " as a first call did not run: " + e.what());
          continue;
        }
        for (harness::Divergence d : first_call.divergences) {
          if (d.path != run->name) continue;
          d.path = run->repeats[k].name;
          result_.divergences.push_back(std::move(d));
          break;
        }
      }
    }
  }

  CaseResult finish() {
    std::vector<const PathRun*> runs = active_;
    // The findings the ablation puts down to writing in place are set apart: the others are
    // signed by their own first divergence (a weight gradient 3.6x off with the write and one
    // FP8 rounding off without it was signed by the in-place op's tensor, H200 2026-12-02d).
    oracle::assign_signatures(spec_, prepared_.plan, runs, result_, in_place_caused_);
    for (size_t k : in_place_caused_) {
      Finding& f = result_.findings[k];
      f.op = "in_place:" + in_place_writers_;
      f.option = "in_place=1";
      f.signature = std::string(harness::verdict_name(f.kind)) + "|" + f.op + "|in_place=1|" + f.role;
      const std::string why = "gone when every op runs with in_place=0 on the same values: caused by writing in place";
      f.note = f.note.empty() ? why : f.note + "; " + why;
    }
    for (const auto& note : set_notes_) notes_.push_back(note);
    for (const auto& note : notes_) result_.notes += (result_.notes.empty() ? "" : "; ") + note;
    result_.summarize();
    return std::move(result_);
  }

  const CaseSpec& spec_;
  Backend& backend_;
  const RunOptions& options_;
  const at::ScalarType dtype_;
  /// RunOptions::trace, where the case can be traced (one process).
  const bool trace_;
  CaseResult result_;
  PreparedCase prepared_;
  ToleranceContext context_;
  std::vector<PathRequest> requests_;
  std::vector<PathRequest> single_pass_;
  std::vector<PathRun> runs_;
  std::vector<const PathRun*> active_;
  at::Device ref_device_ = at::kCPU;
  /// The case's float64 references, one per set of quantization points its paths have
  /// (ReferenceSet): sets_[0] the basic ops' (the unfused path's, and every path's where no
  /// fused op quantizes elsewhere), then one per other set a path's plans give. `ref_` is the
  /// set the reference and evidence stages work on (sets_[0] outside them).
  std::vector<std::unique_ptr<ReferenceSet>> sets_;
  ReferenceSet* ref_ = nullptr;
  /// Path name -> index into sets_ (absent: 0).
  std::map<std::string, size_t> path_sets_;
  /// What each further reference set is, for the case's notes.
  std::vector<std::string> set_notes_;
  /// Findings the in-place ablation attributes to the in-place ops (their types, joined).
  std::vector<size_t> in_place_caused_;
  std::string in_place_writers_;
  /// The spec the low-precision evidence is measured against: the case's, or with the input
  /// requiring grad when a repeat call takes its gradient (decided by sets_[0]).
  CaseSpec evidence_spec_;
  at::Generator sample_generator_;
  at::Generator noise_generator_;
  /// The last evidence round judge_values compared with (-1: no evidence gathered).
  int evidence_rounds_ = -1;
  /// The parent run's evidence, for the in-place ablation's rerun (EvidenceCarry).
  const EvidenceCarry* carried_evidence_ = nullptr;
  /// The basic ops' references ran (reference_of_first_set).
  bool first_reference_done_ = false;
  /// Evidence drawn while the backend ran the paths (overlap_with_paths).
  Speculation speculation_;
  /// FP8 quantization of the reference (ops/quantization.h): the case's recipe, parsed, and
  /// whether any reference evaluation quantizes (a recipe, or an activation caching its
  /// input in FP8).
  std::optional<ops::QuantRecipe> recipe_;
  bool quantizes_ = false;
  /// A distributed case's layouts (harness/sharding.h); the paths come back assembled.
  std::optional<harness::ShardingPlan> sharding_;
  oracle::RoundingEvidence evidence_;
  std::vector<std::string> notes_;
};

CaseResult run_case_impl(const CaseSpec& spec, Backend& backend, const RunOptions& options,
                         const EvidenceCarry* carried_evidence) {
  return CaseRun(spec, backend, options, carried_evidence).run();
}

}  // namespace

namespace {
/// The model backend (its fuser's plans) with the FP8 capabilities of the backend a script
/// is written for: the evidence then holds the paths to that backend's FP8 rounding and
/// GEMM accumulation, as replay there does.
class WithTargetFp8 final : public Backend {
 public:
  WithTargetFp8(Backend& inner, const BackendCapabilities& target) : inner_(inner), caps_(inner.capabilities()) {
    caps_.fp8_reference_exact = target.fp8_reference_exact;
    caps_.fp8_gemm_accumulation = target.fp8_gemm_accumulation;
  }
  std::string name() const override { return inner_.name(); }
  const BackendCapabilities& capabilities() override { return caps_; }
  std::vector<PathRun> run_paths(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                 const std::vector<PathRequest>& paths) override {
    return inner_.run_paths(spec, plan, tensors, paths);
  }

 private:
  Backend& inner_;
  BackendCapabilities caps_;
};
}  // namespace

Expectation judging_expectation(const CaseSpec& spec, const RunOptions& options, const std::vector<PathRequest>& paths,
                                const BackendCapabilities* target) {
  // Runs only the first call of `paths` under a recipe, for their plans (plan_path_sets).
  thread_local ModelBackend model;
  if (target == nullptr) return CaseRun(spec, model, options).expectation(paths);
  WithTargetFp8 backend(model, *target);
  return CaseRun(spec, backend, options).expectation(paths);
}

std::optional<oracle::CaseBounds> judging_bounds(const CaseSpec& spec, const RunOptions& options) {
  return judging_expectation(spec, options).bounds;
}

}  // namespace gradfuzz::runner
