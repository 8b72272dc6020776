#include "runner/reference_set.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>

#include "harness/sharding.h"
#include "ops/errors.h"
#include "oracle/oracle.h"

namespace gradfuzz::runner {

using harness::BuildOptions;
using harness::BuildStage;
using harness::BuiltCase;
using harness::CasePlan;
using harness::CaseSpec;
using harness::CaseTensors;
using harness::PathRun;
using harness::PathStatus;
using harness::RepeatCall;

namespace {

/// Whether a repeat call of `spec` takes the main input's gradient.
bool repeat_wants_input_grad(const CaseSpec& spec) {
  return std::any_of(spec.repeat_calls.begin(), spec.repeat_calls.end(),
                     [](const RepeatCall& c) { return !c.no_grad && c.input_requires_grad; });
}

/// The float64 reference path (or, with another compute dtype, the rounding baseline): the
/// catalog's reference math under plain autograd, on the CPU, over the ops in `built`.
PathRun run_reference_path(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors, BuiltCase& built,
                           at::ScalarType compute_dtype, at::Device device, ops::KinkProbe* probe,
                           ops::ReferenceQuantization* quantization, bool no_grad, double noise_relative,
                           at::Generator* noise_generator, bool trace) {
  PathRun run;
  run.name = compute_dtype == at::kDouble ? "reference" : "rounding_baseline";
  BuildOptions build;
  build.call_then_bind = false;
  harness::run_guarded(run, [&] {
    // The unsharded math has no ranks to split over: what te.ops refuses on the case's
    // world (an indivisible split) the reference refuses alike, at the same step.
    if (const auto refused = harness::parallel_config_error(spec, plan)) {
      run.error_stage = refused->at_construction ? "op creation" : "forward";
      throw ops::InvalidArgumentError(refused->message);
    }
    try {
      harness::build_case(spec, plan, tensors, build, built);
    } catch (...) {
      run.error_stage = harness::build_stage_name(built.stage);
      throw;
    }
    run.error_stage = "forward";
    const auto options = at::TensorOptions().dtype(at::kDouble).device(at::kCPU);
    at::Tensor input = tensors.input.to(options, false, true).requires_grad_(spec.input_requires_grad);
    std::vector<at::Tensor> extras = harness::to_path(tensors.extra_inputs, tensors.extra_input_requires_grad, options);
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
  harness::create_ops(spec, plan, nullptr, build, built);
  copy_param_values(tensors, built);
  return built;
}

/// The backend's FP8 GEMM accumulation under `recipe` (capabilities.fp8_gemm_accumulation:
/// the GEMMs it lists for the recipe accumulate fast), or nullopt where the backend's GEMMs
/// are exact or the case has no recipe.
std::optional<ops::Fp8GemmAccumulation> gemm_accumulation(const std::optional<ops::QuantRecipe>& recipe,
                                                          const harness::BackendCapabilities& caps) {
  const auto& declared = caps.fp8_gemm_accumulation;
  if (!declared || !recipe) return std::nullopt;
  ops::Fp8GemmAccumulation model;
  model.fraction_bits = declared->fraction_bits;
  model.products_per_step = declared->products_per_step;
  model.promotion_products = declared->promotion_products;
  const auto fast = declared->fast_accumulation.find(recipe->name());
  if (fast != declared->fast_accumulation.end()) {
    for (const std::string& gemm : fast->second) {
      model.fast.push_back(gemm == "fprop"   ? ops::Fp8Gemm::kFprop
                           : gemm == "dgrad" ? ops::Fp8Gemm::kDgrad
                                             : ops::Fp8Gemm::kWgrad);
    }
  }
  return model;
}

}  // namespace

PreparedCase prepare_case(const CaseSpec& spec) {
  PreparedCase prepared;
  prepared.plan = harness::plan_case(spec);
  BuildOptions build;
  build.call_then_bind = false;
  harness::create_ops(spec, prepared.plan, nullptr, build, prepared.reference_ops);
  prepared.generator = at::detail::createCPUGenerator(spec.seed);
  prepared.tensors = harness::draw_case_tensors(spec, prepared.plan, harness::param_shapes(prepared.reference_ops.ops),
                                                prepared.generator);
  copy_param_values(prepared.tensors, prepared.reference_ops);
  return prepared;
}

std::optional<std::string> reference_error_kind(const CaseSpec& spec) {
  PathRun probe;
  PreparedCase prepared;
  harness::run_guarded(probe, [&] { prepared = prepare_case(spec); });
  if (!probe.ok()) return probe.error_kind;
  // The plain math on the CPU, quantizing nothing.
  ReferenceCase plain;
  plain.spec = &spec;
  plain.prepared = &prepared;
  const PathRun reference = ReferenceSet(plain).evaluate(prepared.tensors, at::kDouble);
  if (!reference.ok()) return reference.error_kind;
  return std::nullopt;
}

ReferenceCase reference_case(const CaseSpec& spec, const PreparedCase& prepared, std::optional<ops::QuantRecipe> recipe,
                             const harness::BackendCapabilities& caps, Trace trace) {
  ReferenceCase out;
  out.spec = &spec;
  out.prepared = &prepared;
  out.device = reference_device(spec, prepared.plan, prepared.tensors);
  out.quantizes = recipe.has_value() || std::any_of(spec.ops.begin(), spec.ops.end(), [](const harness::OpSpec& op) {
                    auto it = op.attrs.find("cache_quantized_input");
                    return it != op.attrs.end() && it->second == 1;
                  });
  out.accumulation = gemm_accumulation(recipe, caps);
  out.recipe = std::move(recipe);
  out.trace = trace;
  return out;
}

ReferenceSet::ReferenceSet(const ReferenceCase& reference_case, ops::QuantizationPoints points)
    : case_(reference_case), points_(std::move(points)), evidence_spec_(*reference_case.spec) {}

void ReferenceSet::run_references(BuiltCase& prepared_ops) { run_references(&prepared_ops, nullptr); }

void ReferenceSet::run_references(const ReferenceSet& first) { run_references(nullptr, &first); }

void ReferenceSet::run_references_alone() { run_references(nullptr, nullptr); }

void ReferenceSet::run_references(BuiltCase* prepared_ops, const ReferenceSet* first) {
  ran_ = true;
  const CaseSpec& spec = *case_.spec;
  const CaseTensors& values = case_.prepared->tensors;
  if (first != nullptr) evidence_spec_ = first->evidence_spec_;
  call_quantization_ = fresh_quantization({});
  reference_ = evaluate_call({spec, prepared_ops, call_quantization_.get()}, values, at::kDouble, {}, &reference_kinks_,
                             {}, case_.trace);
  if (reference_.ok() && (delayed() || std::any_of(spec.repeat_calls.begin(), spec.repeat_calls.end(),
                                                   [](const RepeatCall& c) { return c.update || c.recipe_off; }))) {
    repeat_references_ = run_repeats(values, at::kDouble, call_quantization_.get());
  }
  // A repeat call whose input requires grad when the first call's does not: the input's
  // gradient from a second reference run with it (a channel whose value then requires grad
  // has a gradient in that run that the first call must not be judged on). A further set
  // follows the first set's choice of the spec its evidence is measured against.
  repeat_grad_input_ = reference_.grad_input;
  const bool wants_input_grad = first == nullptr ? !spec.input_requires_grad && repeat_wants_input_grad(spec)
                                                 : evidence_spec_.input_requires_grad != spec.input_requires_grad;
  if (reference_.ok() && wants_input_grad) {
    CaseSpec with_input_grad = spec;
    with_input_grad.input_requires_grad = true;
    PathRun run = evaluate_call({with_input_grad}, values, at::kDouble, {}, nullptr, {}, case_.trace);
    if (run.ok()) {
      repeat_grad_input_ = run.grad_input;
      // The low-precision evidence then covers the input's gradient the repeat calls take.
      if (first == nullptr) evidence_spec_ = std::move(with_input_grad);
      evidence_reference_ = std::move(run);
    }
  }
}

bool ReferenceSet::delayed() const { return case_.recipe && case_.recipe->kind == ops::RecipeKind::kDelayedScaling; }

std::vector<PathRun> ReferenceSet::run_repeats(const CaseTensors& values, at::ScalarType dtype,
                                               ops::ReferenceQuantization* state) const {
  // Delayed scaling: call k quantizes with the scales calls 1..k-1 left in the histories, so
  // each repeat call has a reference of its own, in order, on one state. After an optimizer
  // step (RepeatCall::update) a call runs on the step's parameters: a reference of its own on
  // those values.
  const CaseSpec& spec = *case_.spec;
  std::vector<PathRun> runs;
  bool stepped = false;
  for (size_t k = 0; k < spec.repeat_calls.size(); ++k) {
    const RepeatCall& call = spec.repeat_calls[k];
    stepped = stepped || call.update;
    // A changed history length applies from this call on (the state's histories resized).
    if (delayed() && state != nullptr && call.amax_history_len > 0) state->set_amax_history_len(call.amax_history_len);
    if (!delayed() && !stepped && !call.recipe_off) {
      PathRun none;
      none.status = PathStatus::kSkipped;  // the first call's reference stands for it
      runs.push_back(std::move(none));
      continue;
    }
    CaseSpec call_spec = spec;
    call_spec.input_requires_grad = call.input_requires_grad;
    // A call with the recipe off runs in high precision and leaves the recipe's state alone.
    const std::unique_ptr<ops::ReferenceQuantization> off = call.recipe_off ? without_recipe() : nullptr;
    ops::ReferenceQuantization* call_state = off ? off.get() : delayed() ? state : nullptr;
    runs.push_back(evaluate_call({call_spec, nullptr, call_state, call.no_grad}, stepped ? values.for_call(k) : values,
                                 dtype, {}, nullptr, {}, Trace::kOff));
  }
  return runs;
}

std::vector<PathRun> ReferenceSet::evaluate_calls(const CaseTensors& values, at::ScalarType dtype,
                                                  const Quantization& quantization) const {
  std::vector<PathRun> runs;
  const std::unique_ptr<ops::ReferenceQuantization> state = fresh_quantization(quantization);
  runs.push_back(
      evaluate_call({evidence_spec_, nullptr, state.get()}, values, dtype, quantization, nullptr, {}, Trace::kOff));
  if (!runs.front().ok()) return runs;
  std::vector<PathRun> repeats = run_repeats(values, dtype, state.get());
  std::move(repeats.begin(), repeats.end(), std::back_inserter(runs));
  return runs;
}

PathRun ReferenceSet::evaluate(const CaseTensors& values, at::ScalarType dtype, const Quantization& quantization,
                               ops::KinkProbe* probe, const Noise& noise, Trace trace) const {
  return evaluate_call({evidence_spec_}, values, dtype, quantization, probe, noise, trace);
}

PathRun ReferenceSet::evaluate_call(const Call& call, const CaseTensors& values, at::ScalarType dtype,
                                    const Quantization& quantization, ops::KinkProbe* probe, const Noise& noise,
                                    Trace trace) const {
  BuiltCase fresh_ops;
  BuiltCase* ops = call.ops;
  if (ops == nullptr) {
    // The ops are the case's (the evidence spec differs from it in grad requirements only).
    PathRun creation;
    harness::run_guarded(creation,
                         [&] { fresh_ops = reference_ops_with_values(*case_.spec, case_.prepared->plan, values); });
    if (!creation.ok()) return creation;
    ops = &fresh_ops;
  }
  std::unique_ptr<ops::ReferenceQuantization> fresh_state;
  ops::ReferenceQuantization* state = call.state;
  if (state == nullptr) {
    // Every evaluation its own quantization state: each moves delayed-scaling histories.
    fresh_state = fresh_quantization(quantization);
    state = fresh_state.get();
  }
  return run_reference_path(call.spec, case_.prepared->plan, values, *ops, dtype, case_.device, probe, state,
                            call.no_grad, noise.relative, noise.generator, trace == Trace::kOn);
}

std::unique_ptr<ops::ReferenceQuantization> ReferenceSet::fresh_quantization(const Quantization& quantization) const {
  if (!case_.quantizes) return nullptr;
  auto q = case_.recipe ? std::make_unique<ops::ReferenceQuantization>(*case_.recipe)
                        : std::make_unique<ops::ReferenceQuantization>();
  // The quantization points of the paths this reference is for (empty: the basic ops').
  q->set_points(points_);
  // Windowed: only elements that a rounding difference can carry across an FP8 rounding
  // boundary move.
  if (quantization.jitter) {
    const Fp8Windows none;
    const Fp8Windows& windows = quantization.windows ? *quantization.windows : none;
    q->set_jitter(0.5, *quantization.jitter, windows.reference, windows.windows);
  }
  if (quantization.record) q->record_scaled(quantization.record);
  // On a backend whose FP8 GEMMs accumulate inexactly, a sample's GEMMs also err by their
  // accumulation term, up or down at random (the FP8 windows ask for `accumulation`).
  if (case_.accumulation) {
    if (quantization.jitter) {
      q->set_accumulation(*case_.accumulation, ops::AccumulationMode::kRandomSign, *quantization.jitter);
    } else if (quantization.accumulation != ops::AccumulationMode::kExact) {
      q->set_accumulation(*case_.accumulation, quantization.accumulation);
    }
  }
  return q;
}

std::unique_ptr<ops::ReferenceQuantization> ReferenceSet::without_recipe() const {
  if (!case_.quantizes) return nullptr;
  return std::make_unique<ops::ReferenceQuantization>();
}

PathRun ReferenceSet::expected_for_call(size_t k) const {
  const RepeatCall& call = case_.spec->repeat_calls.at(k);
  if (k < repeat_references_.size() && repeat_references_[k].ok()) {
    return oracle::expected_for_call(repeat_references_[k], repeat_references_[k].grad_input, call);
  }
  return oracle::expected_for_call(reference_, repeat_grad_input_, call);
}

std::map<std::string, at::Tensor> ReferenceSet::evidence_values() const {
  return oracle::tensors_by_name(evidence_spec_, evidence_reference());
}

}  // namespace gradfuzz::runner
