#include "ops/basic/activations.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>

#include "ops/basic/linear.h"
#include "ops/errors.h"
#include "ops/quantization.h"
#include "ops/reference.h"

namespace gradfuzz::ops {

const char* activation_name(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kReLU:
      return "ReLU";
    case ActivationKind::kGELU:
      return "GELU";
    case ActivationKind::kSReLU:
      return "SReLU";
  }
  return "?";
}

namespace activation_math {

namespace {
constexpr double kGeluCoeff = 0.044715;
const double kSqrt2OverPi = std::sqrt(2.0 / M_PI);

at::Tensor to_opmath(const at::Tensor& t) { return t.to(detail::opmath_type(t)); }

std::vector<int64_t> lead_sizes(const at::Tensor& x) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.pop_back();
  return sizes;
}
}  // namespace

at::Tensor forward(ActivationKind kind, const at::Tensor& x) {
  const at::Tensor xf = to_opmath(x);
  at::Tensor y;
  switch (kind) {
    case ActivationKind::kReLU:
      y = at::clamp_min(xf, 0);
      break;
    case ActivationKind::kGELU: {
      const at::Tensor t = at::tanh(kSqrt2OverPi * (xf + kGeluCoeff * xf * xf * xf));
      y = 0.5 * xf * (1.0 + t);
      break;
    }
    case ActivationKind::kSReLU: {
      const at::Tensor r = at::clamp_min(xf, 0);
      y = r * r;
      break;
    }
  }
  return y.to(x.scalar_type());
}

at::Tensor backward(ActivationKind kind, const at::Tensor& x, const at::Tensor& grad_output) {
  const at::Tensor xf = to_opmath(x);
  const at::Tensor gf = grad_output.to(xf.scalar_type());
  at::Tensor grad;
  switch (kind) {
    case ActivationKind::kReLU:
      // Selected, not multiplied by the 0/1 mask: a gradient that overflowed upstream
      // (inf in float16) stays out of the masked elements instead of becoming inf * 0 = NaN,
      // as PyTorch's threshold_backward does.
      grad = at::where(xf > 0, gf, at::zeros_like(gf));
      break;
    case ActivationKind::kGELU: {
      // d/dx 0.5·x·(1+t) = 0.5·(1+t) + 0.5·x·(1-t²)·√(2/π)·(1 + 3·0.044715·x²)
      const at::Tensor x2 = xf * xf;
      const at::Tensor t = at::tanh(kSqrt2OverPi * (xf + kGeluCoeff * x2 * xf));
      const at::Tensor dt = kSqrt2OverPi * (1.0 + 3.0 * kGeluCoeff * x2);
      grad = gf * (0.5 * (1.0 + t) + 0.5 * xf * (1.0 - t * t) * dt);
      break;
    }
    case ActivationKind::kSReLU:
      grad = at::where(xf > 0, gf * 2.0 * xf, at::zeros_like(gf));  // selected: see kReLU
      break;
  }
  return grad.to(grad_output.scalar_type());
}

void check_glu_features(const std::string& op, int64_t features, int64_t interleave) {
  if (features % 2 != 0 || features < 2) {
    throw InvalidArgumentError(op + ": input features must be even and >= 2 (halves a, b), got " +
                               std::to_string(features));
  }
  if (interleave > 0 && features % (2 * interleave) != 0) {
    throw InvalidArgumentError(op + ": interleave=" + std::to_string(interleave) +
                               " needs input features divisible by " + std::to_string(2 * interleave) + ", got " +
                               std::to_string(features));
  }
}

std::pair<at::Tensor, at::Tensor> glu_split(const at::Tensor& x, int64_t interleave) {
  const int64_t features = x.size(-1);
  const int64_t n = features / 2;
  if (interleave <= 0) {
    return {x.narrow(-1, 0, n), x.narrow(-1, n, n)};
  }
  std::vector<int64_t> blocked = lead_sizes(x);
  blocked.insert(blocked.end(), {features / (2 * interleave), 2, interleave});
  std::vector<int64_t> flat = lead_sizes(x);
  flat.push_back(n);
  const at::Tensor xv = x.reshape(blocked);
  return {xv.select(-2, 0).reshape(flat), xv.select(-2, 1).reshape(flat)};
}

at::Tensor glu_merge(const at::Tensor& grad_a, const at::Tensor& grad_b, int64_t interleave) {
  if (interleave <= 0) {
    return at::cat({grad_a, grad_b}, -1);
  }
  const int64_t n = grad_a.size(-1);
  std::vector<int64_t> blocked = lead_sizes(grad_a);
  blocked.insert(blocked.end(), {n / interleave, interleave});
  std::vector<int64_t> flat = lead_sizes(grad_a);
  flat.push_back(2 * n);
  // [.., blocks, k] x2 -> [.., blocks, 2, k] -> [.., 2n]
  return at::stack({grad_a.reshape(blocked), grad_b.reshape(blocked)}, -2).reshape(flat);
}

namespace {
at::Tensor swiglu_opmath(const at::Tensor& x, int64_t interleave) {
  auto [a, b] = glu_split(to_opmath(x), interleave);
  return a * at::sigmoid(a) * b;
}
}  // namespace

at::Tensor swiglu_forward(const at::Tensor& x, int64_t interleave) {
  return swiglu_opmath(x, interleave).to(x.scalar_type());
}

at::Tensor swiglu_backward(const at::Tensor& x, const at::Tensor& grad_output, int64_t interleave) {
  auto [a, b] = glu_split(to_opmath(x), interleave);
  const at::Tensor gf = grad_output.to(a.scalar_type());
  const at::Tensor s = at::sigmoid(a);
  const at::Tensor silu = a * s;
  // silu'(a) = σ(a)·(1 + a·(1 - σ(a)))
  const at::Tensor grad_a = gf * b * (s * (1.0 + a * (1.0 - s)));
  const at::Tensor grad_b = gf * silu;
  return glu_merge(grad_a, grad_b, interleave).to(grad_output.scalar_type());
}

at::Tensor cached_input(const at::Tensor& x) {
  // The model's own FP8 rounding, written apart from the reference's (ops/quantization.cc
  // casts with LibTorch's float8 dtype): the E4M3 grid by hand, 3 mantissa bits, exponents
  // from -6 (subnormals share 2^-6's spacing 2^-9) to 8 (448 = 14·2^5).
  constexpr float kE4M3Max = 448.0F;
  const at::Tensor xf = x.to(at::kFloat);
  at::Tensor magnitude = xf.abs();
  magnitude = at::where(at::isnan(magnitude), at::zeros_like(magnitude), magnitude);  // TE's fmaxf skips NaN
  const float amax = x.numel() == 0 ? 0.0F : magnitude.max().item<float>();
  float scale = 1.0F;
  if (amax > 0.0F && std::isfinite(amax)) {
    scale = kE4M3Max / amax;
    if (std::isinf(scale)) {
      // TE's value_for_inf: the input type's largest finite value
      scale = x.scalar_type() == at::kBFloat16 ? static_cast<float>(std::numeric_limits<c10::BFloat16>::max())
              : x.scalar_type() == at::kHalf   ? static_cast<float>(std::numeric_limits<c10::Half>::max())
                                               : std::numeric_limits<float>::max();
    }
  }
  const float scale_inv = 1.0F / scale;
  const at::Tensor scaled = at::clamp(xf * scale, -kE4M3Max, kE4M3Max);
  // scaled = m·2^e with |m| in [0.5, 1): its binade starts at 2^(e-1), spacing 2^(e-1-3).
  const at::Tensor binade = at::clamp_min(std::get<1>(at::frexp(scaled)) - 1, -6).to(at::kFloat);
  const at::Tensor spacing = at::exp2(binade - 3.0);
  const at::Tensor q = at::round(scaled / spacing) * spacing;  // round half to even; exact steps
  if (x.scalar_type() == at::kDouble) return q.to(at::kDouble) * static_cast<double>(scale_inv);
  return (q * scale_inv).to(x.scalar_type());
}

}  // namespace activation_math

namespace {

/// Reference split of the GLU halves, written independently of glu_split: explicit index
/// lists for interleaved blocks.
std::pair<at::Tensor, at::Tensor> reference_glu_halves(const at::Tensor& x, int64_t interleave) {
  const int64_t features = x.size(-1);
  const int64_t n = features / 2;
  if (interleave <= 0) {
    auto halves = at::chunk(x, 2, -1);
    return {halves[0], halves[1]};
  }
  const at::Tensor j = at::arange(n, at::TensorOptions().dtype(at::kLong).device(x.device()));
  // element j of a lives at block (j / k), offset (j % k): column (j / k)·2k + j % k
  const at::Tensor a_index = at::floor_divide(j, interleave) * (2 * interleave) + at::remainder(j, interleave);
  return {at::index_select(x, -1, a_index), at::index_select(x, -1, a_index + interleave)};
}

/// Throws InvalidArgumentError unless the GLU interleave k >= 0 (0 = halves).
void check_interleave(const std::string& op, int64_t interleave) {
  if (interleave < 0) {
    throw InvalidArgumentError(op + ": interleave must be >= 0, got " + std::to_string(interleave));
  }
}

void check_2d(const std::string& op, const at::Tensor& x) {
  if (!x.defined() || x.dim() != 2) {
    throw InvalidArgumentError(op + ": input must be 2-D [rows, features], got " +
                               (x.defined() ? std::to_string(x.dim()) + "-D" : std::string("<undefined>")));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Activation (ReLU, GELU, SReLU)

Activation::Activation(ActivationKind kind, InputCache cache)
    : BasicOp(activation_name(kind)), kind_(kind), cache_(cache) {}

void Activation::save_context(OpContext& ctx, const at::Tensor& input) const {
  ctx.saved = {cache_ == InputCache::kQuantized ? activation_math::cached_input(input) : input};
  ctx.saved_sizes.clear();
}

bool Activation::casts_grad_input_for_previous_op(const QuantRecipe& /*recipe*/) const { return true; }

ForwardResult Activation::forward_impl(OpContext& ctx, const at::Tensor& input,
                                       const std::vector<at::Tensor>& /*extra_inputs*/) const {
  save_context(ctx, input);
  return {activation_math::forward(kind_, input), pack({})};
}

BackwardResult Activation::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                         const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  // grad_output [rows, n] ⊙ act'(input [rows, n]) -> grad_input [rows, n]
  return {activation_math::backward(kind_, ctx.saved.at(0), grad_output), {}, pack({})};
}

ReferenceResult Activation::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                           const std::vector<at::Tensor>& /*params*/) const {
  // The kink at 0: where the probe flips an element, ReLU takes the other branch (the
  // identity for x <= 0, zero for x > 0), whose value differs from relu(x) by |x| and slope
  // by 1. Recorded once per op, whether or not the input is cached quantized.
  const at::Tensor flip = kind_ == ActivationKind::kReLU && kink_probe() ? kink_probe()->record(input) : at::Tensor();
  auto act = [&](const at::Tensor& x) -> at::Tensor {
    switch (kind_) {
      case ActivationKind::kReLU: {
        if (!flip.defined()) return at::relu(x);
        return at::where(at::logical_xor(x > 0, flip), x, at::zeros_like(x));
      }
      case ActivationKind::kGELU:
        return at::gelu(x, "tanh");
      case ActivationKind::kSReLU:
        return at::pow(at::relu(x), 2);
    }
    GRADFUZZ_INTERNAL_ASSERT(false, "unknown activation kind");
  };
  if (cache_ == InputCache::kHighPrecision) return {act(input), {}};
  // cache_quantized_input: value act(x), gradient act'(dq(Q(x))) (E4M3 current scaling)
  return {value_with_gradient_of(act(input), act(reference_cached_input(input))), {}};
}

// ---------------------------------------------------------------------------------------
// SwiGLU

SwiGLU::SwiGLU(int64_t interleave, InputCache cache) : BasicOp("SwiGLU"), interleave_(interleave), cache_(cache) {
  check_interleave(type(), interleave_);
}

bool SwiGLU::casts_grad_input_for_previous_op(const QuantRecipe& /*recipe*/) const { return interleave_ == 0; }

ForwardResult SwiGLU::forward_impl(OpContext& ctx, const at::Tensor& input,
                                   const std::vector<at::Tensor>& /*extra_inputs*/) const {
  activation_math::check_glu_features(type(), input.size(-1), interleave_);
  ctx.saved = {cache_ == InputCache::kQuantized ? activation_math::cached_input(input) : input};
  ctx.saved_sizes.clear();
  return {activation_math::swiglu_forward(input, interleave_), pack({})};
}

BackwardResult SwiGLU::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                     const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  // grad_output [rows, n] -> grad_input [rows, 2n] = [g·b·silu'(a), g·silu(a)] (blocks interleaved back)
  return {activation_math::swiglu_backward(ctx.saved.at(0), grad_output, interleave_), {}, pack({})};
}

ReferenceResult SwiGLU::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                       const std::vector<at::Tensor>& /*params*/) const {
  activation_math::check_glu_features(type(), input.size(-1), interleave_);
  auto swiglu = [&](const at::Tensor& x) {
    auto [a, b] = reference_glu_halves(x, interleave_);
    return at::silu(a) * b;
  };
  if (cache_ == InputCache::kHighPrecision) return {swiglu(input), {}};
  // cache_quantized_input: both halves of the gradient from dq(Q(x)) (the whole input quantized)
  return {value_with_gradient_of(swiglu(input), swiglu(reference_cached_input(input))), {}};
}

// ---------------------------------------------------------------------------------------
// ScaledSwiGLU

ScaledSwiGLU::ScaledSwiGLU(int64_t interleave) : BasicOp("ScaledSwiGLU"), interleave_(interleave) {
  check_interleave(type(), interleave_);
}

void ScaledSwiGLU::save_context(OpContext& ctx, const at::Tensor& input, const at::Tensor& scales) {
  ctx.saved = {input, scales};
  ctx.saved_sizes.clear();
}

ForwardResult ScaledSwiGLU::forward_impl(OpContext& ctx, const at::Tensor& input,
                                         const std::vector<at::Tensor>& extra_inputs) const {
  check_2d(type(), input);
  activation_math::check_glu_features(type(), input.size(1), interleave_);
  const at::Tensor& scales = extra_inputs.at(0);
  detail::check_row_vector(type(), 0, "scales", scales, input.size(0));
  save_context(ctx, input, scales);
  auto [a, b] = activation_math::glu_split(input.to(detail::opmath_type(input)), interleave_);
  const at::Tensor s = scales.to(a.scalar_type()).unsqueeze(1);
  return {(a * at::sigmoid(a) * b * s).to(input.scalar_type()), pack({})};
}

BackwardResult ScaledSwiGLU::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                           const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  const at::Tensor& input = ctx.saved.at(0);
  const at::Tensor& scales = ctx.saved.at(1);
  const at::ScalarType math = detail::opmath_type(input);
  const at::Tensor gf = grad_output.to(math);
  const at::Tensor s = scales.to(math).unsqueeze(1);
  // grad_output [rows, n] · s [rows, 1] -> grad_input [rows, 2n] through silu(a)·b
  at::Tensor grad_input = activation_math::swiglu_backward(input, gf * s, interleave_).to(grad_output.scalar_type());
  at::Tensor grad_scales;
  if (ctx.wants_grad(0)) {
    // Σ_j grad_output [rows, n] ⊙ silu(a)·b [rows, n] -> grad_scales [rows]
    auto [a, b] = activation_math::glu_split(input.to(math), interleave_);
    grad_scales = (gf * (a * at::sigmoid(a) * b)).sum(1).to(scales.scalar_type());
  }
  return {grad_input, {}, pack({grad_scales})};
}

ReferenceResult ScaledSwiGLU::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs,
                                             const std::vector<at::Tensor>& /*params*/) const {
  check_2d(type(), input);
  activation_math::check_glu_features(type(), input.size(1), interleave_);
  const at::Tensor& scales = extra_inputs.at(0);
  detail::check_row_vector(type(), 0, "scales", scales, input.size(0));
  auto [a, b] = reference_glu_halves(input, interleave_);
  return {at::silu(a) * b * scales.unsqueeze(-1), {}};
}

// ---------------------------------------------------------------------------------------
// ScaledSReLU

void ScaledSReLU::save_context(OpContext& ctx, const at::Tensor& input, const at::Tensor& scales) {
  ctx.saved = {input, scales};
  ctx.saved_sizes.clear();
}

ForwardResult ScaledSReLU::forward_impl(OpContext& ctx, const at::Tensor& input,
                                        const std::vector<at::Tensor>& extra_inputs) const {
  check_2d(type(), input);
  const at::Tensor& scales = extra_inputs.at(0);
  detail::check_row_vector(type(), 0, "scales", scales, input.size(0));
  save_context(ctx, input, scales);
  const at::Tensor xf = input.to(detail::opmath_type(input));
  const at::Tensor r = at::clamp_min(xf, 0);
  return {(r * r * scales.to(xf.scalar_type()).unsqueeze(1)).to(input.scalar_type()), pack({})};
}

BackwardResult ScaledSReLU::backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                          const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  const at::Tensor& input = ctx.saved.at(0);
  const at::Tensor& scales = ctx.saved.at(1);
  const at::ScalarType math = detail::opmath_type(input);
  const at::Tensor gf = grad_output.to(math);
  const at::Tensor xf = input.to(math);
  const at::Tensor positive = xf > 0;
  const at::Tensor zero = at::zeros_like(gf);
  // grad_output [rows, n] ⊙ 2·relu(x)·s[r] -> grad_input [rows, n]; masked elements
  // selected to zero, not multiplied (an overflowed gradient would give inf * 0 = NaN).
  at::Tensor grad_input =
      at::where(positive, gf * 2.0 * xf * scales.to(math).unsqueeze(1), zero).to(grad_output.scalar_type());
  at::Tensor grad_scales;
  if (ctx.wants_grad(0)) {
    // Σ_j grad_output ⊙ relu(x)² -> grad_scales [rows]
    grad_scales = at::where(positive, gf * xf * xf, zero).sum(1).to(scales.scalar_type());
  }
  return {grad_input, {}, pack({grad_scales})};
}

ReferenceResult ScaledSReLU::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs,
                                            const std::vector<at::Tensor>& /*params*/) const {
  check_2d(type(), input);
  const at::Tensor& scales = extra_inputs.at(0);
  detail::check_row_vector(type(), 0, "scales", scales, input.size(0));
  return {at::pow(at::relu(input), 2) * scales.unsqueeze(-1), {}};
}

}  // namespace gradfuzz::ops
