#include "oracle/oracle.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

// The rounding allowance. A static tolerance cannot know a case's conditioning (LayerNorm
// over two nearly equal features, a long bf16 reduction), so low-precision cases also get
// the reference rerun in the case's dtype (the "rounding baseline"); how far it lands from
// the float64 reference at each element is what the dtype itself costs there. A
// hand-written backward legitimately rounds differently from autograd's chain (another
// summation order, fused multiply-adds, a closed form that cancels where the chain does
// not: seen 19x on a float32 LayerNorm over two nearly equal features), and one baseline
// run is a single sample of that rounding, so each element may be off by `factor` times
// the baseline's error there. The allowance is per element and capped at a fraction of the
// tensor's own magnitude: the defects gradfuzz hunts (a dropped, doubled or misrouted
// gradient) are errors the size of the tensor, and no rounding may excuse those. (An
// earlier form added 32x the largest baseline error of the whole tensor to every element,
// which in bfloat16 exceeded the tensor's magnitude and let a misrouted gradient pass.)

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

TensorMismatch base(const std::string& path_pair, const std::string& tensor, const std::string& role,
                    const Tolerance& tolerance) {
  TensorMismatch d;
  d.path_pair = path_pair;
  d.tensor = tensor;
  d.role = role;
  d.atol = tolerance.atol;
  d.rtol = tolerance.rtol;
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

void Comparer::compare(const std::string& path_pair, const std::string& tensor, const std::string& role,
                       const at::Tensor& expected_in, const at::Tensor& got_in, bool gradient,
                       const Tolerance& tolerance, const at::Tensor& rounding_in) {
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
    TensorMismatch d = base(path_pair, tensor, role, tolerance);
    d.kind = gradient ? VerdictKind::kMissingGradient : VerdictKind::kMismatch;
    d.index = unravel(worst, expected.sizes());
    d.expected = e[worst];
    d.got = 0;
    d.max_abs_err = worst_abs;
    d.max_rel_err = 1;
    d.scale = worst_abs;
    details_.push_back(std::move(d));
    if (!gradient) notes_.push_back(path_pair + ": " + tensor + " missing");
    return;
  }
  const at::Tensor got = as_double_cpu(got_in);
  const at::Tensor expected = expected_in.defined() ? as_double_cpu(expected_in) : at::zeros_like(got);
  if (!expected_in.defined() && !gradient) notes_.push_back(path_pair + ": " + tensor + " returned but not expected");
  if (got.sizes() != expected.sizes()) {
    TensorMismatch d = base(path_pair, tensor, role, tolerance);
    d.max_abs_err = std::numeric_limits<double>::infinity();
    d.max_rel_err = std::numeric_limits<double>::infinity();
    details_.push_back(std::move(d));
    notes_.push_back(path_pair + ": " + tensor + " has shape " + shape_text(got.sizes()) + ", expected " +
                     shape_text(expected.sizes()));
    return;
  }
  const int64_t n = got.numel();
  if (n == 0) return;
  at::Tensor rounding;
  if (rounding_in.defined() && rounding_in.sizes() == got.sizes()) rounding = as_double_cpu(rounding_in);
  const double* g = got.const_data_ptr<double>();
  const double* e = expected.const_data_ptr<double>();
  const double* r = rounding.defined() ? rounding.const_data_ptr<double>() : nullptr;
  double sum_squares = 0;
  for (int64_t k = 0; k < n; ++k) sum_squares += std::isfinite(e[k]) ? e[k] * e[k] : 0.0;
  const double rms = std::sqrt(sum_squares / static_cast<double>(n));
  const double atol = effective_atol(tolerance, rms);
  // Worst element by excess over its allowance; non-finite values are infinitely bad.
  int64_t worst = -1;
  double worst_excess = 0;
  double max_abs = 0;
  double max_rel = 0;
  double scale = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (std::isfinite(e[k])) scale = std::max(scale, std::abs(e[k]));
    double allowed = atol + tolerance.rtol * std::abs(e[k]);
    if (r && std::isfinite(r[k])) {
      allowed += std::min(allowance_.factor * r[k], allowance_.cap * std::max(std::abs(e[k]), rms));
    }
    const bool finite = std::isfinite(g[k]) && std::isfinite(e[k]);
    const double diff = finite ? std::abs(g[k] - e[k]) : std::numeric_limits<double>::infinity();
    const double excess = finite ? diff - allowed : std::numeric_limits<double>::infinity();
    max_abs = std::max(max_abs, diff);
    max_rel = std::max(max_rel, diff / std::max(std::abs(e[k]), std::numeric_limits<double>::min()));
    if (excess > 0 && (worst < 0 || excess > worst_excess)) {
      worst = k;
      worst_excess = excess;
    }
  }
  if (worst < 0) return;
  TensorMismatch d = base(path_pair, tensor, role, tolerance);
  d.atol = atol;
  d.index = unravel(worst, got.sizes());
  d.expected = e[worst];
  d.got = g[worst];
  d.max_abs_err = max_abs;
  d.max_rel_err = max_rel;
  d.scale = scale;
  if (r && std::isfinite(r[worst])) d.rounding = r[worst];
  details_.push_back(std::move(d));
}

PathRun rounding_errors(const PathRun& reference, const PathRun& baseline) {
  auto error = [](const at::Tensor& ref, const at::Tensor& base_t) {
    if (!ref.defined() || !base_t.defined() || ref.sizes() != base_t.sizes()) return at::Tensor();
    at::Tensor err = (as_double_cpu(base_t) - as_double_cpu(ref)).abs_();
    // Where the baseline is not finite the dtype cannot represent the value: no allowance.
    return err.nan_to_num_(0, 0, 0);
  };
  PathRun out;
  out.name = "rounding";
  for (size_t i = 0; i < reference.outputs.size(); ++i) {
    out.outputs.push_back(error(reference.outputs[i], output_at(&baseline, i)));
  }
  out.grad_input = error(reference.grad_input, baseline.grad_input);
  out.grad_params.resize(reference.grad_params.size());
  for (size_t i = 0; i < reference.grad_params.size(); ++i) {
    for (size_t j = 0; j < reference.grad_params[i].size(); ++j) {
      out.grad_params[i].push_back(error(reference.grad_params[i][j], grad_param_at(&baseline, i, j)));
    }
  }
  for (size_t k = 0; k < reference.grad_extra_inputs.size(); ++k) {
    out.grad_extra_inputs.push_back(error(reference.grad_extra_inputs[k], grad_extra_at(&baseline, k)));
  }
  out.channel_grads.resize(reference.channel_grads.size());
  for (size_t f = 0; f < reference.channel_grads.size(); ++f) {
    for (const auto& [channel, grad] : reference.channel_grads[f]) {
      out.channel_grads[f][channel] = error(grad, channel_grad_at(&baseline, f, channel));
    }
  }
  return out;
}

void compare_paths(const std::string& path_pair, const CaseSpec& spec, const PathRun& expected, const PathRun& got,
                   const Tolerance& tolerance, Comparer& comparer, const PathRun* rounding,
                   bool got_exposes_all_channels) {
  const size_t n_outputs = std::max(expected.outputs.size(), got.outputs.size());
  for (size_t i = 0; i < n_outputs; ++i) {
    comparer.compare(path_pair, i == 0 ? "output" : "extra_output[" + std::to_string(i - 1) + "]",
                     i == 0 ? "output" : "extra_output", output_at(&expected, i), output_at(&got, i),
                     /*gradient=*/false, tolerance, output_at(rounding, i));
  }
  comparer.compare(path_pair, "grad_input", "grad_input", expected.grad_input, got.grad_input, true, tolerance,
                   rounding ? rounding->grad_input : at::Tensor());
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const size_t n = std::max(i < expected.grad_params.size() ? expected.grad_params[i].size() : 0,
                              i < got.grad_params.size() ? got.grad_params[i].size() : 0);
    for (size_t j = 0; j < n; ++j) {
      comparer.compare(path_pair,
                       "grad_param[" + std::to_string(i) + "]." + spec.ops[i].name + "[" + std::to_string(j) + "]",
                       "grad_param", grad_param_at(&expected, i, j), grad_param_at(&got, i, j), true, tolerance,
                       grad_param_at(rounding, i, j));
    }
  }
  const size_t n_extra = std::max(expected.grad_extra_inputs.size(), got.grad_extra_inputs.size());
  for (size_t k = 0; k < n_extra; ++k) {
    comparer.compare(path_pair, "grad_extra_input[" + std::to_string(k) + "]", "grad_extra_input",
                     grad_extra_at(&expected, k), grad_extra_at(&got, k), true, tolerance, grad_extra_at(rounding, k));
  }
  // Channels: only those the expected side has a gradient for. A channel the expected side
  // leaves out has a value that does not require grad there (a fuser may still trace a
  // gradient for it, e.g. Dispatch probs from logits that do not require grad). A backend
  // that exposes only some channels (te: where the producer's backward group holds none of
  // the consumers) is judged on those.
  for (size_t f = 0; f < expected.channel_grads.size(); ++f) {
    for (const auto& [channel, e] : expected.channel_grads[f]) {
      if (!got_exposes_all_channels && !has_channel(&got, f, channel)) continue;
      comparer.compare(path_pair, channel_label(f, channel), "grad_channel", e, channel_grad_at(&got, f, channel), true,
                       tolerance, channel_grad_at(rounding, f, channel));
    }
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

void compare_plans(const PathRun& repeat, std::vector<TensorMismatch>& details, std::vector<std::string>& notes) {
  if (repeat.expected_plans.empty()) return;
  const size_t n = std::max(repeat.plans.size(), repeat.expected_plans.size());
  for (size_t f = 0; f < n; ++f) {
    const FuserPlans none;
    const FuserPlans& got = f < repeat.plans.size() ? repeat.plans[f] : none;
    const FuserPlans& want = f < repeat.expected_plans.size() ? repeat.expected_plans[f] : none;
    for (const auto& [pass, g, e] : {std::make_tuple("forward", &got.forward, &want.forward),
                                     std::make_tuple("backward", &got.backward, &want.backward)}) {
      if (*g == *e) continue;
      TensorMismatch d;
      d.kind = VerdictKind::kMismatch;
      d.path_pair = repeat.name + "~fresh_plans";
      d.tensor = "plan[fuser " + std::to_string(f) + "]." + pass;
      d.role = "plan";
      d.max_abs_err = std::numeric_limits<double>::infinity();
      d.max_rel_err = std::numeric_limits<double>::infinity();
      details.push_back(std::move(d));
      notes.push_back(repeat.name + ": fuser " + std::to_string(f) + " ran the " + pass + " plan " + plan_text(*g) +
                      "; planned afresh for this call: " + plan_text(*e));
    }
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

void check_caller_tensors(const PathRun& run, std::vector<TensorMismatch>& details) {
  for (const auto& tensor : run.modified) {
    TensorMismatch d;
    d.kind = VerdictKind::kModifiedInput;
    d.path_pair = run.name + "~caller";
    d.tensor = tensor;
    d.role = "modified_" + tensor.substr(0, tensor.find('['));
    d.max_abs_err = std::numeric_limits<double>::infinity();
    details.push_back(std::move(d));
  }
}

}  // namespace gradfuzz::oracle
