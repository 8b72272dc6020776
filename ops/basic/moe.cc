#include "ops/basic/moe.h"

#include <ATen/ATen.h>

#include <sstream>
#include <string>

#include "ops/basic/linear.h"
#include "ops/errors.h"
#include "ops/reference.h"

namespace gradfuzz::ops {

namespace {

std::string shape_text(const at::Tensor& t) {
  if (!t.defined()) {
    return "<undefined>";
  }
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

void check_rows_input(const std::string& op, const at::Tensor& input) {
  if (!input.defined() || input.dim() != 2) {
    throw InvalidArgumentError(op + ": input must be 2-D [rows, features], got " + shape_text(input));
  }
}

void check_logits(const std::string& op, const at::Tensor& logits, int64_t rows, int64_t groups) {
  if (!logits.defined() || logits.dim() != 2 || logits.size(0) != rows || logits.size(1) != groups) {
    throw InvalidArgumentError(op + " slot 0: router logits must have shape [rows=" + std::to_string(rows) +
                               ", G=" + std::to_string(groups) + "], got " + shape_text(logits));
  }
  if (!at::isFloatingType(logits.scalar_type())) {
    throw InvalidArgumentError(op + " slot 0: router logits must be floating point, got " +
                               std::string(c10::toString(logits.scalar_type())));
  }
}

/// Validates a routing map: an integer permutation of 0..rows-1 (validation shared by both paths).
void check_routing_map(const std::string& op, const at::Tensor& map, int64_t rows) {
  if (!map.defined() || map.dim() != 1 || map.size(0) != rows) {
    throw InvalidArgumentError(op + " slot 0: routing map must have shape [rows=" + std::to_string(rows) + "], got " +
                               shape_text(map));
  }
  if (!at::isIntegralType(map.scalar_type(), /*includeBool=*/false)) {
    throw InvalidArgumentError(op + " slot 0: routing map must have an integer dtype (int64), got " +
                               std::string(c10::toString(map.scalar_type())));
  }
  const at::Tensor sorted = std::get<0>(at::sort(map.to(at::kLong)));
  if (!at::equal(sorted, at::arange(rows, sorted.options()))) {
    throw InvalidArgumentError(op + " slot 0: routing map must be a permutation of 0.." + std::to_string(rows - 1));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Dispatch

Dispatch::Dispatch(int64_t groups) : BasicOp("Dispatch"), groups_(groups) {
  if (groups_ < 1) {
    throw InvalidArgumentError("Dispatch: groups must be >= 1, got " + std::to_string(groups_));
  }
}

ForwardResult Dispatch::forward_impl(OpContext& ctx, const at::Tensor& input,
                                     const std::vector<at::Tensor>& extra_inputs) const {
  check_rows_input(type(), input);
  const int64_t rows = input.size(0);
  const at::Tensor& logits = extra_inputs.at(0);
  check_logits(type(), logits, rows, groups_);

  // Softmax by hand (max-shifted), in float32 for reduced-precision logits.
  const at::Tensor lf = logits.to(detail::opmath_type(logits));
  const at::Tensor shifted_exp = at::exp(lf - std::get<0>(lf.max(1, /*keepdim=*/true)));
  at::Tensor probs_full = shifted_exp / shifted_exp.sum(1, /*keepdim=*/true);
  at::Tensor group = logits.argmax(1);
  at::Tensor map = std::get<1>(at::sort(group, /*stable=*/true, /*dim=*/0, /*descending=*/false));
  at::Tensor split_sizes = at::bincount(group, {}, groups_).to(at::kLong);
  at::Tensor token_probs =
      probs_full.gather(1, group.unsqueeze(1)).squeeze(1).index_select(0, map).to(logits.scalar_type());

  ctx.saved = {map, probs_full, group};
  ctx.saved_sizes = {static_cast<int64_t>(logits.scalar_type())};
  return {input.index_select(0, map), pack({split_sizes, token_probs, map})};
}

BackwardResult Dispatch::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                       const std::vector<at::Tensor>& grad_extra_outputs) const {
  const at::Tensor& map = ctx.saved.at(0);
  // grad_output [rows, n] scattered back: grad_input[map[i]] = grad_output[i]
  at::Tensor grad_input = at::empty_like(grad_output).index_copy_(0, map, grad_output);
  at::Tensor grad_logits;
  const at::Tensor& grad_probs = grad_extra_outputs.at(1);
  if (ctx.wants_grad(0) && grad_probs.defined()) {
    const at::Tensor& probs_full = ctx.saved.at(1);
    const at::Tensor& group = ctx.saved.at(2);
    const auto logits_type = static_cast<at::ScalarType>(ctx.saved_sizes.at(0));
    const int64_t rows = probs_full.size(0);
    // grad_probs [rows] (new order) -> original order; then d p_k / d l_j = p_k·(δ_jk - p_j)
    const at::Tensor gp = at::zeros({rows}, probs_full.options())
                              .index_copy_(0, map, grad_probs.to(probs_full.scalar_type()))
                              .unsqueeze(1);
    const at::Tensor p_k = probs_full.gather(1, group.unsqueeze(1));
    const at::Tensor one_hot = at::zeros_like(probs_full).scatter_(1, group.unsqueeze(1), 1.0);
    grad_logits = (gp * p_k * (one_hot - probs_full)).to(logits_type);
  }
  return {grad_input, {}, pack({grad_logits})};
}

ReferenceResult Dispatch::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs,
                                         const std::vector<at::Tensor>& /*params*/) const {
  check_rows_input(type(), input);
  const int64_t rows = input.size(0);
  const at::Tensor& logits = extra_inputs.at(0);
  check_logits(type(), logits, rows, groups_);
  at::Tensor group = at::argmax(logits.detach(), 1);
  if (KinkProbe* probe = kink_probe(); probe && groups_ > 1) {
    // The kink of argmax: a row whose two largest logits are close may pick the other one.
    const auto top = at::topk(logits.detach(), 2, 1);
    const at::Tensor flip = probe->record(std::get<0>(top).select(1, 0) - std::get<0>(top).select(1, 1));
    if (flip.defined()) group = at::where(flip, std::get<1>(top).select(1, 1), group);
  }
  const at::Tensor row_ids = at::arange(rows, group.options());
  // Unique keys (group, original row) make any sort stable.
  const at::Tensor map = at::argsort(group * rows + row_ids);
  const at::Tensor split_sizes =
      at::eq(group.unsqueeze(1), at::arange(groups_, group.options()).unsqueeze(0)).sum(0).to(at::kLong);
  const at::Tensor probs = at::softmax(logits, 1).gather(1, group.unsqueeze(1)).squeeze(1).index_select(0, map);
  return {input.index_select(0, map), {split_sizes, probs, map}};
}

// ---------------------------------------------------------------------------------------
// Combine

ForwardResult Combine::forward_impl(OpContext& ctx, const at::Tensor& input,
                                    const std::vector<at::Tensor>& extra_inputs) const {
  check_rows_input(type(), input);
  check_routing_map(type(), extra_inputs.at(0), input.size(0));
  const at::Tensor map = extra_inputs.at(0).to(at::kLong);
  ctx.saved = {map};
  ctx.saved_sizes.clear();
  // output[map[i]] = input[i]
  return {at::empty_like(input).index_copy_(0, map, input), pack({})};
}

BackwardResult Combine::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                      const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  // grad_output [rows, n] gathered: grad_input[i] = grad_output[map[i]]; the map gets none
  return {grad_output.index_select(0, ctx.saved.at(0)), {}, pack({at::Tensor()})};
}

ReferenceResult Combine::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs,
                                        const std::vector<at::Tensor>& /*params*/) const {
  check_rows_input(type(), input);
  check_routing_map(type(), extra_inputs.at(0), input.size(0));
  // y[j] = x[inverse[j]] where map[inverse[j]] = j
  const at::Tensor inverse = at::argsort(extra_inputs.at(0).to(at::kLong));
  return {input.index_select(0, inverse), {}};
}

}  // namespace gradfuzz::ops
