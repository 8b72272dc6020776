#include "ops/basic/channel_ops.h"

#include <ATen/ATen.h>

#include <sstream>
#include <string>

#include "ops/basic/linear.h"
#include "ops/errors.h"

namespace gradfuzz::ops {

namespace {

/// Whether an in-place write into `t` is safe for its layout (no expanded or overlapping
/// memory, as the zeros that autograd materialises may be).
bool writable_in_place(const at::Tensor& t) { return t.is_non_overlapping_and_dense(); }

std::string shape_text(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

}  // namespace

// ---------------------------------------------------------------------------------------
// MakeExtraOutput

ForwardResult MakeExtraOutput::forward_impl(OpContext& ctx, const at::Tensor& input,
                                            const std::vector<at::Tensor>& /*extra_inputs*/) const {
  ctx.saved.clear();
  ctx.saved_sizes.clear();
  return {input, pack({input})};
}

BackwardResult MakeExtraOutput::backward_impl(OpContext& /*ctx*/, const at::Tensor& grad_output,
                                              const std::vector<at::Tensor>& grad_extra_outputs) const {
  // grad_output [rows, n] + grad_extra [rows, n] -> grad_input [rows, n]
  const at::Tensor& grad_extra = grad_extra_outputs.at(0);
  if (!grad_extra.defined()) {
    return {grad_output, {}, pack({})};
  }
  if (in_place_ == InPlace::kYes && grad_extra.scalar_type() == grad_output.scalar_type() &&
      grad_extra.sizes() == grad_output.sizes() && writable_in_place(grad_extra)) {
    // The fuser hands this op a gradient it owns, so accumulating into it is safe.
    grad_extra.add_(grad_output);
    return {grad_extra, {}, pack({})};
  }
  return {grad_output + grad_extra.to(grad_output.scalar_type()), {}, pack({})};
}

ReferenceResult MakeExtraOutput::reference_impl(const at::Tensor& input,
                                                const std::vector<at::Tensor>& /*extra_inputs*/,
                                                const std::vector<at::Tensor>& /*params*/) const {
  return {input.view_as(input), {input.view_as(input)}};
}

// ---------------------------------------------------------------------------------------
// AddExtraInput

namespace {
void check_same_shape(const std::string& op, const at::Tensor& input, const at::Tensor& extra) {
  if (!extra.defined() || extra.sizes() != input.sizes()) {
    throw InvalidArgumentError(op + " slot 0: extra input must have the input's shape " + shape_text(input) + ", got " +
                               (extra.defined() ? shape_text(extra) : std::string("<undefined>")));
  }
}
}  // namespace

ForwardResult AddExtraInput::forward_impl(OpContext& ctx, const at::Tensor& input,
                                          const std::vector<at::Tensor>& extra_inputs) const {
  const at::Tensor& extra = extra_inputs.at(0);
  check_same_shape(type(), input, extra);
  ctx.saved.clear();
  ctx.saved_sizes.clear();
  if (in_place_ == InPlace::kYes && extra.scalar_type() == input.scalar_type() && writable_in_place(extra)) {
    // writes_extra_input_in_place(0) makes the fuser hand over a private copy of e.
    extra.add_(input);
    return {extra, pack({})};
  }
  return {input + extra.to(input.scalar_type()), pack({})};
}

BackwardResult AddExtraInput::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                            const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  // grad_output [rows, n] -> grad_input [rows, n] and grad_extra [rows, n] (same tensor)
  at::Tensor grad_extra;
  if (ctx.wants_grad(0)) {
    grad_extra = grad_output;
  }
  return {grad_output, {}, pack({grad_extra})};
}

ReferenceResult AddExtraInput::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs,
                                              const std::vector<at::Tensor>& /*params*/) const {
  const at::Tensor& extra = extra_inputs.at(0);
  check_same_shape(type(), input, extra);
  return {at::add(input, extra), {}};
}

// ---------------------------------------------------------------------------------------
// RowStat

ForwardResult RowStat::forward_impl(OpContext& ctx, const at::Tensor& input,
                                    const std::vector<at::Tensor>& /*extra_inputs*/) const {
  ctx.saved = {input};
  ctx.saved_sizes.clear();
  const at::Tensor xf = input.to(detail::opmath_type(input));
  at::Tensor stat = (xf * xf).mean(-1).to(input.scalar_type());
  return {input, pack({stat})};
}

BackwardResult RowStat::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                      const std::vector<at::Tensor>& grad_extra_outputs) const {
  // grad_output [rows, n] + grad_stat [rows, 1] · 2·x [rows, n] / n -> grad_input [rows, n]
  const at::Tensor& grad_stat = grad_extra_outputs.at(0);
  if (!grad_stat.defined()) {
    return {grad_output, {}, pack({})};
  }
  const at::Tensor& input = ctx.saved.at(0);
  const at::ScalarType math = detail::opmath_type(input);
  const double two_over_n = 2.0 / static_cast<double>(input.size(-1));
  at::Tensor grad_input = grad_output.to(math) + grad_stat.to(math).unsqueeze(-1) * (two_over_n * input.to(math));
  return {grad_input.to(grad_output.scalar_type()), {}, pack({})};
}

ReferenceResult RowStat::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                        const std::vector<at::Tensor>& /*params*/) const {
  return {input.view_as(input), {at::mean(at::square(input), {-1})}};
}

// ---------------------------------------------------------------------------------------
// DualExtraOutput

ForwardResult DualExtraOutput::forward_impl(OpContext& ctx, const at::Tensor& input,
                                            const std::vector<at::Tensor>& /*extra_inputs*/) const {
  ctx.saved.clear();
  ctx.saved_sizes.clear();
  return {input, pack({input * s0_, input * s1_})};
}

BackwardResult DualExtraOutput::backward_impl(OpContext& /*ctx*/, const at::Tensor& grad_output,
                                              const std::vector<at::Tensor>& grad_extra_outputs) const {
  // grad_output + s0·grad_0 + s1·grad_1, all [rows, n] -> grad_input [rows, n]
  at::Tensor grad_input = grad_output;
  const at::Tensor& grad0 = grad_extra_outputs.at(0);
  const at::Tensor& grad1 = grad_extra_outputs.at(1);
  if (grad0.defined()) {
    grad_input = grad_input + grad0.to(grad_output.scalar_type()) * s0_;
  }
  if (grad1.defined()) {
    grad_input = grad_input + grad1.to(grad_output.scalar_type()) * s1_;
  }
  return {grad_input, {}, pack({})};
}

ReferenceResult DualExtraOutput::reference_impl(const at::Tensor& input,
                                                const std::vector<at::Tensor>& /*extra_inputs*/,
                                                const std::vector<at::Tensor>& /*params*/) const {
  return {input.view_as(input),
          {at::mul(input, at::scalar_tensor(s0_, input.options())),
           at::mul(input, at::scalar_tensor(s1_, input.options()))}};
}

}  // namespace gradfuzz::ops
