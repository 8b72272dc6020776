// GroupedMLP, a joint fusion: GroupedLinear (fc1), ScaledSwiGLU or ScaledSReLU,
// GroupedLinear (fc2) in one forward and one backward.
#include <ATen/ATen.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ops/basic/activations.h"
#include "ops/basic/grouped_linear.h"
#include "ops/basic/linear.h"
#include "ops/errors.h"
#include "ops/fused/fused_ops.h"

#ifdef GRADFUZZ_WITH_CUDA
#include "ops/cuda/kernels.h"
#endif

namespace gradfuzz::ops {

namespace {

/// The covered ops, typed.
struct MlpOps {
  const GroupedLinear& fc1;
  const ScaledSwiGLU* swiglu;  // exactly one of swiglu / srelu is set
  const ScaledSReLU* srelu;
  const GroupedLinear& fc2;
};

MlpOps typed_ops(const std::vector<BasicOpPtr>& ops) {
  return MlpOps{static_cast<const GroupedLinear&>(*ops[0]), dynamic_cast<const ScaledSwiGLU*>(ops[1].get()),
                dynamic_cast<const ScaledSReLU*>(ops[1].get()), static_cast<const GroupedLinear&>(*ops[2])};
}

/// GroupedLinear's input check (same error type and text): input must be [rows, in].
void check_grouped_input(const GroupedLinear& op, const at::Tensor& input) {
  const int64_t in = op.options().in();
  if (!input.defined() || input.dim() != 2 || input.size(1) != in) {
    std::ostringstream os;
    if (input.defined()) {
      os << input.sizes();
    } else {
      os << "<undefined>";
    }
    throw InvalidArgumentError(op.type() + ": input must be [rows, in=" + std::to_string(in) + "], got " + os.str());
  }
}

/// y_r = x_r W_gᵀ + b_g (· s[r] with scale_bias) for rows split into consecutive groups.
at::Tensor grouped_forward(const GroupedLinear& op, const at::Tensor& input, const std::vector<int64_t>& splits,
                           const at::Tensor& scales) {
  const GroupedLinearOptions& opt = op.options();
  at::Tensor output = at::empty({input.size(0), opt.out()}, input.options());
  int64_t offset = 0;
  for (int64_t g = 0; g < opt.groups(); ++g) {
    const int64_t n = splits[g];
    if (n == 0) {
      continue;
    }
    const at::Tensor x_g = input.narrow(0, offset, n);
    const at::Tensor w_t = op.weight()[g].t();
    at::Tensor out_g = output.narrow(0, offset, n);
    if (opt.scale_bias()) {
      // s_g [n] ⊗ b_g [out] + x_g [n, in] · W_gᵀ [in, out]
      const at::Tensor s_g = scales.narrow(0, offset, n).to(input.scalar_type());
      out_g.copy_(at::addmm(at::outer(s_g, op.bias()[g].to(input.scalar_type())), x_g, w_t));
    } else if (opt.bias()) {
      out_g.copy_(at::addmm(op.bias()[g], x_g, w_t));
    } else {
      out_g.copy_(x_g.mm(w_t));
    }
    offset += n;
  }
  return output;
}

/// Gradients of one grouped linear: d input, param grads (weight[, bias]) and d scales
/// (undefined unless scale_bias and `want_scales`).
struct GroupedGrads {
  at::Tensor grad_input;
  std::vector<at::Tensor> grad_params;
  at::Tensor grad_scales;
};

GroupedGrads grouped_backward(const GroupedLinear& op, const at::Tensor& grad_output, const at::Tensor& input,
                              const std::vector<int64_t>& splits, const at::Tensor& scales, bool want_scales) {
  const GroupedLinearOptions& opt = op.options();
  const int64_t rows = input.size(0);
  at::Tensor grad_input = at::empty({rows, opt.in()}, grad_output.options());
  at::Tensor grad_weight = at::zeros_like(op.weight());
  at::Tensor grad_bias = opt.bias() ? at::zeros_like(op.bias()) : at::Tensor();
  at::Tensor grad_scales;
  want_scales = want_scales && opt.scale_bias();
  if (want_scales) {
    grad_scales = at::empty({rows}, scales.options());
  }
  int64_t offset = 0;
  for (int64_t g = 0; g < opt.groups(); ++g) {
    const int64_t n = splits[g];
    if (n == 0) {
      continue;
    }
    const at::Tensor grad_g = grad_output.narrow(0, offset, n);
    // grad_g [n, out] · W_g [out, in] -> grad_input_g [n, in]
    grad_input.narrow(0, offset, n).copy_(grad_g.mm(op.weight()[g]));
    // grad_gᵀ [out, n] · x_g [n, in] -> grad_W_g [out, in]
    grad_weight[g].copy_(grad_g.t().mm(input.narrow(0, offset, n)));
    if (opt.scale_bias()) {
      const at::Tensor s_g = scales.narrow(0, offset, n).to(grad_g.scalar_type());
      // grad_gᵀ [out, n] · s_g [n] -> grad_b_g [out]
      grad_bias[g].copy_(grad_g.t().mv(s_g));
      if (want_scales) {
        // grad_g [n, out] · b_g [out] -> grad_s_g [n]
        grad_scales.narrow(0, offset, n).copy_(grad_g.mv(op.bias()[g].to(grad_g.scalar_type())));
      }
    } else if (opt.bias()) {
      grad_bias[g].copy_(grad_g.sum(0));
    }
    offset += n;
  }
  GroupedGrads grads;
  grads.grad_input = std::move(grad_input);
  grads.grad_params.push_back(std::move(grad_weight));
  if (opt.bias()) {
    grads.grad_params.push_back(std::move(grad_bias));
  }
  grads.grad_scales = std::move(grad_scales);
  return grads;
}

/// Extra-input gradients of a grouped linear: split sizes never get one; the scales slot
/// (scale_bias only) gets its own gradient.
ExtraOutputs grouped_extra_grads(const GroupedLinear& op, const at::Tensor& grad_scales) {
  if (op.options().scale_bias()) {
    return ExtraOutputs::make(op.output_style(), {at::Tensor(), grad_scales});
  }
  return ExtraOutputs::make(op.output_style(), {at::Tensor()});
}

/// silu(a)·b·s[r] (interleaved halves) or relu(x)²·s[r], computed in the op-math dtype.
at::Tensor scaled_activation_forward(const MlpOps& ops, const at::Tensor& hidden, const at::Tensor& scales) {
#ifdef GRADFUZZ_WITH_CUDA
  if (ops.swiglu != nullptr && hidden.is_cuda() && scales.is_cuda()) {
    return cuda::scaled_swiglu_forward_cuda(hidden, scales, ops.swiglu->interleave());
  }
#endif
  const at::ScalarType math = detail::opmath_type(hidden);
  const at::Tensor h = hidden.to(math);
  const at::Tensor s = scales.to(math).unsqueeze(1);
  if (ops.swiglu != nullptr) {
    auto [a, b] = activation_math::glu_split(h, ops.swiglu->interleave());
    return (a * at::sigmoid(a) * b * s).to(hidden.scalar_type());
  }
  const at::Tensor r = at::clamp_min(h, 0);
  return (r * r * s).to(hidden.scalar_type());
}

/// d hidden and (when `want_scales`) d scales of scaled_activation_forward.
std::pair<at::Tensor, at::Tensor> scaled_activation_backward(const MlpOps& ops, const at::Tensor& grad_output,
                                                             const at::Tensor& hidden, const at::Tensor& scales,
                                                             bool want_scales) {
#ifdef GRADFUZZ_WITH_CUDA
  if (ops.swiglu != nullptr && hidden.is_cuda() && scales.is_cuda() && grad_output.is_cuda()) {
    cuda::ScaledSwigluBackward fused =
        cuda::scaled_swiglu_backward_cuda(grad_output, hidden, scales, ops.swiglu->interleave(), want_scales);
    return {fused.grad_input.to(grad_output.scalar_type()), fused.grad_scales};
  }
#endif
  const at::ScalarType math = detail::opmath_type(hidden);
  const at::Tensor h = hidden.to(math);
  const at::Tensor gf = grad_output.to(math);
  const at::Tensor s = scales.to(math).unsqueeze(1);
  at::Tensor grad_hidden;
  at::Tensor grad_scales;
  if (ops.swiglu != nullptr) {
    const int64_t k = ops.swiglu->interleave();
    auto [a, b] = activation_math::glu_split(h, k);
    const at::Tensor sig = at::sigmoid(a);
    const at::Tensor silu = a * sig;
    const at::Tensor gs = gf * s;
    // g [rows, n] -> grad_hidden [rows, 2n] = [g·s·b·silu'(a), g·s·silu(a)], silu' = σ(1 + a(1 - σ))
    grad_hidden = activation_math::glu_merge(gs * b * (sig * (1.0 + a * (1.0 - sig))), gs * silu, k);
    if (want_scales) {
      grad_scales = (gf * silu * b).sum(1);
    }
  } else {
    // g [rows, n] -> grad_hidden [rows, n] = g·s·2·relu(x), masked elements selected to
    // zero (an overflowed gradient times a zero mask would be NaN; ScaledSReLU does the same)
    const at::Tensor positive = h > 0;
    const at::Tensor zero = at::zeros_like(gf);
    grad_hidden = at::where(positive, gf * s * 2.0 * h, zero);
    if (want_scales) {
      grad_scales = at::where(positive, gf * h * h, zero).sum(1);
    }
  }
  if (grad_scales.defined()) {
    grad_scales = grad_scales.to(scales.scalar_type());
  }
  return {grad_hidden.to(grad_output.scalar_type()), grad_scales};
}

}  // namespace

GroupedMLP::GroupedMLP(std::vector<BasicOpPtr> ops) : FusedOp("GroupedMLP", std::move(ops)) {}

GroupForwardResult GroupedMLP::forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                                       const std::vector<std::vector<at::Tensor>>& extra_inputs) const {
  const MlpOps ops = typed_ops(basic_ops());
  const BasicOp& act = *basic_ops()[1];
  // Checks in the order the unfused ops make them, with their error types.
  check_grouped_input(ops.fc1, input);
  const int64_t rows = input.size(0);
  // Both linears' slot 0 read the same channel: validate and copy to the host once.
  const std::vector<int64_t> splits =
      check_split_sizes(ops.fc1.type(), extra_inputs[0].at(0), ops.fc1.options().groups(), rows);
  at::Tensor scales1;
  if (ops.fc1.options().scale_bias()) {
    scales1 = extra_inputs[0].at(1);
    detail::check_row_vector(ops.fc1.type(), 1, "scales", scales1, rows);
  }
  const at::Tensor& act_scales = extra_inputs[1].at(0);
  detail::check_row_vector(act.type(), 0, "scales", act_scales, rows);
  at::Tensor scales2;
  if (ops.fc2.options().scale_bias()) {
    scales2 = extra_inputs[2].at(1);
    detail::check_row_vector(ops.fc2.type(), 1, "scales", scales2, rows);
  }

  // x [rows, in] -> hidden [rows, h1] -> activated [rows, h2] -> y [rows, out]
  const at::Tensor hidden = grouped_forward(ops.fc1, input, splits, scales1);
  const at::Tensor activated = scaled_activation_forward(ops, hidden, act_scales);
  at::Tensor output = grouped_forward(ops.fc2, activated, splits, scales2);

  // A joint fusion only has to agree with itself; the basic layouts keep it readable.
  ops.fc1.save_context(*ctxs[0], input, splits, scales1);
  if (ops.swiglu != nullptr) {
    ScaledSwiGLU::save_context(*ctxs[1], hidden, act_scales);
  } else {
    ScaledSReLU::save_context(*ctxs[1], hidden, act_scales);
  }
  ops.fc2.save_context(*ctxs[2], activated, splits, scales2);
  return {std::move(output), detail::empty_extras(basic_ops())};
}

GroupBackwardResult GroupedMLP::backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                                         const std::vector<std::vector<at::Tensor>>& /*grad_extra_outputs*/) const {
  const MlpOps ops = typed_ops(basic_ops());
  const std::vector<int64_t>& splits = ctxs[0]->saved_sizes;
  GRADFUZZ_INTERNAL_ASSERT(static_cast<int64_t>(splits.size()) == ops.fc1.options().groups(),
                           "GroupedMLP context lacks the split sizes");
  const at::Tensor& input = ctxs[0]->saved.at(0);
  const at::Tensor scales1 = ops.fc1.options().scale_bias() ? ctxs[0]->saved.at(1) : at::Tensor();
  const at::Tensor& hidden = ctxs[1]->saved.at(0);
  const at::Tensor& act_scales = ctxs[1]->saved.at(1);
  const at::Tensor& activated = ctxs[2]->saved.at(0);
  const at::Tensor scales2 = ops.fc2.options().scale_bias() ? ctxs[2]->saved.at(1) : at::Tensor();

  // g [rows, out] -> d activated [rows, h2] -> d hidden [rows, h1] -> d x [rows, in];
  // each scales slot gets its own gradient (never merged with another slot's).
  GroupedGrads fc2 = grouped_backward(ops.fc2, grad_output, activated, splits, scales2, ctxs[2]->wants_grad(1));
  auto [grad_hidden, grad_act_scales] =
      scaled_activation_backward(ops, fc2.grad_input, hidden, act_scales, ctxs[1]->wants_grad(0));
  GroupedGrads fc1 = grouped_backward(ops.fc1, grad_hidden, input, splits, scales1, ctxs[0]->wants_grad(1));

  GroupBackwardResult result;
  result.grad_input = std::move(fc1.grad_input);
  result.grad_params = {std::move(fc1.grad_params), {}, std::move(fc2.grad_params)};
  result.grad_extra_inputs.push_back(grouped_extra_grads(ops.fc1, fc1.grad_scales));
  result.grad_extra_inputs.push_back(ExtraOutputs::make(basic_ops()[1]->output_style(), {grad_act_scales}));
  result.grad_extra_inputs.push_back(grouped_extra_grads(ops.fc2, fc2.grad_scales));
  return result;
}

namespace {

/// Whether fc1 -> act -> fc2 shapes chain, so the fused and unfused paths fail alike only
/// through runtime inputs (a static misfit declines and the unfused ops raise their errors).
bool shapes_chain(const GroupedLinear& fc1, const BasicOp& act, const GroupedLinear& fc2) {
  const int64_t h1 = fc1.options().out();
  if (const auto* swiglu = dynamic_cast<const ScaledSwiGLU*>(&act)) {
    const int64_t k = swiglu->interleave();
    const bool glu_ok = h1 >= 2 && h1 % 2 == 0 && (k == 0 || h1 % (2 * k) == 0);
    return glu_ok && fc2.options().in() == h1 / 2;
  }
  return fc2.options().in() == h1;
}

bool same_param_kinds(const GroupedLinear& fc1, const GroupedLinear& fc2) {
  const at::Tensor& w = fc1.weight();
  return detail::same_kind(fc2.weight(), w) && (!fc1.bias().defined() || detail::same_kind(fc1.bias(), w)) &&
         (!fc2.bias().defined() || detail::same_kind(fc2.bias(), w));
}

}  // namespace

FusionFn grouped_mlp_fusion() {
  return [](const std::vector<FusedOpPtr>& groups, const FusionContext& context) {
    return apply_pattern(
        groups, context,
        [](const std::vector<FusedOpPtr>& gs, size_t i, const FusionContext& ctx) -> std::pair<FusedOpPtr, size_t> {
          if (!detail::basic_run(gs, i, 3)) {
            return {nullptr, 0};
          }
          const GroupedLinear* fc1 = detail::basic_as<GroupedLinear>(gs[i]);
          const GroupedLinear* fc2 = detail::basic_as<GroupedLinear>(gs[i + 2]);
          const BasicOp* act = gs[i + 1]->basic_ops()[0].get();
          const bool scaled_act =
              dynamic_cast<const ScaledSwiGLU*>(act) != nullptr || dynamic_cast<const ScaledSReLU*>(act) != nullptr;
          if (fc1 == nullptr || fc2 == nullptr || !scaled_act) {
            return {nullptr, 0};
          }
          // Precondition: both linears read their split sizes from one channel.
          const std::optional<std::string> split1 = fc1->extra_input_channel(0);
          const std::optional<std::string> split2 = fc2->extra_input_channel(0);
          if (!split1 || !split2 || *split1 != *split2) {
            return {nullptr, 0};
          }
          if (fc1->options().groups() != fc2->options().groups() || !shapes_chain(*fc1, *act, *fc2) ||
              !same_param_kinds(*fc1, *fc2) || !detail::all_need_backward(gs, i, 3, ctx)) {
            return {nullptr, 0};
          }
          return {std::make_shared<GroupedMLP>(detail::collect_ops(gs, i, 3)), 3};
        });
  };
}

}  // namespace gradfuzz::ops
