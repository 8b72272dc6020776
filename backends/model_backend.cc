#include "backends/model_backend.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>

#include "harness/dtype.h"
#include "ops/fuser.h"
#include "ops/fusion_registry.h"
#include "ops/op_registry.h"

namespace gradfuzz::backends {

using harness::any_fused;
using harness::build_case;
using harness::build_stage_name;
using harness::BuildOptions;
using harness::BuildStage;
using harness::BuiltCase;
using harness::create_ops;
using harness::fired_each_of;
using harness::RepeatCall;
using harness::run_guarded;
using harness::scalar_type_from_name;
using harness::to_path;

namespace {

/// Spec op indices of each fuser's basic ops, in order.
std::vector<std::vector<int64_t>> fuser_members(const CasePlan& plan) {
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(plan.num_fusers));
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    if (plan.ops[i].fuser >= 0) members[static_cast<size_t>(plan.ops[i].fuser)].push_back(static_cast<int64_t>(i));
  }
  return members;
}

std::vector<PlanGroup> to_spec_indices(const std::vector<ops::PlanEntry>& entries,
                                       const std::vector<int64_t>& members) {
  std::vector<PlanGroup> out;
  for (const auto& e : entries) {
    PlanGroup g;
    g.name = e.name;
    g.fused = e.fused;
    g.begin = e.begin < static_cast<int64_t>(members.size()) ? members[static_cast<size_t>(e.begin)] : e.begin;
    g.end = e.end > 0 && e.end <= static_cast<int64_t>(members.size()) ? members[static_cast<size_t>(e.end - 1)] + 1
                                                                       : e.end;
    out.push_back(std::move(g));
  }
  return out;
}

/// Copies of the caller-owned tensors a path receives, taken before it runs, and the check
/// that they still hold the same values afterwards.
class CallerTensors {
 public:
  void add(std::string name, const at::Tensor& given) {
    if (!given.defined()) return;
    names_.push_back(std::move(name));
    given_.push_back(given);
    pristine_.push_back(given.detach().clone());
  }

  std::vector<std::string> modified() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < given_.size(); ++i) {
      if (!at::equal(given_[i].detach(), pristine_[i])) out.push_back(names_[i]);
    }
    return out;
  }

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> given_;
  std::vector<at::Tensor> pristine_;
};

/// Loss cotangents: only floating outputs that require grad take part; each gets its own
/// copy (so no path can change what the next one sees).
void collect_loss_terms(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& cotangents,
                        std::vector<at::Tensor>& loss_outputs, std::vector<at::Tensor>& loss_cotangents,
                        CallerTensors& caller) {
  for (size_t i = 0; i < outputs.size() && i < cotangents.size(); ++i) {
    const at::Tensor& out = outputs[i];
    const at::Tensor& cot = cotangents[i];
    if (!out.defined() || !cot.defined() || !out.is_floating_point() || !out.requires_grad()) continue;
    if (out.sizes() != cot.sizes()) continue;  // a shape bug; reported by the output comparison
    loss_outputs.push_back(out);
    loss_cotangents.push_back(cot.to(out.options(), /*non_blocking=*/false, /*copy=*/true));
    caller.add("cotangent[" + std::to_string(i) + "]", loss_cotangents.back());
  }
}

/// Runs one call of `sequential` (forward, then backward of the loss unless the call is
/// no_grad) with the case's values and puts its outputs and gradients into `into`.
/// `caller` (optional) records the caller-owned tensors it hands over.
void run_call(ops::Sequential& sequential, const BuiltCase& built, const CaseSpec& spec, const CaseTensors& tensors,
              const BuildOptions& build, const RepeatCall& call, PathRun& into, CallerTensors& caller) {
  into.error_stage = "forward";
  const auto options = at::TensorOptions().dtype(build.dtype).device(build.device);
  at::Tensor input = tensors.input.to(options, false, true).requires_grad_(call.input_requires_grad);
  std::vector<at::Tensor> extras = to_path(tensors.extra_inputs, tensors.extra_input_requires_grad, options);
  caller.add("input", input);
  for (size_t k = 0; k < extras.size(); ++k) caller.add("extra_input[" + std::to_string(k) + "]", extras[k]);
  into.grad_params.resize(spec.ops.size());
  into.grad_extra_inputs.resize(extras.size());
  if (call.no_grad) {
    at::NoGradGuard no_grad;
    into.outputs = sequential.forward(input, extras);
    return;
  }
  into.outputs = sequential.forward(input, extras);

  into.error_stage = "backward";
  // Autograd inputs: main input, parameters, public extra inputs that require grad.
  std::vector<at::Tensor> leaves;
  std::vector<std::pair<int64_t, int64_t>> where;  // (-1,0) input, (op, j) param, (-2, k) extra
  if (input.requires_grad()) {
    leaves.push_back(input);
    where.emplace_back(-1, 0);
  }
  for (size_t i = 0; i < built.ops.size(); ++i) {
    if (!built.ops[i]) continue;
    auto params = built.ops[i]->parameters();
    into.grad_params[i].resize(params.size());
    for (size_t j = 0; j < params.size(); ++j) {
      if (!params[j].requires_grad()) continue;
      leaves.push_back(params[j]);
      where.emplace_back(static_cast<int64_t>(i), static_cast<int64_t>(j));
    }
  }
  for (size_t k = 0; k < extras.size(); ++k) {
    if (!extras[k].defined() || !extras[k].requires_grad()) continue;
    leaves.push_back(extras[k]);
    where.emplace_back(-2, static_cast<int64_t>(k));
  }
  std::vector<at::Tensor> loss_outputs;
  std::vector<at::Tensor> loss_cotangents;
  collect_loss_terms(into.outputs, tensors.cotangents, loss_outputs, loss_cotangents, caller);
  if (leaves.empty() || loss_outputs.empty()) return;
  // Gradients of sum_i <output_i, cotangent_i>, without building the scalar loss.
  auto grads = torch::autograd::grad(loss_outputs, leaves, loss_cotangents, /*retain_graph=*/false,
                                     /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t n = 0; n < grads.size(); ++n) {
    const auto [kind, index] = where[n];
    if (kind == -1) {
      into.grad_input = grads[n];
    } else if (kind == -2) {
      into.grad_extra_inputs[static_cast<size_t>(index)] = grads[n];
    } else {
      into.grad_params[static_cast<size_t>(kind)][static_cast<size_t>(index)] = grads[n];
    }
  }
}

/// The plans each fuser of `sequential` ran its last call with, in spec op indices; with
/// `channel_grads`, also each fuser's channel gradients of that call.
void record_plans(const ops::Sequential& sequential, const CasePlan& plan, std::vector<FuserPlans>& plans,
                  std::vector<std::map<std::string, at::Tensor>>* channel_grads) {
  const auto members = fuser_members(plan);
  const auto& fusers = sequential.fusers();
  for (size_t f = 0; f < fusers.size() && f < members.size(); ++f) {
    auto trace = fusers[f]->last_trace();
    FuserPlans p;
    if (trace) {
      p.forward = to_spec_indices(trace->forward_plan, members[f]);
      p.backward = to_spec_indices(trace->backward_plan, members[f]);
    }
    plans.push_back(std::move(p));
    if (channel_grads) {
      channel_grads->push_back(trace ? trace->channel_grads : std::map<std::string, at::Tensor>{});
    }
  }
}

/// The group tensors each fuser of `sequential` recorded in its last call (ops::GroupTraceScope),
/// in spec op indices: every fuser's forward groups in order, then the backward groups in the
/// order backward ran them (the last fuser's first).
void record_trace(const ops::Sequential& sequential, const CasePlan& plan, std::vector<TraceEntry>& into) {
  const auto members = fuser_members(plan);
  const auto& fusers = sequential.fusers();
  using Extras = std::map<std::pair<int64_t, int64_t>, at::Tensor>;
  auto entry = [&](size_t f, const char* pass, const ops::PlanEntry& e, const at::Tensor& t, const Extras& extras) {
    TraceEntry out;
    out.pass = pass;
    out.fuser = static_cast<int64_t>(f);
    out.group = to_spec_indices({e}, members[f]).front();
    out.impl_class = e.name;
    out.method = pass;
    out.tensor = t;
    for (const auto& [slot, x] : extras) {
      if (slot.first >= e.begin && slot.first < e.end) {
        out.extras.push_back({members[f].at(static_cast<size_t>(slot.first)), slot.second, x, false});
      }
    }
    into.push_back(std::move(out));
  };
  for (size_t f = 0; f < fusers.size() && f < members.size(); ++f) {
    const auto trace = fusers[f]->last_trace();
    if (!trace) continue;
    for (const auto& [g, t] : trace->forward_outputs) {
      entry(f, "forward", trace->forward_plan.at(g), t, trace->forward_extra_outputs);
    }
  }
  for (size_t f = std::min(fusers.size(), members.size()); f-- > 0;) {
    const auto trace = fusers[f]->last_trace();
    if (!trace) continue;
    for (const auto& [g, t] : trace->backward_grad_inputs) {
      entry(f, "backward", trace->backward_plan.at(g), t, trace->backward_extra_grads);
    }
  }
}

/// For each fuser of `sequential`, the plans computed afresh (no fuser's cache) for the
/// first_op_requiring_backward its last call ran with: what a fresh Sequential plans for
/// that call. The backward plan only where that call ran backward (the trace has none else).
void record_fresh_plans(const ops::Sequential& sequential, const CasePlan& plan, std::vector<FuserPlans>& plans) {
  const auto members = fuser_members(plan);
  const auto& fusers = sequential.fusers();
  for (size_t f = 0; f < fusers.size() && f < members.size(); ++f) {
    auto trace = fusers[f]->last_trace();
    FuserPlans p;
    if (trace) {
      const ops::FusionPlans fresh =
          ops::make_fusion_plans(fusers[f]->ops(), fusers[f]->fusions(), trace->first_op_requiring_backward);
      p.forward = to_spec_indices(fresh.forward_entries, members[f]);
      if (trace->backward_ran) p.backward = to_spec_indices(fresh.backward_entries, members[f]);
    }
    plans.push_back(std::move(p));
  }
}

PathRun run_model_path(const PathRequest& request, const CaseSpec& spec, const CasePlan& plan,
                       const CaseTensors& tensors) {
  PathRun run;
  run.name = request.name;
  BuildOptions build;
  build.dtype = scalar_type_from_name(spec.dtype);
  build.device = spec.device == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  // Names the model lacks (a case recorded on another backend) are left out.
  const auto known = ops::FusionRegistry::catalog().names();
  std::vector<std::string> fusions;
  for (const auto& f : request.fusions) {
    if (std::find(known.begin(), known.end(), f) != known.end()) fusions.push_back(f);
  }
  build.fusions = ops::FusionRegistry::catalog().only(fusions);
  BuiltCase built;
  run_guarded(run, [&] {
    run.error_stage = build_stage_name(BuildStage::kCreate);
    create_ops(spec, plan, &tensors, build, built);
    try {
      build_case(spec, plan, tensors, build, built);
    } catch (...) {
      run.error_stage = build_stage_name(built.stage);
      throw;
    }
    CallerTensors caller;
    ops::GroupTraceScope tracing(request.trace);
    run_call(*built.sequential, built, spec, tensors, build, RepeatCall{false, spec.input_requires_grad}, run, caller);
    run.modified = caller.modified();
  });
  // Plans and channel gradients of whatever ran (a failed backward still leaves its forward plan).
  if (built.sequential) {
    std::vector<std::map<std::string, at::Tensor>> channel_grads;
    record_plans(*built.sequential, plan, run.plans, &channel_grads);
    if (request.trace) record_trace(*built.sequential, plan, run.trace);
    for (auto& grads : channel_grads) {
      run.channel_grads.push_back(run.ok() ? std::move(grads) : std::map<std::string, at::Tensor>{});
    }
  }
  // Ops that a failed Sequential construction left locked (they were unlocked before it).
  if (!run.ok() && built.stage == BuildStage::kConstruct) {
    for (size_t i = 0; i < built.ops.size(); ++i) {
      const bool before = i < built.locked_before_construct.size() && built.locked_before_construct[i];
      if (built.ops[i] && built.ops[i]->locked() && !before) run.left_locked.push_back(static_cast<int64_t>(i));
    }
  }
  // Further calls of the same Sequential (same fusers, plans cached per
  // first_op_requiring_backward), each against the plans computed afresh for that call.
  for (size_t k = 0; run.ok() && k < spec.repeat_calls.size(); ++k) {
    const RepeatCall& call = spec.repeat_calls[k];
    PathRun repeat;
    repeat.name = run.name + ".call[" + std::to_string(k + 1) + "]";
    run_guarded(repeat, [&] {
      if (call.update) {
        // The optimizer step: every parameter written in place with the step's values.
        at::NoGradGuard no_grad;
        const auto& stepped = tensors.step_params.at(k);
        for (size_t i = 0; i < built.ops.size() && i < stepped.size(); ++i) {
          if (!built.ops[i]) continue;
          const auto params = built.ops[i]->parameters();
          for (size_t j = 0; j < params.size() && j < stepped[i].size(); ++j) params[j].copy_(stepped[i][j]);
        }
      }
      CallerTensors caller;
      run_call(*built.sequential, built, spec, tensors, build, call, repeat, caller);
      repeat.modified = caller.modified();
      record_plans(*built.sequential, plan, repeat.plans, nullptr);
      if (!fusions.empty()) {
        repeat.error_stage = "the plan check";
        record_fresh_plans(*built.sequential, plan, repeat.expected_plans);
      }
    });
    if (!repeat.ok()) {
      // The whole path raised, at this call: its error is the path's.
      run.status = repeat.status;
      run.error_kind = repeat.error_kind;
      run.error_message = repeat.error_message;
      run.error_type = repeat.error_type;
      run.error_stage = repeat.name + " " + repeat.error_stage;
    }
    run.repeats.push_back(std::move(repeat));
  }
  return run;
}

}  // namespace

ModelBackend::ModelBackend() : capabilities_(model_capabilities()) {}

std::vector<PathRun> ModelBackend::run_paths(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                             const std::vector<PathRequest>& paths) {
  std::vector<PathRun> runs;
  for (const auto& request : paths) {
    if (spec.world_size > 1) {
      // The model's runtime is one process: it has no ranks to split a case over (its
      // capabilities say max_world_size 1, so the runner declines such cases first).
      PathRun declined;
      declined.name = request.name;
      declined.status = PathStatus::kUnsupported;
      declined.error_message = "the model backend runs one process; the case has " + std::to_string(spec.world_size) +
                               " ranks (use the torch or te backend)";
      runs.push_back(std::move(declined));
      continue;
    }
    const bool nothing_fused =
        request.skip_if_nothing_fused && !runs.empty() && runs.front().ok() && !any_fused(runs.front());
    const bool not_fired =
        !request.only_if_fired.empty() && (runs.empty() || !fired_each_of(runs.front(), request.only_if_fired));
    if (nothing_fused || not_fired) {
      PathRun skipped;
      skipped.name = request.name;
      skipped.status = PathStatus::kSkipped;
      runs.push_back(std::move(skipped));
      continue;
    }
    runs.push_back(run_model_path(request, spec, plan, tensors));
  }
  return runs;
}

}  // namespace gradfuzz::backends
