#include "backends/backend.h"

#include <ATen/Context.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "backends/model_backend.h"
#include "backends/remote_backend.h"
#include "backends/wire.h"

namespace gradfuzz::backends {

using harness::OpPlan;

namespace {

using nlohmann::json;

const char* kind_name(ops::TensorKind kind) {
  switch (kind) {
    case ops::TensorKind::kFloat:
      return "float";
    case ops::TensorKind::kSplitSizes:
      return "split_sizes";
    case ops::TensorKind::kRoutingMap:
      return "routing_map";
  }
  return "float";
}

json slots_json(const std::vector<ops::SlotSpec>& slots) {
  json out = json::array();
  for (const auto& s : slots) out.push_back({{"kind", kind_name(s.kind)}, {"shape", s.shape}});
  return out;
}

/// Floating values travel as float64 (docs/BACKENDS.md): already rounded to the case dtype.
at::Tensor wire_value(const at::Tensor& t) {
  if (!t.defined()) return t;
  at::Tensor cpu = t.detach().to(at::kCPU);
  return cpu.is_floating_point() ? cpu.to(at::kDouble) : cpu.to(at::kLong);
}

}  // namespace

void Backend::set_fault(const std::string& name) {
  if (!name.empty())
    throw std::invalid_argument("the " + this->name() + " backend has no planted fault '" + name + "'");
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.name == "model") return std::make_unique<ModelBackend>();
  if (options.name == "te" || options.name == "torch") return std::make_unique<RemoteBackend>(options);
  throw std::invalid_argument("unknown backend '" + options.name + "'; known backends: model, te, torch");
}

json case_request_json(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                       std::vector<at::Tensor>& out) {
  const auto& registry = ops::OpRegistry::catalog();
  json plan_ops = json::array();
  json params = json::array();
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    const OpPlan& op = plan.ops[i];
    json entry{{"fuser", op.fuser},
               {"input_shape", op.input_shape},
               {"output_shape", op.signature.output_shape},
               {"extra_inputs", slots_json(op.signature.extra_inputs)},
               {"extra_outputs", slots_json(op.signature.extra_outputs)}};
    json shapes = json::array();
    json refs = json::array();
    if (i < tensors.params.size()) {
      for (const auto& p : tensors.params[i]) {
        shapes.push_back(p.sizes().vec());
        refs.push_back(wire::add_tensor(out, wire_value(p)));
      }
    }
    entry["param_shapes"] = shapes;
    if (!op.boundary) {
      ops::OpAttrs attrs = registry.info(spec.ops[i].name).defaults;
      for (const auto& [k, v] : spec.ops[i].attrs) attrs[k] = v;
      entry["attrs"] = attrs;
    } else {
      entry["attrs"] = json::object();
    }
    plan_ops.push_back(std::move(entry));
    params.push_back(std::move(refs));
  }
  json public_inputs = json::array();
  for (const auto& s : plan.public_inputs) public_inputs.push_back({s.op, s.slot});
  json public_outputs = json::array();
  for (const auto& s : plan.public_outputs) public_outputs.push_back({s.op, s.slot});

  json values;
  values["input"] = wire::add_tensor(out, wire_value(tensors.input));
  values["params"] = std::move(params);
  json extras = json::array();
  for (const auto& t : tensors.extra_inputs) extras.push_back(wire::add_tensor(out, wire_value(t)));
  values["extra_inputs"] = std::move(extras);
  values["extra_input_requires_grad"] = tensors.extra_input_requires_grad;
  json cotangents = json::array();
  for (const auto& t : tensors.cotangents) cotangents.push_back(wire::add_tensor(out, wire_value(t)));
  values["cotangents"] = std::move(cotangents);
  json calls = json::array();
  for (const auto& call : tensors.call_inputs) {
    json call_extras = json::array();
    for (const auto& t : call.extra_inputs) call_extras.push_back(wire::add_tensor(out, wire_value(t)));
    calls.push_back({{"input", wire::add_tensor(out, wire_value(call.input))}, {"extra_inputs", call_extras}});
  }
  values["call_inputs"] = std::move(calls);
  if (std::any_of(tensors.step_params.begin(), tensors.step_params.end(), [](const auto& s) { return !s.empty(); })) {
    // Per repeat call: null, or per op the parameters its optimizer step writes (RepeatCall::update).
    json steps = json::array();
    for (const auto& step : tensors.step_params) {
      if (step.empty()) {
        steps.push_back(nullptr);
        continue;
      }
      json per_op = json::array();
      for (const auto& op_params : step) {
        json refs = json::array();
        for (const auto& p : op_params) refs.push_back(wire::add_tensor(out, wire_value(p)));
        per_op.push_back(std::move(refs));
      }
      steps.push_back(std::move(per_op));
    }
    values["step_params"] = std::move(steps);
  }

  return json{{"spec", spec},
              {"plan", {{"ops", plan_ops}, {"public_inputs", public_inputs}, {"public_outputs", public_outputs}}},
              {"values", values}};
}

namespace {
/// The runs of a backend that ran them when asked.
class ReadyPaths final : public PendingPaths {
 public:
  explicit ReadyPaths(std::vector<PathRun> runs) : runs_(std::move(runs)) {}
  bool ready() override { return true; }
  std::vector<PathRun> get() override { return std::move(runs_); }

 private:
  std::vector<PathRun> runs_;
};
}  // namespace

std::unique_ptr<PendingPaths> Backend::start_paths(const CaseSpec& spec, const CasePlan& plan,
                                                   const CaseTensors& tensors, const std::vector<PathRequest>& paths) {
  return std::make_unique<ReadyPaths>(run_paths(spec, plan, tensors, paths));
}

}  // namespace gradfuzz::backends
