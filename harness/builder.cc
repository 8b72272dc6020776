#include "harness/builder.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "harness/dtype.h"
#include "ops/errors.h"

namespace gradfuzz::harness {

namespace {

/// Smallest magnitude of a drawn float value: keeps inputs away from the kinks of ReLU and
/// SReLU at 0 (and from sign flips under low-precision rounding).
constexpr double kMinMagnitude = 0.1;
/// Added to the largest router logit of each row so argmax has no near-ties (Dispatch).
constexpr double kRouterMargin = 1.0;

bool flag_at(const std::vector<bool>& flags, size_t i) { return i < flags.size() ? flags[i] : true; }

bool output_to_caller(const OpSpec& op, size_t slot) {
  if (slot >= op.output_bindings.size()) return true;
  const auto& binding = op.output_bindings[slot];
  return binding.channel ? binding.output_to_caller : true;
}

bool input_bound(const OpSpec& op, size_t slot) {
  return slot < op.input_channels.size() && op.input_channels[slot].has_value();
}

at::TensorOptions cpu_double() { return at::TensorOptions().dtype(at::kDouble).device(at::kCPU); }

/// N(0, 1) float64 CPU values from `generator`, each passed through `transform`. Drawn in a
/// host loop: a case's tensors hold tens of values, and a chain of ATen kernels per tensor
/// (randn, sign, abs, add, mul) cost more in dispatch than the draws themselves.
template <typename Transform>
at::Tensor normal_values(at::IntArrayRef shape, at::Generator& generator, Transform&& transform) {
  at::Tensor out = at::empty(shape, cpu_double());
  double* data = out.data_ptr<double>();
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(generator);
  std::lock_guard<std::mutex> lock(generator.mutex());
  at::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < out.numel(); ++i) data[i] = transform(normal(impl));
  return out;
}

at::Tensor standard_normal(at::IntArrayRef shape, at::Generator& generator) {
  return normal_values(shape, generator, [](double z) { return z; });
}

/// N(0, 1) values pushed away from zero: sign(z) * (kMinMagnitude + |z|).
at::Tensor away_from_zero(const std::vector<int64_t>& shape, at::Generator& generator) {
  return normal_values(shape, generator, [](double z) { return std::copysign(kMinMagnitude + std::abs(z), z); });
}

/// Random composition of `rows` into `groups` parts (zeros allowed).
at::Tensor split_sizes(int64_t rows, int64_t groups, at::Generator& generator) {
  auto long_cpu = at::TensorOptions().dtype(at::kLong).device(at::kCPU);
  if (groups <= 0) return at::empty({0}, long_cpu);
  at::Tensor cuts = at::randint(0, rows + 1, {groups - 1}, generator, long_cpu);
  cuts = std::get<0>(cuts.sort());
  at::Tensor bounds = at::cat({at::zeros({1}, long_cpu), cuts, at::full({1}, rows, long_cpu)});
  return bounds.slice(0, 1).sub(bounds.slice(0, 0, groups));
}

at::Tensor draw_slot(const OpSpec& op, int64_t slot, const ops::SlotSpec& slot_spec, int64_t rows, bool corrupt,
                     at::Generator& generator) {
  switch (slot_spec.kind) {
    case ops::TensorKind::kSplitSizes: {
      int64_t groups = slot_spec.shape.empty() ? 1 : slot_spec.shape[0];
      at::Tensor sizes = split_sizes(rows, groups, generator);
      // Invalid-configuration knob: one more row than there are, so the sizes do not sum.
      if (corrupt && sizes.numel() > 0) sizes[0] += 1;
      return sizes;
    }
    case ops::TensorKind::kRoutingMap:
      return at::randperm(rows, generator, at::TensorOptions().dtype(at::kLong).device(at::kCPU));
    case ops::TensorKind::kFloat:
      break;
  }
  at::Tensor values = away_from_zero(slot_spec.shape, generator);
  if (op.name == "Dispatch" && slot == 0 && values.dim() == 2 && values.size(1) > 0) {
    // Router logits: widen each row's winning margin so argmax is stable under rounding and
    // finite-difference steps.
    at::Tensor winners = values.argmax(1, /*keepdim=*/true);
    values.scatter_add_(1, winners, at::full(winners.sizes(), kRouterMargin, cpu_double()));
  }
  return values;
}

/// Rounds float64 values to `dtype` and back, so every path starts from the same numbers.
at::Tensor round_to(const at::Tensor& values, at::ScalarType dtype) {
  if (dtype == at::kDouble || !values.is_floating_point()) return values;
  return values.to(dtype).to(at::kDouble);
}

}  // namespace

CasePlan plan_case(const CaseSpec& spec) {
  const auto& registry = ops::OpRegistry::catalog();
  CasePlan plan;
  std::vector<int64_t> shape = spec.input_shape;
  int64_t max_length = 1;
  auto note = [&](const std::vector<int64_t>& dims) {
    for (int64_t d : dims) max_length = std::max(max_length, d);
  };
  note(shape);
  int64_t fuser = -1;
  int64_t ordinal = 0;
  bool previous_was_op = false;
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const OpSpec& op = spec.ops[i];
    OpPlan entry;
    entry.input_shape = shape;
    if (op.name == kBoundaryOp) {
      entry.boundary = true;
      entry.signature.output_shape = shape;
      previous_was_op = false;
    } else {
      if (!previous_was_op) ++fuser;
      previous_was_op = true;
      entry.fuser = fuser;
      entry.ordinal = ordinal++;
      entry.signature = registry.signature(op.name, op.attrs, shape);
      for (const auto& slot : entry.signature.extra_inputs) note(slot.shape);
      for (const auto& slot : entry.signature.extra_outputs) note(slot.shape);
      for (size_t s = 0; s < entry.signature.extra_inputs.size(); ++s) {
        if (input_bound(op, s)) continue;
        const auto& slot_spec = entry.signature.extra_inputs[s];
        plan.public_inputs.push_back(
            {static_cast<int64_t>(i), static_cast<int64_t>(s), slot_spec,
             slot_spec.kind == ops::TensorKind::kFloat && flag_at(op.extra_input_requires_grad, s)});
      }
      for (size_t s = 0; s < entry.signature.extra_outputs.size(); ++s) {
        if (!output_to_caller(op, s)) continue;
        plan.public_outputs.push_back(
            {static_cast<int64_t>(i), static_cast<int64_t>(s), entry.signature.extra_outputs[s], false});
      }
    }
    shape = entry.signature.output_shape;
    note(shape);
    plan.ops.push_back(std::move(entry));
  }
  plan.output_shape = shape;
  plan.num_fusers = fuser + 1;
  plan.max_reduction_length = max_length;
  return plan;
}

ParamShapes param_shapes(const std::vector<ops::BasicOpPtr>& ops) {
  ParamShapes shapes(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!ops[i]) continue;
    for (const auto& p : ops[i]->parameters()) shapes[i].push_back(p.sizes().vec());
  }
  return shapes;
}

CaseTensors draw_case_tensors(const CaseSpec& spec, const CasePlan& plan, const ParamShapes& shapes,
                              at::Generator& generator) {
  const at::ScalarType dtype = scalar_type_from_name(spec.dtype);
  const int64_t rows = spec.input_shape.empty() ? 0 : spec.input_shape[0];
  CaseTensors t;
  t.input = round_to(away_from_zero(spec.input_shape, generator), dtype);

  t.params.resize(spec.ops.size());
  t.param_requires_grad.resize(spec.ops.size());
  for (size_t i = 0; i < spec.ops.size() && i < shapes.size(); ++i) {
    for (size_t j = 0; j < shapes[i].size(); ++j) {
      const auto& shape = shapes[i][j];
      at::Tensor values;
      if (shape.size() >= 2) {
        // Weights: unit-variance outputs for unit-variance inputs (std 1/sqrt(fan_in)), so
        // magnitudes stay O(1) through a chain and tolerances keep their meaning.
        const double scale = 1.0 / std::sqrt(static_cast<double>(shape.back()));
        values = normal_values(shape, generator, [scale](double z) { return z * scale; });
      } else {
        // Vectors (bias, gamma, beta): non-zero, so no routing bug hides behind a zero.
        values = away_from_zero(shape, generator);
      }
      t.params[i].push_back(round_to(values, dtype));
      t.param_requires_grad[i].push_back(flag_at(spec.ops[i].param_requires_grad, j));
    }
  }

  for (const auto& slot : plan.public_inputs) {
    const OpSpec& op = spec.ops[static_cast<size_t>(slot.op)];
    // Rows as the op sees them: a Reshape earlier in the chain may have changed them.
    const int64_t op_rows = plan.ops[static_cast<size_t>(slot.op)].input_shape[0];
    t.extra_inputs.push_back(
        round_to(draw_slot(op, slot.slot, slot.slot_spec, op_rows, spec.corrupt_split_sizes, generator), dtype));
    t.extra_input_requires_grad.push_back(slot.requires_grad);
  }
  if (spec.extra_input_count_delta > 0) {
    // Surplus inputs: per-row floats, a plausible shape for any slot.
    for (int64_t k = 0; k < spec.extra_input_count_delta; ++k) {
      t.extra_inputs.push_back(round_to(away_from_zero({rows}, generator), dtype));
      t.extra_input_requires_grad.push_back(false);
    }
  } else if (spec.extra_input_count_delta < 0) {
    const auto drop = std::min<size_t>(static_cast<size_t>(-spec.extra_input_count_delta), t.extra_inputs.size());
    t.extra_inputs.resize(t.extra_inputs.size() - drop);
    t.extra_input_requires_grad.resize(t.extra_inputs.size());
  }

  // Cotangents: N(0, 1), never all ones (a ones cotangent hides transposition bugs).
  t.cotangents.push_back(round_to(standard_normal(plan.output_shape, generator), dtype));
  for (const auto& slot : plan.public_outputs) {
    if (slot.slot_spec.kind == ops::TensorKind::kFloat) {
      t.cotangents.push_back(round_to(standard_normal(slot.slot_spec.shape, generator), dtype));
    } else {
      t.cotangents.emplace_back();
    }
  }

  for (const auto& step : spec.call_then_bind) {
    const OpPlan& op_plan = plan.ops[static_cast<size_t>(step.op)];
    const OpSpec& op = spec.ops[static_cast<size_t>(step.op)];
    CallInputs call;
    call.input = round_to(away_from_zero(op_plan.input_shape, generator), dtype);
    for (size_t s = 0; s < op_plan.signature.extra_inputs.size(); ++s) {
      call.extra_inputs.push_back(
          round_to(draw_slot(op, static_cast<int64_t>(s), op_plan.signature.extra_inputs[s], op_plan.input_shape[0],
                             /*corrupt=*/false, generator),
                   dtype));
    }
    t.call_inputs.push_back(std::move(call));
  }
  // The optimizer steps' parameters: derived from the drawn ones, nothing more drawn.
  const std::vector<std::vector<at::Tensor>>* current = &t.params;
  t.step_params.reserve(spec.repeat_calls.size());
  for (const auto& call : spec.repeat_calls) {
    std::vector<std::vector<at::Tensor>> stepped;
    if (call.update) {
      for (const auto& op_params : *current) {
        std::vector<at::Tensor> next;
        for (const auto& p : op_params) next.push_back(step_param(p, dtype));
        stepped.push_back(std::move(next));
      }
    }
    t.step_params.push_back(std::move(stepped));
    if (call.update) current = &t.step_params.back();
  }
  return t;
}

at::Tensor step_param(const at::Tensor& previous, at::ScalarType dtype) {
  if (!previous.defined() || !previous.is_floating_point()) return previous;
  at::Tensor rolled = previous.reshape({-1}).roll(1).reshape(previous.sizes());
  return round_to(rolled * 0.5, dtype);
}

const std::vector<std::vector<at::Tensor>>& CaseTensors::params_of_call(size_t k) const {
  for (size_t j = std::min(k + 1, step_params.size()); j-- > 0;) {
    if (!step_params[j].empty()) return step_params[j];
  }
  return params;
}

CaseTensors CaseTensors::for_call(size_t k) const {
  CaseTensors out = *this;
  out.params = params_of_call(k);
  return out;
}

std::vector<at::Tensor> to_path(const std::vector<at::Tensor>& tensors, const std::vector<bool>& requires_grad,
                                const at::TensorOptions& options) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined()) {
      out.emplace_back();
    } else if (t.is_floating_point()) {
      at::Tensor copy = t.to(options, /*non_blocking=*/false, /*copy=*/true);
      out.push_back(copy.requires_grad_(i < requires_grad.size() && requires_grad[i]));
    } else {
      out.push_back(t.to(options.device(), t.scalar_type(), /*non_blocking=*/false, /*copy=*/true));
    }
  }
  return out;
}

const char* build_stage_name(BuildStage stage) {
  switch (stage) {
    case BuildStage::kCreate:
      return "op creation";
    case BuildStage::kCallThenBind:
      return "call-then-bind call";
    case BuildStage::kBind:
      return "binding";
    case BuildStage::kConstruct:
      return "Sequential construction";
    case BuildStage::kLateBind:
      return "late binding";
    case BuildStage::kDone:
      return "done";
  }
  return "unknown";
}

void create_ops(const CaseSpec& spec, const CasePlan& plan, const CaseTensors* tensors, const BuildOptions& options,
                BuiltCase& out) {
  const auto& registry = ops::OpRegistry::catalog();
  const auto tensor_options = at::TensorOptions().dtype(options.dtype).device(options.device);
  out.stage = BuildStage::kCreate;
  out.ops.assign(spec.ops.size(), nullptr);
  out.modules.clear();
  out.sequential.reset();
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const OpSpec& op_spec = spec.ops[i];
    if (plan.ops[i].boundary) {
      out.modules.emplace_back(ops::make_boundary());
      continue;
    }
    ops::BasicOpPtr op = registry.create(op_spec.name, op_spec.attrs, plan.ops[i].input_shape, tensor_options);
    op->set_output_style(op_spec.output_style);
    auto params = op->parameters();
    {
      at::NoGradGuard no_grad;
      for (size_t j = 0; j < params.size(); ++j) {
        if (tensors && j < tensors->params[i].size()) params[j].copy_(tensors->params[i][j]);
      }
    }
    for (size_t j = 0; j < params.size(); ++j) params[j].requires_grad_(flag_at(op_spec.param_requires_grad, j));
    out.ops[i] = op;
    out.modules.emplace_back(op);
  }
}

void build_case(const CaseSpec& spec, const CasePlan& /*plan*/, const CaseTensors& tensors, const BuildOptions& options,
                BuiltCase& out) {
  const auto tensor_options = at::TensorOptions().dtype(options.dtype).device(options.device);
  if (options.call_then_bind) {
    out.stage = BuildStage::kCallThenBind;
    for (size_t k = 0; k < spec.call_then_bind.size(); ++k) {
      const auto& step = spec.call_then_bind[k];
      const auto& call = tensors.call_inputs[k];
      at::AutoGradMode grad_mode(step.grad_mode);
      at::Tensor input = call.input.to(tensor_options, false, true).requires_grad_(step.grad_mode);
      std::vector<bool> grads(call.extra_inputs.size(), step.grad_mode);
      auto extras = to_path(call.extra_inputs, grads, tensor_options);
      (*out.ops[static_cast<size_t>(step.op)])(input, extras);
    }
  }

  out.stage = BuildStage::kBind;
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const auto& op = out.ops[i];
    if (!op) continue;
    const OpSpec& op_spec = spec.ops[i];
    for (size_t s = 0; s < op_spec.input_channels.size(); ++s) {
      if (op_spec.input_channels[s]) op->set_extra_input_channel(static_cast<int64_t>(s), op_spec.input_channels[s]);
    }
    for (size_t s = 0; s < op_spec.output_bindings.size(); ++s) {
      const auto& binding = op_spec.output_bindings[s];
      if (binding.channel) {
        op->set_extra_output_channel(static_cast<int64_t>(s), binding.channel, binding.output_to_caller);
      }
    }
  }

  out.stage = BuildStage::kConstruct;
  out.locked_before_construct.assign(spec.ops.size(), false);
  for (size_t i = 0; i < spec.ops.size(); ++i) out.locked_before_construct[i] = out.ops[i] && out.ops[i]->locked();
  out.sequential = std::make_shared<ops::Sequential>(out.modules, options.fusions);

  out.stage = BuildStage::kLateBind;
  for (const auto& step : spec.late_binds) {
    out.ops[static_cast<size_t>(step.op)]->set_extra_input_channel(step.slot, step.channel);
  }
  out.stage = BuildStage::kDone;
}

}  // namespace gradfuzz::harness
