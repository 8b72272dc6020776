#include "oracle/oracle.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

// Comparisons. What a tensor may be off by is a TensorBound computed elsewhere: the static
// tolerances (oracle/tolerances.h) for float64 and as the first, cheap check of every dtype,
// the low-precision rule's bounds (oracle/rounding.h) once a case fails that check.

namespace gradfuzz::oracle {

namespace {

std::vector<int64_t> unravel(int64_t flat, at::IntArrayRef shape) {
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 0) break;
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

at::Tensor as_double_cpu(const at::Tensor& t) {
  return t.detach().to(at::TensorOptions().dtype(at::kDouble).device(at::kCPU)).contiguous();
}

std::string shape_text(at::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

Finding base(const std::string& path_pair, const std::string& tensor, const std::string& role,
             const TensorBound& bound) {
  Finding d;
  d.path_pair = path_pair;
  d.tensor = tensor;
  d.role = role;
  d.atol = bound.atol;
  d.rtol = bound.rtol;
  return d;
}

std::string channel_label(size_t fuser, const std::string& channel) {
  return "grad_channel[" + channel + (fuser == 0 ? "" : "@fuser" + std::to_string(fuser)) + "]";
}

at::Tensor output_at(const PathRun* run, size_t i) {
  return run && i < run->outputs.size() ? run->outputs[i] : at::Tensor();
}
at::Tensor grad_param_at(const PathRun* run, size_t i, size_t j) {
  return run && i < run->grad_params.size() && j < run->grad_params[i].size() ? run->grad_params[i][j] : at::Tensor();
}
at::Tensor grad_extra_at(const PathRun* run, size_t k) {
  return run && k < run->grad_extra_inputs.size() ? run->grad_extra_inputs[k] : at::Tensor();
}
bool has_channel(const PathRun* run, size_t f, const std::string& channel) {
  return run && f < run->channel_grads.size() && run->channel_grads[f].count(channel) > 0;
}
at::Tensor channel_grad_at(const PathRun* run, size_t f, const std::string& channel) {
  if (!has_channel(run, f, channel)) return at::Tensor();
  return run->channel_grads[f].at(channel);
}

}  // namespace

TensorBound CaseBounds::bound(const std::string& tensor) const {
  auto it = tensors.find(tensor);
  if (it != tensors.end()) return it->second;
  TensorBound b;
  b.atol = fallback.atol;
  b.rtol = fallback.rtol;
  return b;
}

void Comparer::compare(const std::string& path_pair, const std::string& tensor, const std::string& role,
                       const at::Tensor& expected_in, const at::Tensor& got_in, bool gradient,
                       const TensorBound& bound) {
  if (!expected_in.defined() && !got_in.defined()) return;
  if (!got_in.defined()) {
    const at::Tensor expected = as_double_cpu(expected_in);
    if (expected.numel() == 0) return;
    const double* e = expected.const_data_ptr<double>();
    int64_t worst = 0;
    double worst_abs = -1;
    for (int64_t k = 0; k < expected.numel(); ++k) {
      const double a = std::isnan(e[k]) ? std::numeric_limits<double>::infinity() : std::abs(e[k]);
      if (a > worst_abs) {
        worst_abs = a;
        worst = k;
      }
    }
    if (gradient && worst_abs == 0) return;  // none for an all-zero gradient is right
    Finding d = base(path_pair, tensor, role, bound);
    d.kind = gradient ? VerdictKind::kMissingGradient : VerdictKind::kMismatch;
    d.index = unravel(worst, expected.sizes());
    d.expected = e[worst];
    d.got = 0;
    d.max_abs_err = worst_abs;
    d.max_rel_err = 1;
    d.scale = worst_abs;
    d.note = gradient ? "no gradient returned" : "missing";
    findings_.push_back(std::move(d));
    if (!gradient) notes_.push_back(path_pair + ": " + tensor + " missing");
    return;
  }
  const at::Tensor got = as_double_cpu(got_in);
  const at::Tensor expected = expected_in.defined() ? as_double_cpu(expected_in) : at::zeros_like(got);
  if (!expected_in.defined() && !gradient) notes_.push_back(path_pair + ": " + tensor + " returned but not expected");
  if (got.sizes() != expected.sizes()) {
    Finding d = base(path_pair, tensor, role, bound);
    d.max_abs_err = std::numeric_limits<double>::infinity();
    d.max_rel_err = std::numeric_limits<double>::infinity();
    d.note = "shape " + shape_text(got.sizes()) + ", expected " + shape_text(expected.sizes());
    findings_.push_back(std::move(d));
    notes_.push_back(path_pair + ": " + tensor + " has shape " + shape_text(got.sizes()) + ", expected " +
                     shape_text(expected.sizes()));
    return;
  }
  const int64_t n = got.numel();
  if (n == 0) return;
  at::Tensor allowance;
  if (bound.allowance.defined() && bound.allowance.sizes() == got.sizes()) allowance = as_double_cpu(bound.allowance);
  const double* g = got.const_data_ptr<double>();
  const double* e = expected.const_data_ptr<double>();
  const double* a = allowance.defined() ? allowance.const_data_ptr<double>() : nullptr;
  double sum_squares = 0;
  for (int64_t k = 0; k < n; ++k) sum_squares += std::isfinite(e[k]) ? e[k] * e[k] : 0.0;
  const double rms = std::sqrt(sum_squares / static_cast<double>(n));
  const double atol = effective_atol({bound.rtol, bound.atol}, rms);
  // Worst element by excess over its bound; non-finite values are infinitely bad, except
  // where the allowance is infinite (the dtype's own reference is not finite there).
  int64_t worst = -1;
  double worst_excess = 0;
  double max_abs = 0;
  double max_rel = 0;
  double scale = 0;
  double err_squares = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (std::isfinite(e[k])) scale = std::max(scale, std::abs(e[k]));
    const double extra = a ? a[k] : 0.0;
    if (std::isinf(extra)) continue;
    const double allowed = atol + bound.rtol * std::abs(e[k]) + extra;
    const bool finite = std::isfinite(g[k]) && std::isfinite(e[k]);
    const double diff = finite ? std::abs(g[k] - e[k]) : std::numeric_limits<double>::infinity();
    const double excess = finite ? diff - allowed : std::numeric_limits<double>::infinity();
    if (finite) err_squares += diff * diff;
    max_abs = std::max(max_abs, diff);
    max_rel = std::max(max_rel, diff / std::max(std::abs(e[k]), std::numeric_limits<double>::min()));
    if (excess > 0 && (worst < 0 || excess > worst_excess)) {
      worst = k;
      worst_excess = excess;
    }
  }
  const double norm_err = std::sqrt(err_squares);
  const bool norm_fails = std::isfinite(bound.norm_bound) && norm_err > bound.norm_bound;
  if (worst < 0 && !norm_fails) return;
  if (worst < 0) {
    // Within every element's bound, but too far as a whole: report the largest error.
    double largest = -1;
    for (int64_t k = 0; k < n; ++k) {
      const double diff = std::abs(g[k] - e[k]);
      if (std::isfinite(diff) && diff > largest && !(a && std::isinf(a[k]))) {
        largest = diff;
        worst = k;
      }
    }
  }
  Finding d = base(path_pair, tensor, role, bound);
  d.atol = atol;
  d.index = unravel(worst, got.sizes());
  d.expected = e[worst];
  d.got = g[worst];
  d.max_abs_err = max_abs;
  d.max_rel_err = max_rel;
  d.scale = scale;
  if (a) d.rounding = a[worst];
  if (std::isfinite(bound.norm_bound)) {
    d.norm_err = norm_err;
    d.norm_bound = bound.norm_bound;
  }
  if (norm_fails && worst_excess <= 0) d.note = "every element within its bound, the tensor as a whole not";
  findings_.push_back(std::move(d));
}

double error_norm(const at::Tensor& expected_in, const at::Tensor& got_in) {
  if (!expected_in.defined()) return 0;
  const at::Tensor expected = as_double_cpu(expected_in);
  const at::Tensor got = got_in.defined() ? as_double_cpu(got_in) : at::zeros_like(expected);
  if (got.sizes() != expected.sizes()) return std::numeric_limits<double>::infinity();
  at::Tensor diff = got - expected;
  diff = at::where(diff.isfinite(), diff, at::zeros_like(diff));
  return diff.norm().item<double>();
}

std::vector<ComparedTensor> compared_tensors(const CaseSpec& spec, const PathRun& expected, const PathRun& got,
                                             bool got_exposes_all_channels) {
  std::vector<ComparedTensor> out;
  const size_t n_outputs = std::max(expected.outputs.size(), got.outputs.size());
  for (size_t i = 0; i < n_outputs; ++i) {
    out.push_back({i == 0 ? "output" : "extra_output[" + std::to_string(i - 1) + "]",
                   i == 0 ? "output" : "extra_output", output_at(&expected, i), output_at(&got, i), false});
  }
  out.push_back({"grad_input", "grad_input", expected.grad_input, got.grad_input, true});
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const size_t n = std::max(i < expected.grad_params.size() ? expected.grad_params[i].size() : 0,
                              i < got.grad_params.size() ? got.grad_params[i].size() : 0);
    for (size_t j = 0; j < n; ++j) {
      out.push_back({"grad_param[" + std::to_string(i) + "]." + spec.ops[i].name + "[" + std::to_string(j) + "]",
                     "grad_param", grad_param_at(&expected, i, j), grad_param_at(&got, i, j), true});
    }
  }
  const size_t n_extra = std::max(expected.grad_extra_inputs.size(), got.grad_extra_inputs.size());
  for (size_t k = 0; k < n_extra; ++k) {
    out.push_back({"grad_extra_input[" + std::to_string(k) + "]", "grad_extra_input", grad_extra_at(&expected, k),
                   grad_extra_at(&got, k), true});
  }
  // Channels: only those the expected side has a gradient for. A channel the expected side
  // leaves out has a value that does not require grad there (a fuser may still trace a
  // gradient for it, e.g. Dispatch probs from logits that do not require grad). A backend
  // that exposes only some channels (te: where the producer's backward group holds none of
  // the consumers) is judged on those.
  for (size_t f = 0; f < expected.channel_grads.size(); ++f) {
    for (const auto& [channel, e] : expected.channel_grads[f]) {
      if (!got_exposes_all_channels && !has_channel(&got, f, channel)) continue;
      out.push_back({channel_label(f, channel), "grad_channel", e, channel_grad_at(&got, f, channel), true});
    }
  }
  return out;
}

std::string trace_name(const harness::TraceEntry& entry) {
  return entry.pass == "forward" ? "trace.forward[" + std::to_string(entry.group.end - 1) + "]"
                                 : "trace.backward[" + std::to_string(entry.group.begin) + "]";
}

std::string trace_name(const harness::TraceEntry& entry, const harness::TraceEntry::Extra& extra) {
  return entry.pass == "forward"
             ? "trace.forward[" + std::to_string(extra.op) + "].extra_output[" + std::to_string(extra.slot) + "]"
             : "trace.backward[" + std::to_string(extra.op) + "].grad_extra_input[" + std::to_string(extra.slot) + "]";
}

std::map<std::string, at::Tensor> trace_tensors(const PathRun& run) {
  std::map<std::string, at::Tensor> out;
  for (const auto& e : run.trace) {
    if (e.tensor.defined()) out[trace_name(e)] = e.tensor;
    for (const auto& x : e.extras) {
      if (x.tensor.defined()) out[trace_name(e, x)] = x.tensor;
    }
  }
  return out;
}

std::map<std::string, at::Tensor> tensors_by_name(const CaseSpec& spec, const PathRun& run) {
  std::map<std::string, at::Tensor> out;
  for (auto& t : compared_tensors(spec, run, run)) out[t.name] = t.expected;
  for (auto& [name, t] : trace_tensors(run)) out[name] = t;
  return out;
}

void compare_paths(const std::string& path_pair, const CaseSpec& spec, const PathRun& expected, const PathRun& got,
                   const CaseBounds& bounds, Comparer& comparer, bool got_exposes_all_channels) {
  for (const auto& t : compared_tensors(spec, expected, got, got_exposes_all_channels)) {
    comparer.compare(path_pair, t.name, t.role, t.expected, t.got, t.gradient, bounds.bound(t.name));
  }
}

PathRun expected_for_call(const PathRun& reference, const at::Tensor& grad_input, const RepeatCall& call) {
  PathRun expected;
  expected.name = reference.name;
  expected.outputs = reference.outputs;
  if (call.no_grad) return expected;
  if (call.input_requires_grad) expected.grad_input = grad_input;
  expected.grad_params = reference.grad_params;
  expected.grad_extra_inputs = reference.grad_extra_inputs;
  return expected;
}

namespace {

std::string plan_text(const std::vector<PlanGroup>& groups) {
  std::string text;
  for (const auto& g : groups) {
    text += (text.empty() ? "" : " ") + g.name + "[" + std::to_string(g.begin) + "," + std::to_string(g.end) + ")";
  }
  return text.empty() ? "(none)" : text;
}

}  // namespace

void compare_plans(const PathRun& repeat, std::vector<Finding>& findings) {
  if (repeat.expected_plans.empty()) return;
  const size_t n = std::max(repeat.plans.size(), repeat.expected_plans.size());
  for (size_t f = 0; f < n; ++f) {
    const FuserPlans none;
    const FuserPlans& got = f < repeat.plans.size() ? repeat.plans[f] : none;
    const FuserPlans& want = f < repeat.expected_plans.size() ? repeat.expected_plans[f] : none;
    for (const auto& [pass, g, e] : {std::make_tuple("forward", &got.forward, &want.forward),
                                     std::make_tuple("backward", &got.backward, &want.backward)}) {
      if (*g == *e) continue;
      Finding d;
      d.kind = VerdictKind::kMismatch;
      d.path_pair = repeat.name + "~fresh_plans";
      d.tensor = "plan[fuser " + std::to_string(f) + "]." + pass;
      d.role = "plan";
      d.max_abs_err = std::numeric_limits<double>::infinity();
      d.max_rel_err = std::numeric_limits<double>::infinity();
      d.note = "fuser " + std::to_string(f) + " ran the " + pass + " plan " + plan_text(*g) +
               "; planned afresh for this call: " + plan_text(*e);
      findings.push_back(std::move(d));
    }
  }
}

void check_eval_graph(const CaseSpec& spec, const PathRun& repeat, std::vector<Finding>& findings) {
  std::string last;
  for (const auto& op : spec.ops) {
    if (op.name != harness::kBoundaryOp) last = op.name;
  }
  for (int64_t k : repeat.graph_outputs) {
    Finding d;
    d.op = last;
    d.kind = VerdictKind::kMismatch;
    d.path_pair = repeat.name + "~eval_pass";
    d.tensor = k == 0 ? "output" : "extra_output[" + std::to_string(k - 1) + "]";
    d.role = "eval_graph";
    d.max_abs_err = std::numeric_limits<double>::infinity();
    d.max_rel_err = std::numeric_limits<double>::infinity();
    d.note = "an evaluation pass (no_grad or inference_mode) returned " + d.tensor +
             " with an autograd graph (requires_grad or a grad_fn): the caller's eval output keeps the graph alive";
    findings.push_back(std::move(d));
  }
}

void check_fp8_state(const CaseSpec& spec, const PathRun& run, std::vector<Finding>& findings) {
  for (const auto& v : run.fp8_state_violations) {
    Finding d;
    d.kind = VerdictKind::kMismatch;
    d.path_pair = run.name + "~fp8_rule";
    d.tensor = "fp8_state[" + std::to_string(v.op) + "]." + v.quantizer + "." + v.what;
    d.role = "fp8_state";
    const bool known_op = v.op >= 0 && v.op < static_cast<int64_t>(spec.ops.size());
    d.op = known_op ? spec.ops[static_cast<size_t>(v.op)].name : "op" + std::to_string(v.op);
    // One cluster per pass and part of the rule (a defect of the forward update shows on the
    // input and weight quantizers alike); a lost checkpoint state is one whatever the pass.
    const std::string role = v.quantizer.substr(0, v.quantizer.find('['));
    // A state lost in a checkpoint round trip, or dropped or moved by a call with the recipe
    // off, is one cause whatever the pass.
    const bool checkpoint = v.what.rfind("checkpoint", 0) == 0 || v.what == "recipe_off";
    // A quantized weight the caller holds (held_quantized_tensor) is judged by its own reads,
    // a quantized tensor the backend made by its representation (codes, copies, dequantize).
    const bool held = role == "held_weight";
    const bool tensor = role == "quantized_tensor";
    d.option = held         ? "held." + v.what
               : tensor     ? "tensor." + v.what
               : checkpoint ? v.what
                            : (role == "grad_output" ? "backward." : "forward.") + v.what;
    d.max_abs_err = std::numeric_limits<double>::infinity();
    d.max_rel_err = std::numeric_limits<double>::infinity();
    d.note = (held     ? "the quantized weight the caller holds, " + v.quantizer + " of op "
              : tensor ? "a quantized tensor the backend made, " + v.quantizer + " of op "
                       : "delayed scaling's " + v.quantizer + " quantizer of op ") +
             std::to_string(v.op) + ": " + v.note;
    findings.push_back(std::move(d));
  }
}

bool all_finite(const PathRun& run) {
  auto finite = [](const at::Tensor& t) { return !t.defined() || t.isfinite().all().item<bool>(); };
  bool ok = std::all_of(run.outputs.begin(), run.outputs.end(), finite) && finite(run.grad_input) &&
            std::all_of(run.grad_extra_inputs.begin(), run.grad_extra_inputs.end(), finite);
  for (const auto& grads : run.grad_params) ok = ok && std::all_of(grads.begin(), grads.end(), finite);
  for (const auto& channels : run.channel_grads) {
    for (const auto& [name, grad] : channels) ok = ok && finite(grad);
  }
  return ok;
}

void check_caller_tensors(const PathRun& run, std::vector<Finding>& findings) {
  for (const auto& tensor : run.modified) {
    Finding d;
    d.kind = VerdictKind::kModifiedInput;
    d.path_pair = run.name + "~caller";
    d.tensor = tensor;
    d.role = tensor.substr(0, tensor.find('['));
    auto writer = run.modified_by.find(tensor);
    if (writer != run.modified_by.end()) {
      d.op = writer->second.group.name;
      d.note = "written during the " + writer->second.pass + " run of " + writer->second.group.name + " [" +
               std::to_string(writer->second.group.begin) + "," + std::to_string(writer->second.group.end) + ")";
    }
    findings.push_back(std::move(d));
  }
}

}  // namespace gradfuzz::oracle
