#include "oracle/finite_difference.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "ops/reference.h"
#include "oracle/tolerances.h"

namespace gradfuzz::oracle {

namespace {

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
}  // namespace

void check_finite_differences(const CaseSpec& spec, const CaseTensors& tensors, const PathRun& reference,
                              const BuiltCase& built, const FiniteDifferenceOptions& options, at::Generator& generator,
                              std::vector<Finding>& details, std::vector<std::string>& notes) {
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
  for (size_t i = 0; i < built.ops.size(); ++i) {
    if (!built.ops[i]) continue;
    auto params = built.ops[i]->parameters();
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
  if (leaves.empty() || elements > options.max_elements) return;

  const double h = finite_difference_step();
  const Tolerance tolerance = finite_difference_tolerance();
  const auto dbl = at::TensorOptions().dtype(at::kDouble);
  for (int64_t d = 0; d < options.directions; ++d) {
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
    // Central difference of the reference's loss along this direction with step `step`,
    // and its own tolerance: the cancellation error of the difference is about
    // eps * |loss| / step (see tolerances.cc), so a smaller step gets a wider one.
    auto central = [&](double step_size, double& numeric_out) {
      double losses[2] = {0, 0};
      for (int side = 0; side < 2; ++side) {
        const double step = side == 0 ? step_size : -step_size;
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
        ops::ReferenceEvaluator evaluator(*built.sequential);
        losses[side] = loss_of(evaluator.forward(input, extras), tensors.cotangents);
      }
      {
        at::NoGradGuard no_grad;
        for (auto& leaf : leaves) {
          if (leaf.param.defined()) leaf.param.copy_(leaf.base);
        }
      }
      numeric_out = (losses[0] - losses[1]) / (2 * step_size);
      return tolerance.atol * (1 + terms) + 1e-9 * (h / step_size) * (std::abs(losses[0]) + std::abs(losses[1]));
    };
    double numeric = 0;
    const double atol = central(h, numeric);
    const double err = std::abs(analytic - numeric);
    if (!(err <= atol + tolerance.rtol * std::abs(numeric))) {
      // A kink (ReLU's at zero, a routing decision) within the step of the base point makes
      // the central difference average two slopes. A step 16 times smaller that agrees
      // with the analytic derivative means the loss is not smooth within the first step,
      // not that the gradient is wrong: a wrong gradient disagrees at every step.
      double fine = 0;
      const double fine_atol = central(h / 16, fine);
      if (std::abs(analytic - fine) <= fine_atol + tolerance.rtol * std::abs(fine)) {
        notes.push_back("finite differences along direction " + std::to_string(d) + ": not smooth within a step of " +
                        std::to_string(h) + " (central difference " + std::to_string(numeric) + "), step " +
                        std::to_string(h / 16) + " agrees with the reference (" + std::to_string(fine) + ")");
        continue;
      }
      Finding m;
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

}  // namespace gradfuzz::oracle
