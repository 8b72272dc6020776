#include "harness/runner.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "harness/tolerances.h"
#include "ops/errors.h"
#include "ops/reference.h"

namespace gradfuzz::harness {

namespace {

/// Everything one path produced, in float64-comparable form, or the error it raised.
struct PathRun {
  std::string name;
  bool ok = false;
  /// gradfuzz::Error::kind(), "c10-error" or "std-exception".
  std::string error_kind;
  std::string error_message;
  /// "op creation", ..., "forward", "backward".
  std::string error_stage;
  /// A failed construction left these ops locked (spec op indices).
  std::vector<int64_t> left_locked;

  std::vector<at::Tensor> outputs;
  at::Tensor grad_input;
  /// Per spec op, per parameter.
  std::vector<std::vector<at::Tensor>> grad_params;
  /// Per passed extra input.
  std::vector<at::Tensor> grad_extra_inputs;
  /// Per fuser: channel name -> gradient.
  std::vector<std::map<std::string, at::Tensor>> channel_grads;
  BuiltCase built;
};

std::string describe_error(const PathRun& run) {
  return run.name + " raised " + run.error_kind + " during " + run.error_stage + ": " + run.error_message;
}

template <typename Body>
void guarded(PathRun& run, const std::string& stage_if_built, Body&& body) {
  try {
    body();
    run.ok = true;
  } catch (const Error& e) {
    run.error_kind = e.kind();
    run.error_message = e.what();
  } catch (const std::logic_error&) {
    throw;  // internal assertion failure: a gradfuzz bug, not a verdict
  } catch (const c10::Error& e) {
    run.error_kind = "c10-error";
    run.error_message = e.what_without_backtrace();
  } catch (const std::exception& e) {
    run.error_kind = "std-exception";
    run.error_message = e.what();
  }
  if (!run.ok && run.error_stage.empty()) {
    run.error_stage = run.built.stage == BuildStage::kDone ? stage_if_built : build_stage_name(run.built.stage);
  }
}

/// Ops that a failed Sequential construction left locked (they were unlocked before it).
void check_locks_after_failure(PathRun& run) {
  if (run.ok || run.built.stage != BuildStage::kConstruct) return;
  for (size_t i = 0; i < run.built.ops.size(); ++i) {
    const auto& op = run.built.ops[i];
    bool before = i < run.built.locked_before_construct.size() && run.built.locked_before_construct[i];
    if (op && op->locked() && !before) run.left_locked.push_back(static_cast<int64_t>(i));
  }
}

/// Loss cotangents in the dtype and device of each output; only floating outputs that
/// require grad take part.
void collect_loss_terms(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& cotangents,
                        std::vector<at::Tensor>& loss_outputs, std::vector<at::Tensor>& loss_cotangents) {
  for (size_t i = 0; i < outputs.size() && i < cotangents.size(); ++i) {
    const at::Tensor& out = outputs[i];
    const at::Tensor& cot = cotangents[i];
    if (!out.defined() || !cot.defined() || !out.is_floating_point() || !out.requires_grad()) continue;
    if (out.sizes() != cot.sizes()) continue;  // a shape bug; reported by the output comparison
    loss_outputs.push_back(out);
    loss_cotangents.push_back(cot.to(out.options()));
  }
}

/// Runs the runtime (fused or unfused) path.
PathRun run_runtime_path(const std::string& name, const CaseSpec& spec, const CasePlan& plan,
                         const CaseTensors& tensors, const BuildOptions& build) {
  PathRun run;
  run.name = name;
  guarded(run, "forward", [&] {
    create_ops(spec, plan, &tensors, build, run.built);
    build_case(spec, plan, tensors, build, run.built);
    const auto options = at::TensorOptions().dtype(build.dtype).device(build.device);
    at::Tensor input = tensors.input.to(options, false, true).requires_grad_(spec.input_requires_grad);
    std::vector<at::Tensor> extras = to_path(tensors.extra_inputs, tensors.extra_input_requires_grad, options);
    run.outputs = run.built.sequential->forward(input, extras);

    run.error_stage = "backward";
    // Autograd inputs: main input, parameters, public extra inputs that require grad.
    std::vector<at::Tensor> leaves;
    std::vector<std::pair<int64_t, int64_t>> where;  // (-1,0) input, (op, j) param, (-2, k) extra
    if (input.requires_grad()) {
      leaves.push_back(input);
      where.emplace_back(-1, 0);
    }
    run.grad_params.resize(spec.ops.size());
    for (size_t i = 0; i < run.built.ops.size(); ++i) {
      if (!run.built.ops[i]) continue;
      auto params = run.built.ops[i]->parameters();
      run.grad_params[i].resize(params.size());
      for (size_t j = 0; j < params.size(); ++j) {
        if (!params[j].requires_grad()) continue;
        leaves.push_back(params[j]);
        where.emplace_back(static_cast<int64_t>(i), static_cast<int64_t>(j));
      }
    }
    run.grad_extra_inputs.resize(extras.size());
    for (size_t k = 0; k < extras.size(); ++k) {
      if (!extras[k].defined() || !extras[k].requires_grad()) continue;
      leaves.push_back(extras[k]);
      where.emplace_back(-2, static_cast<int64_t>(k));
    }
    std::vector<at::Tensor> loss_outputs;
    std::vector<at::Tensor> loss_cotangents;
    collect_loss_terms(run.outputs, tensors.cotangents, loss_outputs, loss_cotangents);
    if (!leaves.empty() && !loss_outputs.empty()) {
      // Gradients of sum_i <output_i, cotangent_i>, without building the scalar loss.
      auto grads = torch::autograd::grad(loss_outputs, leaves, loss_cotangents, /*retain_graph=*/false,
                                         /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t n = 0; n < grads.size(); ++n) {
        const auto [kind, index] = where[n];
        if (kind == -1) {
          run.grad_input = grads[n];
        } else if (kind == -2) {
          run.grad_extra_inputs[static_cast<size_t>(index)] = grads[n];
        } else {
          run.grad_params[static_cast<size_t>(kind)][static_cast<size_t>(index)] = grads[n];
        }
      }
    }
    for (const auto& fuser : run.built.sequential->fusers()) {
      auto trace = fuser->last_trace();
      run.channel_grads.push_back(trace ? trace->channel_grads : std::map<std::string, at::Tensor>{});
    }
  });
  check_locks_after_failure(run);
  return run;
}

/// Runs the reference path on an already created float64 CPU build (ops made by create_ops
/// before the draws, so their parameter shapes could be read).
PathRun run_reference_path(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                           const BuildOptions& build, BuiltCase built, std::unique_ptr<ops::ReferenceEvaluator>& kept,
                           at::ScalarType compute_dtype = at::kDouble) {
  PathRun run;
  run.name = compute_dtype == at::kDouble ? "reference" : "rounding_baseline";
  run.built = std::move(built);
  guarded(run, "forward", [&] {
    build_case(spec, plan, tensors, build, run.built);
    const auto options = at::TensorOptions().dtype(at::kDouble).device(at::kCPU);
    at::Tensor input = tensors.input.to(options, false, true).requires_grad_(spec.input_requires_grad);
    std::vector<at::Tensor> extras = to_path(tensors.extra_inputs, tensors.extra_input_requires_grad, options);
    kept = std::make_unique<ops::ReferenceEvaluator>(*run.built.sequential, compute_dtype);
    run.outputs = kept->forward(input, extras);
    run.error_stage = "backward";
    ops::ReferenceGradients grads = kept->backward(tensors.cotangents);
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
  check_locks_after_failure(run);
  return run;
}

// ---------------------------------------------------------------------------------------------
// Comparison

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
  return t.detach().to(at::TensorOptions().dtype(at::kDouble).device(at::kCPU));
}

std::string shape_text(at::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

/// Compares the tensors of a case and records every failure with its full detail. The common
/// case (within tolerance) is a plain loop over float64 host copies; only a failing tensor
/// pays for the detailed examination.
class Comparer {
 public:
  Comparer(std::vector<TensorMismatch>& details, std::vector<std::string>& notes)
      : details_(details), notes_(notes) {}

  /// Compares `got` against `expected`. For gradients an undefined tensor means "none":
  /// none where the expected gradient is non-zero is a missing gradient; a gradient where
  /// none is expected must be zero.
  ///
  /// `baseline` (optional) is the same tensor from the rounding baseline: the reference run in
  /// the case's dtype. Its distance to `expected`, times `floor_factor`, is added to atol:
  /// that much error is what the dtype itself costs this case.
  void compare(const std::string& path_pair, const std::string& tensor, const std::string& role,
               const at::Tensor& expected, const at::Tensor& got, bool gradient, const Tolerance& tolerance,
               const at::Tensor& baseline = at::Tensor(), double floor_factor = 0) {
    if (!expected.defined() && !got.defined()) return;
    const double floor = rounding_floor(expected, baseline, floor_factor);
    if (!got.defined() || (!expected.defined() && !gradient) || got.sizes() != expected.sizes() ||
        got.numel() == 0 || floor > 0 || !within_tolerance(expected, got, tolerance)) {
      compare_now(path_pair, tensor, role, expected, got, gradient, tolerance, floor);
    }
  }

 private:
  /// |got - expected| <= atol + rtol * rms(expected) + rtol * |expected| for every element,
  /// all finite: the same test as compare_now. Case tensors are small (tens to hundreds of
  /// elements), so a plain loop over float64 host copies beats a chain of ATen kernels, whose
  /// per-call dispatch dominated the harness's own time. `expected` may be undefined (zeros).
  static bool within_tolerance(const at::Tensor& expected_in, const at::Tensor& got_in, const Tolerance& tolerance) {
    const at::Tensor got = as_double_cpu(got_in).contiguous();
    const at::Tensor expected = expected_in.defined() ? as_double_cpu(expected_in).contiguous() : at::Tensor();
    const double* g = got.data_ptr<double>();
    const double* e = expected.defined() ? expected.data_ptr<double>() : nullptr;
    const int64_t n = got.numel();
    double sum_squares = 0;
    for (int64_t k = 0; k < n && e; ++k) sum_squares += e[k] * e[k];
    const double atol = effective_atol(tolerance, n > 0 ? std::sqrt(sum_squares / static_cast<double>(n)) : 0.0);
    for (int64_t k = 0; k < n; ++k) {
      const double want = e ? e[k] : 0.0;
      if (!std::isfinite(g[k]) || !std::isfinite(want)) return false;
      if (std::abs(g[k] - want) - tolerance.rtol * std::abs(want) - atol > 0) return false;
    }
    return true;
  }

  /// floor_factor * max |baseline - expected|; 0 without a baseline. A non-finite baseline
  /// error grants nothing: it means the dtype cannot represent the case, not that anything goes.
  static double rounding_floor(const at::Tensor& expected, const at::Tensor& baseline, double floor_factor) {
    if (!baseline.defined() || floor_factor <= 0 || baseline.numel() == 0) return 0;
    const at::Tensor e = expected.defined() ? as_double_cpu(expected) : at::zeros(baseline.sizes(), at::kDouble);
    if (e.sizes() != baseline.sizes()) return 0;
    const double err = (as_double_cpu(baseline) - e).abs().max().item<double>();
    return std::isfinite(err) ? floor_factor * err : 0;
  }

  void compare_now(const std::string& path_pair, const std::string& tensor, const std::string& role,
                   const at::Tensor& expected_in, const at::Tensor& got_in, bool gradient, const Tolerance& tolerance,
                   double floor = 0) {
    if (!expected_in.defined() && !got_in.defined()) return;
    if (!got_in.defined()) {
      at::Tensor expected = as_double_cpu(expected_in);
      if (expected.numel() == 0) return;
      at::Tensor magnitude = expected.abs().nan_to_num(std::numeric_limits<double>::infinity()).flatten();
      auto [worst, flat] = magnitude.max(0);
      if (gradient && worst.item<double>() == 0) return;
      TensorMismatch d = base(path_pair, tensor, role, tolerance);
      d.kind = gradient ? VerdictKind::kMissingGradient : VerdictKind::kMismatch;
      d.index = unravel(flat.item<int64_t>(), expected.sizes());
      d.expected = expected.flatten()[flat.item<int64_t>()].item<double>();
      d.got = 0;
      d.max_abs_err = worst.item<double>();
      d.max_rel_err = 1;
      details_.push_back(std::move(d));
      if (!gradient) notes_.push_back(path_pair + ": " + tensor + " missing");
      return;
    }
    at::Tensor got = as_double_cpu(got_in);
    at::Tensor expected = expected_in.defined() ? as_double_cpu(expected_in) : at::zeros_like(got);
    if (!expected_in.defined() && !gradient) {
      notes_.push_back(path_pair + ": " + tensor + " returned but not expected");
    }
    if (got.sizes() != expected.sizes()) {
      TensorMismatch d = base(path_pair, tensor, role, tolerance);
      d.max_abs_err = std::numeric_limits<double>::infinity();
      d.max_rel_err = std::numeric_limits<double>::infinity();
      details_.push_back(std::move(d));
      notes_.push_back(path_pair + ": " + tensor + " has shape " + shape_text(got.sizes()) + ", expected " +
                       shape_text(expected.sizes()));
      return;
    }
    if (got.numel() == 0) return;
    const double rms = expected.square().mean().sqrt().nan_to_num(0, 0, 0).item<double>();
    const double atol = effective_atol(tolerance, rms) + floor;
    at::Tensor diff = (got - expected).abs_();
    at::Tensor nonfinite = got.isfinite().logical_and_(expected.isfinite()).logical_not_();
    at::Tensor excess = (diff - expected.abs().mul_(tolerance.rtol)).sub_(atol);
    excess.masked_fill_(nonfinite, std::numeric_limits<double>::infinity());
    auto [worst, flat_t] = excess.flatten().max(0);
    if (!(worst.item<double>() > 0)) return;  // NaN/Inf were mapped to +inf above
    const int64_t flat = flat_t.item<int64_t>();
    TensorMismatch d = base(path_pair, tensor, role, tolerance);
    d.atol = atol;
    d.index = unravel(flat, got.sizes());
    d.expected = expected.flatten()[flat].item<double>();
    d.got = got.flatten()[flat].item<double>();
    at::Tensor diff_inf = diff.masked_fill(nonfinite, std::numeric_limits<double>::infinity());
    d.max_abs_err = diff_inf.max().item<double>();
    d.max_rel_err = diff_inf.div(expected.abs().clamp_min(std::numeric_limits<double>::min())).max().item<double>();
    details_.push_back(std::move(d));
  }

  static TensorMismatch base(const std::string& path_pair, const std::string& tensor, const std::string& role,
                             const Tolerance& tolerance) {
    TensorMismatch d;
    d.path_pair = path_pair;
    d.tensor = tensor;
    d.role = role;
    d.atol = tolerance.atol;
    d.rtol = tolerance.rtol;
    return d;
  }

  std::vector<TensorMismatch>& details_;
  std::vector<std::string>& notes_;
};

std::string channel_label(size_t fuser, const std::string& channel) {
  return "grad_channel[" + channel + (fuser == 0 ? "" : "@fuser" + std::to_string(fuser)) + "]";
}

/// Compares every tensor of `got` against `expected`.
/// The tensor of `run` at the position compare_paths is looking at; undefined when absent.
at::Tensor output_at(const PathRun* run, size_t i) {
  return run && i < run->outputs.size() ? run->outputs[i] : at::Tensor();
}
at::Tensor grad_param_at(const PathRun* run, size_t i, size_t j) {
  return run && i < run->grad_params.size() && j < run->grad_params[i].size() ? run->grad_params[i][j] : at::Tensor();
}
at::Tensor grad_extra_at(const PathRun* run, size_t k) {
  return run && k < run->grad_extra_inputs.size() ? run->grad_extra_inputs[k] : at::Tensor();
}
at::Tensor channel_grad_at(const PathRun* run, size_t f, const std::string& channel) {
  if (!run || f >= run->channel_grads.size()) return at::Tensor();
  auto it = run->channel_grads[f].find(channel);
  return it != run->channel_grads[f].end() ? it->second : at::Tensor();
}

/// Compares every tensor of `got` against `expected`. With a rounding baseline, each tensor's
/// atol grows by floor_factor times the baseline's own error on that tensor.
void compare_paths(const std::string& path_pair, const CaseSpec& spec, const PathRun& expected, const PathRun& got,
                   const Tolerance& tolerance, Comparer& comparer, const PathRun* baseline = nullptr,
                   double floor_factor = 0) {
  const size_t n_outputs = std::max(expected.outputs.size(), got.outputs.size());
  for (size_t i = 0; i < n_outputs; ++i) {
    comparer.compare(path_pair, i == 0 ? "output" : "extra_output[" + std::to_string(i - 1) + "]",
                     i == 0 ? "output" : "extra_output", output_at(&expected, i), output_at(&got, i),
                     /*gradient=*/false, tolerance, output_at(baseline, i), floor_factor);
  }
  comparer.compare(path_pair, "grad_input", "grad_input", expected.grad_input, got.grad_input, true, tolerance,
                   baseline ? baseline->grad_input : at::Tensor(), floor_factor);
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const size_t n = std::max(i < expected.grad_params.size() ? expected.grad_params[i].size() : 0,
                              i < got.grad_params.size() ? got.grad_params[i].size() : 0);
    for (size_t j = 0; j < n; ++j) {
      comparer.compare(path_pair,
                       "grad_param[" + std::to_string(i) + "]." + spec.ops[i].name + "[" + std::to_string(j) + "]",
                       "grad_param", grad_param_at(&expected, i, j), grad_param_at(&got, i, j), true, tolerance,
                       grad_param_at(baseline, i, j), floor_factor);
    }
  }
  const size_t n_extra = std::max(expected.grad_extra_inputs.size(), got.grad_extra_inputs.size());
  for (size_t k = 0; k < n_extra; ++k) {
    comparer.compare(path_pair, "grad_extra_input[" + std::to_string(k) + "]", "grad_extra_input",
                     grad_extra_at(&expected, k), grad_extra_at(&got, k), true, tolerance, grad_extra_at(baseline, k),
                     floor_factor);
  }
  // Channels: only those the expected side has a gradient for. A channel the expected side
  // leaves out has a value that does not require grad there (the fuser may still trace a
  // gradient for it, e.g. Dispatch probs from logits that do not require grad).
  for (size_t f = 0; f < expected.channel_grads.size(); ++f) {
    for (const auto& [channel, e] : expected.channel_grads[f]) {
      comparer.compare(path_pair, channel_label(f, channel), "grad_channel", e, channel_grad_at(&got, f, channel), true,
                       tolerance, channel_grad_at(baseline, f, channel), floor_factor);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Finite differences on the reference

double loss_of(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& cotangents) {
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble));
  for (size_t i = 0; i < outputs.size() && i < cotangents.size(); ++i) {
    if (!outputs[i].defined() || !cotangents[i].defined() || !outputs[i].is_floating_point()) continue;
    if (outputs[i].sizes() != cotangents[i].sizes()) continue;
    total.add_(outputs[i].detach().to(at::kDouble).mul(cotangents[i]).sum());
  }
  return total.item<double>();
}

/// Checks the reference's directional derivatives along random directions against central
/// differences of the reference forward. Appends a "reference~finite_difference" mismatch.
void check_finite_differences(const CaseSpec& spec, const CaseTensors& tensors, const PathRun& reference,
                              const RunOptions& options, at::Generator& generator, std::vector<TensorMismatch>& details,
                              std::vector<std::string>& notes) {
  // Leaves: (value, gradient, where to write perturbed values).
  struct Leaf {
    at::Tensor base;      // float64 values
    at::Tensor gradient;  // may be undefined (= zero)
    at::Tensor param;     // the reference op's parameter (written in place), or undefined
    int64_t extra = -1;   // index into extra inputs, or -1
    bool is_input = false;
  };
  std::vector<Leaf> leaves;
  int64_t elements = 0;
  if (spec.input_requires_grad) {
    leaves.push_back({tensors.input, reference.grad_input, at::Tensor(), -1, true});
  }
  elements += tensors.input.numel();
  for (size_t i = 0; i < reference.built.ops.size(); ++i) {
    if (!reference.built.ops[i]) continue;
    auto params = reference.built.ops[i]->parameters();
    for (size_t j = 0; j < params.size(); ++j) {
      elements += params[j].numel();
      if (!params[j].requires_grad()) continue;
      at::Tensor g = i < reference.grad_params.size() && j < reference.grad_params[i].size()
                         ? reference.grad_params[i][j]
                         : at::Tensor();
      leaves.push_back({params[j].detach().clone(), g, params[j], -1, false});
    }
  }
  for (size_t k = 0; k < tensors.extra_inputs.size(); ++k) {
    if (!tensors.extra_inputs[k].is_floating_point()) continue;
    elements += tensors.extra_inputs[k].numel();
    if (!tensors.extra_input_requires_grad[k]) continue;
    at::Tensor g = k < reference.grad_extra_inputs.size() ? reference.grad_extra_inputs[k] : at::Tensor();
    leaves.push_back({tensors.extra_inputs[k], g, at::Tensor(), static_cast<int64_t>(k), false});
  }
  if (leaves.empty() || elements > options.finite_difference_max_elements) return;

  const double h = finite_difference_step();
  const Tolerance tolerance = finite_difference_tolerance();
  const auto dbl = at::TensorOptions().dtype(at::kDouble);
  for (int64_t d = 0; d < options.finite_difference_directions; ++d) {
    std::vector<at::Tensor> direction;
    std::vector<at::Tensor> products;
    for (const auto& leaf : leaves) {
      direction.push_back(at::randn(leaf.base.sizes(), generator, dbl));
      if (leaf.gradient.defined()) {
        products.push_back(leaf.gradient.detach().to(at::kDouble).mul(direction.back()).reshape({-1}));
      }
    }
    double analytic = 0;
    double terms = 0;  // sum of |g_k * v_k|: the size of the dot product's terms
    if (!products.empty()) {
      const at::Tensor all = at::cat(products);
      const at::Tensor both = at::stack({all.sum(), all.abs().sum()});
      analytic = both[0].item<double>();
      terms = both[1].item<double>();
    }
    double losses[2] = {0, 0};
    for (int side = 0; side < 2; ++side) {
      const double step = side == 0 ? h : -h;
      at::Tensor input = tensors.input;
      std::vector<at::Tensor> extras = tensors.extra_inputs;
      {
        at::NoGradGuard no_grad;
        for (size_t n = 0; n < leaves.size(); ++n) {
          at::Tensor moved = leaves[n].base.add(direction[n], step);
          if (leaves[n].is_input) {
            input = moved;
          } else if (leaves[n].extra >= 0) {
            extras[static_cast<size_t>(leaves[n].extra)] = moved;
          } else {
            leaves[n].param.copy_(moved);
          }
        }
      }
      at::NoGradGuard no_grad;
      ops::ReferenceEvaluator evaluator(*reference.built.sequential);
      losses[side] = loss_of(evaluator.forward(input, extras), tensors.cotangents);
    }
    {
      at::NoGradGuard no_grad;
      for (auto& leaf : leaves) {
        if (leaf.param.defined()) leaf.param.copy_(leaf.base);
      }
    }
    const double numeric = (losses[0] - losses[1]) / (2 * h);
    // Cancellation error of the difference is about eps * |loss| / h (see tolerances.cc).
    const double atol = tolerance.atol * (1 + terms) + 1e-9 * (std::abs(losses[0]) + std::abs(losses[1]));
    const double err = std::abs(analytic - numeric);
    if (!(err <= atol + tolerance.rtol * std::abs(numeric))) {
      TensorMismatch m;
      m.kind = VerdictKind::kMismatch;
      m.path_pair = "reference~finite_difference";
      m.tensor = "directional_derivative[" + std::to_string(d) + "]";
      m.role = "directional_derivative";
      m.index = {d};
      m.expected = numeric;
      m.got = analytic;
      m.max_abs_err = err;
      m.max_rel_err = err / std::max(std::abs(numeric), std::numeric_limits<double>::min());
      m.atol = atol;
      m.rtol = tolerance.rtol;
      details.push_back(m);
      notes.push_back("reference gradient disagrees with central differences along random direction " +
                      std::to_string(d));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Coverage

void add_fused_features(const PathRun& fused, CaseResult& result) {
  if (!fused.built.sequential) return;
  std::set<std::string> fired(result.fusions_fired.begin(), result.fusions_fired.end());
  bool same_fusion = false;
  for (const auto& fuser : fused.built.sequential->fusers()) {
    auto trace = fuser->last_trace();
    if (!trace) continue;
    const auto& sources = fuser->routing().input_sources;
    for (const auto* plan : {&trace->forward_plan, &trace->backward_plan}) {
      for (const auto& entry : *plan) {
        if (!entry.fused) continue;
        if (fired.insert(entry.name).second) result.fusions_fired.push_back(entry.name);
        for (const auto& [consumer, producer] : sources) {
          if (consumer.op >= entry.begin && consumer.op < entry.end && producer.op >= entry.begin &&
              producer.op < entry.end) {
            same_fusion = true;
          }
        }
      }
    }
  }
  if (same_fusion) result.features.push_back("same_fusion_channel");
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
    if (op.output_style == ops::OutputStyle::kGenerator &&
        (n_in > 0 || !op_plan.signature.extra_outputs.empty())) {
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
  return features;
}

namespace {

/// How many times the rounding baseline's own error a path may be off by. A hand-written
/// backward legitimately rounds differently from autograd's chain (other summation order,
/// fused multiply-adds, a closed-form formula that cancels where the chain does not: seen
/// 19x on a float32 LayerNorm over two nearly equal features), and one baseline run is a
/// single sample of that rounding, so the factor is generous. The defects gradfuzz hunts are
/// structural (a dropped, doubled or misrouted gradient: errors the size of the tensor), far
/// above 32 rounding errors.
constexpr double kBaselineFactor = 32.0;

/// Whether every output and gradient of a path is finite.
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
BuiltCase reference_ops_with_values(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                    const BuildOptions& reference_build) {
  BuiltCase built;
  create_ops(spec, plan, nullptr, reference_build, built);
  copy_param_values(tensors, built);
  return built;
}

}  // namespace

bool intends_error(const CaseSpec& spec) {
  return spec.extra_input_count_delta != 0 || spec.corrupt_split_sizes || !spec.late_binds.empty() ||
         check_static_wiring(spec).has_value();
}

CaseResult run_case(const CaseSpec& spec, const RunOptions& options) {
  disable_tf32();
  CaseResult result;
  result.seed = spec.seed;
  for (const auto& op : spec.ops) {
    if (op.name != kBoundaryOp) result.op_types.push_back(op.name);
  }
  const at::ScalarType dtype = scalar_type_from_name(spec.dtype);
  const at::Device device = spec.device == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  if (device.is_cuda() && !at::hasCUDA()) {
    throw std::invalid_argument("case needs device cuda, but this process has no CUDA device");
  }

  // Shapes and op creation are the same computation in every path (the catalog's signature
  // and factory), so an error there is every path's error: an invalid case that passes.
  CasePlan plan;
  BuildOptions reference_build;
  reference_build.call_then_bind = false;
  BuiltCase reference_ops;
  {
    PathRun probe;
    probe.name = "every path";
    guarded(probe, "op creation", [&] {
      plan = plan_case(spec);
      create_ops(spec, plan, nullptr, reference_build, reference_ops);
    });
    if (!probe.ok) {
      result.error_detail = "every path raised " + probe.error_kind + " during op creation: " + probe.error_message;
      return result;
    }
  }
  result.features = static_features(spec, plan);

  at::Generator generator = at::detail::createCPUGenerator(spec.seed);
  const CaseTensors tensors = draw_case_tensors(spec, plan, param_shapes(reference_ops.ops), generator);
  copy_param_values(tensors, reference_ops);

  BuildOptions fused_build;
  fused_build.dtype = dtype;
  fused_build.device = device;
  fused_build.fusions = ops::FusionRegistry::catalog().only(spec.fusions);
  PathRun fused = run_runtime_path("fused", spec, plan, tensors, fused_build);
  add_fused_features(fused, result);
  // When no fusion fired, the fused path ran exactly the unfused path's groups: running the
  // unfused path again would repeat the same computation bit for bit.
  const bool run_unfused = options.run_unfused && (!fused.ok || !result.fusions_fired.empty());
  PathRun unfused;
  if (run_unfused) {
    BuildOptions unfused_build;
    unfused_build.dtype = dtype;
    unfused_build.device = device;
    unfused = run_runtime_path("unfused", spec, plan, tensors, unfused_build);
  }
  std::unique_ptr<ops::ReferenceEvaluator> evaluator;
  PathRun reference = run_reference_path(spec, plan, tensors, reference_build, std::move(reference_ops), evaluator);

  std::vector<const PathRun*> runs = {&fused};
  if (run_unfused) runs.push_back(&unfused);
  runs.push_back(&reference);

  // Errors: every path must agree on whether and what it raised.
  bool any_error = false;
  bool same_kind = true;
  std::vector<std::string> lock_problems;
  for (const PathRun* run : runs) {
    if (!run->ok) any_error = true;
    if (run->ok != reference.ok || run->error_kind != reference.error_kind) same_kind = false;
    for (int64_t op : run->left_locked) {
      lock_problems.push_back(run->name + ": failed " + run->error_stage + " left op " + std::to_string(op) + " (" +
                              spec.ops[static_cast<size_t>(op)].name + ") locked");
    }
  }
  if (any_error || !lock_problems.empty()) {
    std::string kinds;
    std::string detail;
    for (const PathRun* run : runs) {
      kinds += (kinds.empty() ? "" : " ") + run->name + "=" + (run->ok ? "none" : run->error_kind);
      detail += (detail.empty() ? "" : "; ") + (run->ok ? run->name + " passed" : describe_error(*run));
    }
    for (const auto& problem : lock_problems) detail += "; " + problem;
    result.error_detail = detail;
    // Agreeing errors are the expected outcome only for a case that asks for one; a case
    // that is valid by construction and raises everywhere is a runtime bug that would
    // otherwise hide as a pass.
    if (!same_kind || !lock_problems.empty() || !intends_error(spec)) {
      result.verdict = VerdictKind::kUnexpectedError;
      result.error_kinds = kinds;
      if (same_kind && lock_problems.empty()) result.error_detail = "a valid case raised in every path: " + detail;
    }
    return result;
  }

  // Every path ran: compare.
  std::vector<std::string> notes;
  const ToleranceContext context{spec.num_ops(), plan.max_reduction_length};
  const Tolerance tolerance = case_tolerance(dtype, context);
  auto compare_all = [&](const PathRun* baseline) {
    result.details.clear();
    notes.clear();
    Comparer comparer(result.details, notes);
    const double factor = kBaselineFactor;
    compare_paths("fused~reference", spec, reference, fused, tolerance, comparer, baseline, factor);
    if (run_unfused) {
      compare_paths("unfused~reference", spec, reference, unfused, tolerance, comparer, baseline, factor);
      // With a baseline (a low-precision case that failed the static tolerance) fused~unfused
      // is left out: two roundings of one pre-activation may land on either side of a ReLU
      // kink, so the two paths can legitimately disagree while each matches the reference
      // within the dtype's own error, which the two comparisons above already check.
      if (options.compare_fused_unfused && baseline == nullptr) {
        compare_paths("fused~unfused", spec, unfused, fused, path_pair_tolerance(dtype, context), comparer);
      }
    }
  };
  compare_all(nullptr);
  if (!result.details.empty() && dtype != at::kDouble) {
    // A static tolerance cannot know a case's conditioning (LayerNorm over two nearly equal
    // features, a long bf16 reduction). Before calling a low-precision mismatch, measure what
    // the dtype itself costs: the plain-autograd reference run in the case's dtype. Only
    // failing cases pay for this second reference run.
    BuiltCase baseline_ops;
    PathRun creation;
    guarded(creation, "op creation", [&] { baseline_ops = reference_ops_with_values(spec, plan, tensors, reference_build); });
    std::unique_ptr<ops::ReferenceEvaluator> baseline_evaluator;
    if (creation.ok) {
      PathRun baseline = run_reference_path(spec, plan, tensors, reference_build, std::move(baseline_ops),
                                            baseline_evaluator, dtype);
      if (baseline.ok && !all_finite(baseline)) {
        // The dtype cannot even represent what the case computes (fp16 overflows past
        // 65504): that judges the case, not the runtime.
        result.details.clear();
        notes.assign(1, "not judged: the plain reference in " + spec.dtype +
                            " is not finite, the case exceeds the dtype's range");
      } else if (baseline.ok) {
        compare_all(&baseline);
      }
    }
  }
  if (options.finite_differences && dtype == at::kDouble) {
    try {
      check_finite_differences(spec, tensors, reference, options, generator, result.details, notes);
    } catch (const Error& e) {
      notes.push_back(std::string("finite differences: reference forward raised ") + e.what());
    } catch (const c10::Error& e) {
      notes.push_back(std::string("finite differences: reference forward raised ") + e.what_without_backtrace());
    }
  }
  for (const auto& note : notes) result.error_detail += (result.error_detail.empty() ? "" : "; ") + note;
  if (!result.details.empty()) {
    const bool missing = std::any_of(result.details.begin(), result.details.end(), [](const TensorMismatch& d) {
      return d.kind == VerdictKind::kMissingGradient;
    });
    result.verdict = missing ? VerdictKind::kMissingGradient : VerdictKind::kMismatch;
  }
  return result;
}

}  // namespace gradfuzz::harness
